# docs: docs/es.md | paper: https://arxiv.org/abs/1703.03864
"""ES: Evolution Strategies as a scalable alternative to reinforcement learning (Salimans et al., 2017).

Each generation perturbs the policy parameters theta with mirrored Gaussian noise taken from a noise table
that every worker builds from the same seed, runs one episode per perturbation, and moves theta along the
rank-weighted sum of the noise. Workers exchange only noise indices, returns and lengths (a few hundred
bytes), never parameters or gradients: every worker applies the same update to its own copy of theta.

  python algos/es.py                                         # one worker, CartPole-v1
  python algos/es.py --num-workers 2                         # two worker processes on this machine
  torchrun --standalone --nproc_per_node=2 algos/es.py       # the same under torchrun (or across nodes)
"""
import ctypes
import hashlib
import json
import math
import os
import signal
import socket
import sys
import time
import types
import warnings
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Optional, Tuple


def process_start_time() -> float:
    """Wall-clock time at which this process started (Linux /proc), so start-up and imports are counted."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            ticks, up = int(stat.read().rsplit(")", 1)[1].split()[19]), float(uptime.read().split()[0])
        return time.time() - up + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


PROCESS_START = process_start_time()

# `import envpool` registers every env family it ships. Four of them cost ~0.6 s of start-up (jumanji's alone
# imports matplotlib) and have no environment this file can train on; their registration is skipped.
if "envpool" not in sys.modules:
    for _name in ("jumanji", "pgx", "mujoco.dmc", "mujoco.playground"):
        sys.modules[f"envpool.{_name}.registration"] = types.ModuleType(f"envpool.{_name}.registration")
import envpool  # noqa: E402
import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import tyro  # noqa: E402


@dataclass
class Args:
    # --- common to every distrl file ---
    exp_name: str = "es"  # the name of this experiment (part of the run name)
    seed: int = 1  # seed of the experiment (initial weights, noise table, noise indices, env seeds)
    torch_deterministic: bool = True  # kept for the common block: runs on CPU, whose kernels here are deterministic
    cuda: bool = False  # kept for the common block: ES evaluates small policies on CPU; this flag is ignored
    track: bool = False  # log to Weights & Biases as well as TensorBoard
    wandb_project_name: str = "distrl"  # the wandb project name
    wandb_entity: Optional[str] = None  # the wandb entity (team)
    capture_video: bool = False  # not supported (ES here runs vector-observation tasks); kept for the common block
    save_model: bool = False  # write the final theta and observation statistics to runs/<run_name>/model.pt
    env_id: str = "CartPole-v1"  # the envpool environment id (vector observations: classic control, MuJoCo)
    total_timesteps: int = 300_000  # environment steps over all workers (ends after the generation that exceeds it)
    eval_episodes: int = 10  # episodes of the final, unperturbed policy to evaluate at the end
    # --- algorithm ---
    population_size: int = 48  # perturbations per generation (antithetic: half as many noise vectors, each +/-)
    sigma: float = 0.1  # noise standard deviation sigma
    learning_rate: float = 0.05  # Adam's stepsize
    l2_coeff: float = 0.005  # weight decay: l2_coeff * theta joins the negated gradient before Adam (paper: 0.005)
    noise_table_size: int = 2 ** 24  # floats in the shared noise table (64 MiB; the paper used 250M)
    obs_norm: bool = True  # normalize observations with running statistics aggregated over all workers
    obs_clip: float = 5.0  # clip normalized observations to [-obs_clip, obs_clip]
    episode_cap: int = 0  # cap on episode length in steps (0: the environment's own limit)
    adaptive_cap: bool = False  # cap episodes at twice the previous generation's mean length (paper's adaptive mode)
    hidden_sizes: Tuple[int, ...] = (64, 64)  # hidden layer widths of the tanh MLP policy
    torch_threads: int = 1  # torch threads per worker (tiny forward pass; 1 keeps results split-independent)
    env_threads: int = 0  # envpool threads per worker (0: this process's CPUs divided among the node's workers)
    # --- distributed ---
    num_workers: int = 1  # worker processes to spawn here (without torchrun; under it, each rank is a worker)
    checkpoint_every: int = 0  # write runs/<run_name>/checkpoint.pt every this many generations (0: on signals only)
    resume: bool = False  # continue from runs/<run_name>/checkpoint.pt when it exists
    # --- computed at run time ---
    world_size: int = field(default=1, init=False)
    rank: int = field(default=0, init=False)
    local_rank: int = field(default=0, init=False)
    run_name: str = field(default="", init=False)


def fail(arg: str, message: str) -> None:
    """Bad argument: one line naming it on stderr, exit code 2 (as argparse does)."""
    print(f"{os.path.basename(sys.argv[0])}: error: --{arg.replace('_', '-')}: {message}", file=sys.stderr)
    sys.exit(2)


def validate(args: Args) -> None:
    if not 0 <= args.seed < 2**30:  # env seeds add offsets to it and must stay 32-bit
        fail("seed", f"must be in [0, 2**30), got {args.seed}")
    for name in ["total_timesteps", "population_size", "eval_episodes", "num_workers", "sigma", "learning_rate",
                 "noise_table_size", "obs_clip"]:
        if getattr(args, name) <= 0:
            fail(name, f"must be positive, got {getattr(args, name)}")
    for name in ["l2_coeff", "episode_cap", "torch_threads", "env_threads", "checkpoint_every"]:
        if getattr(args, name) < 0:
            fail(name, f"must not be negative, got {getattr(args, name)}")
    if args.population_size % 2:
        fail("population_size", f"must be even (antithetic pairs), got {args.population_size}")
    if any(h <= 0 for h in args.hidden_sizes):
        fail("hidden_sizes", f"must be positive, got {args.hidden_sizes}")
    if args.num_workers > 1 and "WORLD_SIZE" in os.environ:
        fail("num_workers", "under torchrun every rank is a worker; leave --num-workers at 1")
    if args.capture_video:  # kept in Args for the common block
        fail("capture_video", "not supported by ES here (vector-observation tasks only)")
    if args.env_id not in envpool.list_all_envs():
        fail("env_id", f"'{args.env_id}' is not an envpool environment")
    spec = envpool.make_spec(args.env_id)
    obs_space, act_space = spec.observation_space, spec.action_space
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        fail("env_id", f"'{args.env_id}' has observation space {obs_space}; ES here needs a flat Box")
    if not isinstance(act_space, (gym.spaces.Discrete, gym.spaces.Box)) or len(act_space.shape) > 1:
        fail("env_id", f"'{args.env_id}' has action space {act_space}; ES here needs Discrete or 1-D Box")
    num_params = Policy(obs_space.shape[0], act_space, args.hidden_sizes).num_params
    if args.noise_table_size < num_params:
        fail("noise_table_size", f"{args.noise_table_size} is smaller than the policy ({num_params} parameters)")


# ----------------------------------------------------------------------------------------------- environment
def make_env(env_id: str, num_envs: int, seed: int, num_threads: int = 1, **kwargs):
    """An envpool batch. Env i of the batch is seeded with seed + i."""
    return envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, num_threads=num_threads,
                        thread_affinity_offset=-1, **kwargs)


def env_seed(args: Args, generation: int, member: int) -> int:
    """Seed of the episode of population member `member` (global index) in `generation`: never tied to the worker
    that runs it, so a run's results do not depend on the number of workers."""
    return args.seed + generation * args.population_size + member


# ----------------------------------------------------------------------------------------------- networks
class Policy:
    """Deterministic tanh MLP as one flat parameter vector (a perturbation is a slice of the noise table). `forward`
    runs P parameter vectors on P observations at once (one batched matmul per layer): one call per population
    step. Discrete actions: argmax; Box actions: the output, clipped."""

    def __init__(self, obs_dim: int, action_space, hidden_sizes=(64, 64)):
        self.continuous = isinstance(action_space, gym.spaces.Box)
        n_out = int(np.prod(action_space.shape)) if self.continuous else int(action_space.n)
        sizes = [obs_dim, *hidden_sizes, n_out]
        self.shapes = [(sizes[i + 1], sizes[i]) for i in range(len(sizes) - 1)]
        self.num_params = sum(o * i + o for o, i in self.shapes)
        if self.continuous:
            self.low = torch.as_tensor(action_space.low, dtype=torch.float32)
            self.high = torch.as_tensor(action_space.high, dtype=torch.float32)

    def init_params(self, generator) -> torch.Tensor:
        """Rows of each weight matrix drawn from N(0, I) and scaled to norm 1 (0.01 for the output layer), as in
        the paper's code; zero biases."""
        chunks = []
        for k, (o, i) in enumerate(self.shapes):
            w = torch.randn(o, i, generator=generator)
            w *= (0.01 if k == len(self.shapes) - 1 else 1.0) / w.norm(dim=1, keepdim=True)
            chunks += [w.reshape(-1), torch.zeros(o)]
        return torch.cat(chunks)

    def forward(self, params: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """params [P, num_params], obs [P, obs_dim] -> outputs [P, n_out]."""
        h, offset = obs.unsqueeze(-1), 0
        for k, (o, i) in enumerate(self.shapes):
            w = params[:, offset:offset + o * i].view(-1, o, i)
            b = params[:, offset + o * i:offset + o * i + o].unsqueeze(-1)
            offset += o * i + o
            h = torch.baddbmm(b, w, h)
            if k < len(self.shapes) - 1:
                h = torch.tanh(h)
        return h.squeeze(-1)

    def act(self, params: torch.Tensor, obs: torch.Tensor) -> np.ndarray:
        out = self.forward(params, obs)
        if self.continuous:
            return torch.maximum(torch.minimum(out, self.high), self.low).numpy()
        return out.argmax(-1).numpy()


# ----------------------------------------------------------------------------------------------- algorithm
def noise_table(seed: int, size: int) -> torch.Tensor:
    """The shared noise table, `size` N(0, 1) float32 numbers seeded with `seed`: the same in every worker."""
    return torch.randn(size, generator=torch.Generator().manual_seed(seed))


def sample_noise_indices(seed: int, generation: int, num_pairs: int, table_size: int, dim: int) -> np.ndarray:
    """Offsets of the generation's noise vectors, from (seed, generation) alone: the same in every worker."""
    return np.random.default_rng([seed, generation]).integers(0, table_size - dim + 1, size=num_pairs)


def centered_ranks(x: np.ndarray) -> np.ndarray:
    """Fitness shaping: replace each value by its rank over the whole array (0 for the smallest), scaled to
    [-0.5, 0.5]. Tied values share their average rank, so a constant fitness gives all-zero weights."""
    flat = x.ravel()
    ordered = np.sort(flat)  # a value's tied group spans [left, right) in sorted order; its mean rank is the middle
    ranks = (np.searchsorted(ordered, flat, "left") + np.searchsorted(ordered, flat, "right") - 1) / 2.0
    return (ranks / (flat.size - 1) - 0.5).reshape(x.shape)


def es_gradient(noise: torch.Tensor, indices, weights: np.ndarray, dim: int) -> torch.Tensor:
    """g = 1/N sum_i w_i eps_i with eps_i = noise[indices[i]:indices[i] + dim], N = 2 * len(indices) perturbations
    and w_i = shaped(+eps_i) - shaped(-eps_i) (the antithetic pair). Accumulated one pair at a time in index
    order, so the result does not depend on how many threads or workers there are."""
    g = torch.zeros(dim, dtype=torch.float32)
    for i, w in zip(indices, weights):
        g.add_(noise[int(i):int(i) + dim], alpha=float(w))
    return g / (2 * len(indices))


def adam_init(dim: int) -> dict:
    return {"step": 0, "m": torch.zeros(dim), "v": torch.zeros(dim)}


def adam_step(theta: torch.Tensor, grad: torch.Tensor, state: dict, lr: float, betas=(0.9, 0.999), eps=1e-8):
    """Adam (Kingma & Ba, 2015) on a flat vector, in torch.optim.Adam's order of operations (bitwise equal to it).
    Written out because constructing a torch.optim optimizer imports torch._dynamo (over a second of start-up)."""
    b1, b2 = betas
    state["step"] += 1
    state["m"].lerp_(grad, 1 - b1)
    state["v"].mul_(b2).addcmul_(grad, grad, value=1 - b2)
    denom = (state["v"].sqrt() / math.sqrt(1 - b2 ** state["step"])).add_(eps)
    return theta - (lr / (1 - b1 ** state["step"])) * state["m"] / denom


def es_update(theta, adam: dict, noise, indices, returns: np.ndarray, args: Args):
    """One ES step from the population's returns [num_pairs, 2] (+eps, -eps): centered ranks over all 2n returns,
    the gradient estimate, weight decay, Adam (descending -g + l2 theta). No 1/sigma: Adam ignores the scale."""
    shaped = centered_ranks(returns)
    g = es_gradient(noise, indices, shaped[:, 0] - shaped[:, 1], theta.numel())
    return adam_step(theta, -g + args.l2_coeff * theta, adam, args.learning_rate), float(g.norm())


def obs_mean_std(obstat: torch.Tensor, dim: int):
    """Running observation statistics [sum, sum of squares, count] -> mean, std, as float32. The variance is
    floored at 1e-4 (std >= 0.01); OpenAI's ES starter floors it at 1e-2 (see docs/es.md)."""
    mean = obstat[:dim] / obstat[-1]
    var = obstat[dim:2 * dim] / obstat[-1] - mean ** 2
    return mean.float(), var.clamp(min=1e-4).sqrt().float()


# ----------------------------------------------------------------------------------------------- roles
def rollout_population(policy: Policy, params: torch.Tensor, env_id: str, seed: int, mean, std, clip: float,
                       cap: int, num_threads: int = 1):
    """One episode per row of params [P, num_params], all P at once: one envpool batch (env i seeded seed + i), one
    batched forward pass per step. Returns returns [P], lengths [P] and per-episode observation statistics [P, 2 *
    obs_dim + 1] (sum, sum of squares, count), elementwise so that each row depends only on its own episode."""
    P = params.shape[0]
    envs = make_env(env_id, P, seed, num_threads)
    obs, _ = envs.reset()
    dim = obs.shape[1]
    alive = np.ones(P, dtype=bool)
    returns, lengths = np.zeros(P), np.zeros(P, dtype=np.int64)
    stats = torch.zeros(P, 2 * dim + 1, dtype=torch.float64)
    for _ in range(cap):
        o = torch.as_tensor(obs)
        live = torch.as_tensor(alive, dtype=torch.float64).unsqueeze(-1)
        o64 = o.double() * live
        stats[:, :dim] += o64
        stats[:, dim:2 * dim] += o64 * o64
        stats[:, -1:] += live
        x = ((o.float() - mean) / std).clamp(-clip, clip)
        with torch.no_grad():
            action = policy.act(params, x)
        ids = np.flatnonzero(alive)  # step only the envs whose episode goes on (envpool steps a subset by id)
        o, r, term, trunc, info = envs.step(action[ids], ids)
        obs[info["env_id"]] = o
        returns[info["env_id"]] += r
        lengths[ids] += 1
        alive[info["env_id"]] = ~(term | trunc)
        if not alive.any():
            break
    envs.close()
    return returns, lengths, stats


# Columns of the table the workers all-gather, one row per antithetic pair: global pair index, noise-table index,
# the returns and lengths of its two episodes (theta + sigma eps, theta - sigma eps), and their observation
# statistics summed (sum, sum of squares, count per feature). Nothing else crosses between workers.
PAIR, NOISE, RETURNS, LENGTHS, OBSTAT = 0, 1, slice(2, 4), slice(4, 6), slice(6, None)


def save_checkpoint(path: str, payload: dict) -> None:
    """Atomic: write a temporary file beside the target, then rename over it."""
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save(payload, tmp)
    os.replace(tmp, path)


def available_cpus() -> int:
    """CPUs this process may use (its affinity mask, which taskset, SLURM and containers set; not the machine's
    core count), shared among the ranks on this node (torchrun's LOCAL_WORLD_SIZE)."""
    return max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))  # Linux, as /proc


def setup_distributed(args: Args) -> None:
    """torchrun (or spawn_workers) sets RANK/LOCAL_RANK/WORLD_SIZE: join the gloo group. Alone: world size 1."""
    args.world_size = int(os.environ.get("WORLD_SIZE", "1"))
    args.rank, args.local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if args.world_size > 1:
        dist.init_process_group("gloo", init_method="env://")


def worker_entry(index: int, args: Args, num_workers: int, parent: int) -> None:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the parent, whatever kills it
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)
    os.environ.update(RANK=str(index), LOCAL_RANK=str(index), WORLD_SIZE=str(num_workers),
                      LOCAL_WORLD_SIZE=str(num_workers))
    args.num_workers = 1
    sys.exit(main(args) or None)  # None: a clean exit with code 0


def spawn_workers(args: Args) -> int:
    """`--num-workers K` without torchrun: fork K workers that form a gloo group on 127.0.0.1. If one dies, the
    others are terminated and the job exits non-zero naming it. SIGTERM/SIGUSR1 are passed on to the workers."""
    with socket.socket() as s:  # a free port for the group's rendezvous (torch's TCPStore), not a protocol
        s.bind(("127.0.0.1", 0))
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
    ctx = mp.start_processes(worker_entry, args=(args, args.num_workers, os.getpid()), nprocs=args.num_workers, join=False,
                             start_method="fork")
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, lambda signum, frame: [os.kill(p.pid, signum) for p in ctx.processes if p.is_alive()])
    try:
        while not ctx.join(timeout=1.0):
            pass
    except (mp.ProcessExitedException, mp.ProcessRaisedException) as e:  # it died, or raised (then e has its traceback)
        print(f"{os.path.basename(sys.argv[0])}: error: worker {e.error_index} (pid {getattr(e, 'pid', '?')}): {e}; "
              "the other workers were stopped", file=sys.stderr)
        return 1
    return 0


def main(args: Args) -> int:
    warnings.filterwarnings("ignore", message=".*precision lowered by casting.*")  # envpool's spaces
    validate(args)
    if args.num_workers > 1:
        return spawn_workers(args)
    setup_distributed(args)
    rank, world = args.rank, args.world_size
    args.run_name = f"{args.env_id}__{args.exp_name}__{args.seed}"
    run_dir = os.path.join("runs", args.run_name)
    ckpt_path = os.path.join(run_dir, "checkpoint.pt")
    torch.set_num_threads(args.torch_threads)
    env_threads = args.env_threads or available_cpus()

    spec = envpool.make_spec(args.env_id)
    threshold, max_steps, obs_dim = spec.reward_threshold, spec.config.max_episode_steps, spec.observation_space.shape[0]
    policy = Policy(obs_dim, spec.action_space, args.hidden_sizes)
    dim, num_pairs = policy.num_params, args.population_size // 2
    noise = noise_table(args.seed + 2**32, args.noise_table_size)  # its own stream, apart from the weights' (seed)
    theta = policy.init_params(torch.Generator().manual_seed(args.seed))
    adam = adam_init(dim)
    obstat = torch.cat([torch.zeros(obs_dim), torch.full((obs_dim,), 1e-2), torch.tensor([1e-2])]).double()
    generation, global_step, wall_before, time_to_threshold, threshold_step = 0, 0, 0.0, None, None
    episodes = 0  # run in this process (a resumed run counts from its restart)
    cap, recent = args.episode_cap or max_steps, deque(maxlen=20)
    # Rank 0 reads the checkpoint and sends it to the other ranks: nodes need no shared filesystem.
    box = [torch.load(ckpt_path, weights_only=True) if args.resume and rank == 0 and os.path.exists(ckpt_path) else None]
    if world > 1:
        dist.broadcast_object_list(box, 0)
    ckpt = box[0]
    if ckpt is not None:
        theta, adam, obstat, generation = ckpt["theta"], ckpt["adam"], ckpt["obstat"], ckpt["generation"]
        global_step, wall_before, cap = ckpt["global_step"], ckpt["wall_time_s"], ckpt["cap"]
        time_to_threshold, threshold_step = ckpt["time_to_threshold_s"], ckpt["threshold_step"]
        recent.extend(ckpt["recent_returns"])

    writer = None
    if rank == 0:
        from torch.utils.tensorboard import SummaryWriter
        if args.track:
            import wandb
            wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True,
                       config=asdict(args), name=args.run_name, id=args.run_name, resume="allow")
        writer = SummaryWriter(run_dir)
        writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in asdict(args).items()))

    stop = {"signal": 0}
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, lambda signum, frame: stop.update(signal=signum))

    def checkpoint():  # everything a resumed run needs; episodes and noise follow from (seed, generation)
        save_checkpoint(ckpt_path, dict(theta=theta, adam=adam, obstat=obstat, generation=generation, cap=cap,
                        global_step=global_step, wall_time_s=wall_before + time.time() - train_start, recent_returns=list(recent),
                        time_to_threshold_s=time_to_threshold, threshold_step=threshold_step))

    # This worker's share of the antithetic pairs: a contiguous block; all blocks padded to the same length.
    per_rank, width = math.ceil(num_pairs / world), 6 + 2 * obs_dim + 1  # its table's rows and columns (PAIR .. OBSTAT)
    lo, hi = min(rank * per_rank, num_pairs), min((rank + 1) * per_rank, num_pairs)
    gathered_bytes = world * per_rank * width * 8  # the float64 table every worker receives each generation
    train_start, last_print, steps_at_start, sps = time.time(), 0.0, global_step, 0.0
    while global_step < args.total_timesteps:
        if rank == 0 and args.checkpoint_every and generation % args.checkpoint_every == 0 and global_step > steps_at_start:
            checkpoint()
        t0 = time.time()
        indices = sample_noise_indices(args.seed, generation, num_pairs, args.noise_table_size, dim)
        # The statistics as of the start of the generation: every worker has exactly these (this generation's own
        # observations are merged after the gather), so all members are evaluated with the same normalization.
        mean, std = obs_mean_std(obstat, obs_dim) if args.obs_norm else (torch.zeros(obs_dim), torch.ones(obs_dim))
        rows = torch.full((per_rank, width), -1.0, dtype=torch.float64)  # padding rows keep PAIR -1
        if hi > lo:  # a worker may get no pair (more workers than pairs); envpool refuses an empty batch
            # Rows 2j and 2j + 1 are theta + sigma eps_j and theta - sigma eps_j of the global pair lo + j.
            eps = torch.stack([noise[int(i):int(i) + dim] for i in indices[lo:hi]])
            params = torch.stack([theta + args.sigma * eps, theta - args.sigma * eps], 1).reshape(-1, dim)
            rets, lens, stats = rollout_population(policy, params, args.env_id, env_seed(args, generation, 2 * lo),
                                                   mean, std, args.obs_clip, cap, env_threads)
            mine = rows[:hi - lo]
            mine[:, PAIR], mine[:, NOISE] = torch.arange(lo, hi), torch.as_tensor(indices[lo:hi], dtype=torch.float64)
            mine[:, RETURNS], mine[:, LENGTHS] = torch.as_tensor(rets.reshape(-1, 2)), torch.as_tensor(lens.reshape(-1, 2))
            mine[:, OBSTAT] = stats[0::2] + stats[1::2]
        rollout_time = time.time() - t0
        if world > 1:
            gathered = [torch.empty_like(rows) for _ in range(world)]
            dist.all_gather(gathered, rows)
            rows = torch.cat(gathered)
        rows = rows[rows[:, PAIR] >= 0]
        assert torch.equal(rows[:, PAIR], torch.arange(num_pairs, dtype=torch.float64))
        t1 = time.time()
        returns = rows[:, RETURNS].numpy()
        theta, grad_norm = es_update(theta, adam, noise, rows[:, NOISE].long().tolist(), returns, args)
        obstat = obstat + rows[:, OBSTAT].sum(0)
        lengths = rows[:, LENGTHS].numpy()
        global_step += int(lengths.sum())
        if args.adaptive_cap:
            cap = min(max_steps, max(1, int(2 * lengths.mean())))
        update_time = time.time() - t1
        generation, episodes = generation + 1, episodes + 2 * num_pairs

        counters = torch.tensor([float(stop["signal"] != 0), rollout_time], dtype=torch.float64)
        if world > 1:
            dist.all_reduce(counters)
        for ret in returns.reshape(-1):  # the population's episodes, in global order
            recent.append(float(ret))
            if threshold is not None and time_to_threshold is None and len(recent) == 20 and np.mean(recent) >= threshold:
                time_to_threshold, threshold_step = time.time() - PROCESS_START, global_step
        if rank == 0:
            now = time.time()
            sps = global_step / (wall_before + now - train_start)  # whole run
            scalars = {"charts/episodic_return": returns.mean(), "charts/episodic_length": lengths.mean(),
                       "charts/episodic_return_max": returns.max(), "charts/SPS": sps, "charts/episode_cap": cap,
                       "charts/learning_rate": args.learning_rate, "losses/grad_norm": grad_norm,
                       "losses/theta_norm": float(theta.norm()), "stats/bytes_per_generation": float(gathered_bytes),
                       "stats/gradient_bytes": float(dim * 4), "stats/rollout_time_s": float(counters[1]) / world,
                       "stats/update_time_s": update_time, "stats/generation": generation}
            for key, value in scalars.items():
                writer.add_scalar(key, value, global_step)
            if now - last_print > 2.0 or global_step >= args.total_timesteps:
                last_print = now
                print(f"generation {generation} global_step={global_step} SPS={sps:.0f} "
                      f"return mean={returns.mean():.1f} max={returns.max():.1f} (last 20: {np.mean(recent):.1f})", flush=True)
        if counters[0] > 0:  # SIGTERM/SIGUSR1 on some worker (SLURM preemption): save, then exit cleanly
            if rank == 0:
                checkpoint()
                print(f"signal received: checkpoint of generation {generation} written to {ckpt_path}; "
                      "rerun with --resume to continue", flush=True)
            break
    else:
        if rank == 0:
            wall = wall_before + time.time() - train_start
            mean, std = obs_mean_std(obstat, obs_dim) if args.obs_norm else (torch.zeros(obs_dim), torch.ones(obs_dim))
            eval_returns, _, _ = rollout_population(policy, theta.expand(args.eval_episodes, dim), args.env_id,
                                                    args.seed + 10**6, mean, std, args.obs_clip, max_steps, env_threads)
            for i, r in enumerate(eval_returns):
                writer.add_scalar("eval/episodic_return", r, i)
            summary = {"algo": "es", "env_id": args.env_id, "seed": args.seed, "world_size": world,
                       "global_step": global_step, "generations": generation, "wall_time_s": time.time() - PROCESS_START,
                       "episodes_per_s": episodes / (time.time() - train_start), "sps": global_step / wall, "train_time_s": wall,
                       "eval_return_mean": float(np.mean(eval_returns)), "eval_return_std": float(np.std(eval_returns)),
                       "train_return_last20": float(np.mean(recent)) if recent else None,
                       "time_to_threshold_s": time_to_threshold, "threshold_step": threshold_step,
                       "reward_threshold": threshold, "num_params": dim, "bytes_per_generation": gathered_bytes,
                       "gradient_bytes": dim * 4, "theta_sha256": hashlib.sha256(theta.numpy().tobytes()).hexdigest()}
            with open(os.path.join(run_dir, "summary.json"), "w") as f:
                json.dump(summary, f, indent=2)
            if args.save_model:
                save_checkpoint(os.path.join(run_dir, "model.pt"), {"theta": theta, "obstat": obstat})
            print(f"eval return {summary['eval_return_mean']:.1f} +- {summary['eval_return_std']:.1f}; "
                  f"time to threshold: {time_to_threshold}; summary in {run_dir}/summary.json", flush=True)
    if writer is not None:
        writer.close()
        if args.track:
            import wandb
            wandb.finish()
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(tyro.cli(Args)))

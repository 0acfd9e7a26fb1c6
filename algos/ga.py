# docs: docs/ga.md | paper: https://arxiv.org/abs/1712.06567
"""Deep GA: a simple genetic algorithm for deep reinforcement learning (Such et al., 2017).

A population of N policies; each generation the top T are parents, and every child is a parent plus Gaussian
noise (sigma epsilon, epsilon from a noise table every worker builds from the same seed). No crossover. The
elite, the best of a few candidates re-evaluated over extra episodes, survives unchanged. An individual is
stored as its list of seeds (an initialization seed, then one noise offset per generation), so workers
exchange only seeds and fitnesses and rebuild parameters themselves, never sending them.

  python algos/ga.py                                         # one worker, CartPole-v1
  python algos/ga.py --num-workers 2                         # two worker processes on this machine
  torchrun --standalone --nproc_per_node=2 algos/ga.py       # the same under torchrun (or across nodes)
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
    exp_name: str = "ga"  # the name of this experiment (part of the run name)
    seed: int = 1  # seed of the experiment (initialization seeds, noise table, mutations, parent choices, env seeds)
    torch_deterministic: bool = True  # kept for the common block: runs on CPU, whose kernels here are deterministic
    cuda: bool = False  # kept for the common block: the GA evaluates small policies on CPU; this flag is ignored
    track: bool = False  # log to Weights & Biases as well as TensorBoard
    wandb_project_name: str = "distrl"  # the wandb project name
    wandb_entity: Optional[str] = None  # the wandb entity (team)
    capture_video: bool = False  # not supported (the GA here runs vector-observation tasks); kept for the common block
    save_model: bool = False  # write the elite's parameters and seed list to runs/<run_name>/model.pt
    env_id: str = "CartPole-v1"  # the envpool environment id (vector observations: classic control, MuJoCo)
    total_timesteps: int = 300_000  # environment steps over all workers (ends after the generation that exceeds it)
    eval_episodes: int = 10  # episodes of the final elite to evaluate at the end
    # --- algorithm ---
    population_size: int = 64  # N: individuals per generation (the elite plus N - 1 mutants)
    truncation: int = 8  # T: the top T individuals are the parents of the next generation (the elite is one of them)
    sigma: float = 0.05  # mutation power sigma: child = parent + sigma * epsilon
    elite_candidates: int = 10  # elite candidates: the generation's top ones and the previous elite (paper: 10)
    elite_episodes: int = 30  # extra episodes per elite candidate; the best mean is the elite (paper: 30)
    noise_table_size: int = 2 ** 24  # floats in the shared noise table (64 MiB); a mutation seed is an offset into it
    episode_cap: int = 0  # cap on episode length in steps (0: the environment's own limit)
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
    for name in ["total_timesteps", "population_size", "truncation", "elite_candidates", "elite_episodes",
                 "eval_episodes", "num_workers", "sigma", "noise_table_size"]:
        if getattr(args, name) <= 0:
            fail(name, f"must be positive, got {getattr(args, name)}")
    for name in ["episode_cap", "torch_threads", "env_threads", "checkpoint_every"]:
        if getattr(args, name) < 0:
            fail(name, f"must not be negative, got {getattr(args, name)}")
    if args.population_size < 2:
        fail("population_size", f"must be at least 2 (the elite and a mutant), got {args.population_size}")
    if args.truncation > args.population_size - 1:
        fail("truncation", f"{args.truncation} is more than the population's {args.population_size - 1} mutants")
    if args.elite_candidates > args.population_size - 1:
        fail("elite_candidates", f"{args.elite_candidates} is more than the population's {args.population_size - 1} mutants")
    if any(h <= 0 for h in args.hidden_sizes):
        fail("hidden_sizes", f"must be positive, got {args.hidden_sizes}")
    if args.num_workers > 1 and "WORLD_SIZE" in os.environ:
        fail("num_workers", "under torchrun every rank is a worker; leave --num-workers at 1")
    if args.capture_video:
        fail("capture_video", "not supported by the GA here (vector-observation tasks only)")
    if args.env_id not in envpool.list_all_envs():
        fail("env_id", f"'{args.env_id}' is not an envpool environment")
    spec = envpool.make_spec(args.env_id)
    obs_space, act_space = spec.observation_space, spec.action_space
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        fail("env_id", f"'{args.env_id}' has observation space {obs_space}; the GA here needs a flat Box")
    if not isinstance(act_space, (gym.spaces.Discrete, gym.spaces.Box)) or len(act_space.shape) > 1:
        fail("env_id", f"'{args.env_id}' has action space {act_space}; the GA here needs Discrete or 1-D Box")
    num_params = Policy(obs_space.shape[0], act_space, args.hidden_sizes).num_params
    if args.noise_table_size < num_params:
        fail("noise_table_size", f"{args.noise_table_size} is smaller than the policy ({num_params} parameters)")


# ----------------------------------------------------------------------------------------------- environment
def make_env(env_id: str, num_envs: int, seed: int, num_threads: int = 1, **kwargs):
    """An envpool batch. Env i of the batch is seeded with seed + i."""
    return envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, num_threads=num_threads,
                        thread_affinity_offset=-1, **kwargs)


def env_seed(args: Args, generation: int, episode: int) -> int:
    """Seed of episode `episode` (global index: mutants first, then the elite candidates' episodes) of
    `generation`: never tied to the worker that runs it, so results do not depend on the number of workers."""
    per_generation = args.population_size + args.elite_candidates * args.elite_episodes
    return args.seed + generation * per_generation + episode


# ----------------------------------------------------------------------------------------------- networks
class Policy:
    """Deterministic tanh MLP held as one flat parameter vector, so that perturbations are slices of the noise
    table. `forward` evaluates P parameter vectors on P observations at once (one batched matmul per layer):
    the whole population's step is one call. Discrete actions: argmax; Box actions: the output, clipped."""

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
        """The initialization phi(tau_0) of an individual: rows of each weight matrix drawn from N(0, I) (generator
        seeded with tau_0) and scaled to norm 1 (0.01 for the output layer); zero biases."""
        chunks = []
        for k, (o, i) in enumerate(self.shapes):
            w = torch.randn(o, i, generator=generator)
            w *= (0.01 if k == len(self.shapes) - 1 else 1.0) / w.norm(dim=1, keepdim=True)
            chunks += [w.reshape(-1), torch.zeros(o)]
        return torch.cat(chunks)

    def forward(self, params: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """params [P, num_params], obs [P, obs_dim] -> outputs [P, n_out]. A single row is computed inside a batch
        of two (itself twice): baddbmm takes another kernel for a batch of one, whose low bits differ, and an
        individual's result must not depend on how many others share its worker's block."""
        if params.shape[0] == 1:
            return self.forward(params.repeat(2, 1), obs.repeat(2, 1))[:1]
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
    """The shared noise table: `size` standard normal float32 numbers from a generator seeded with `seed`. Every
    worker builds the same table; a perturbation is an offset into it (its slice of num_params numbers)."""
    return torch.randn(size, generator=torch.Generator().manual_seed(seed))


def mutate(params: torch.Tensor, noise: torch.Tensor, offset: int, sigma: float) -> torch.Tensor:
    """psi(theta, tau) = theta + sigma * epsilon(tau), epsilon(tau) the noise table's slice at offset tau."""
    return params + sigma * noise[offset:offset + params.numel()]


def params_from_seeds(policy: Policy, noise: torch.Tensor, seeds, sigma: float) -> torch.Tensor:
    """Decode the compact encoding [tau_0, tau_1, ..., tau_g]: initialize from tau_0, then apply the mutations in
    order. Workers use it only for individuals whose parent is not cached (at start and after a resume)."""
    params = policy.init_params(torch.Generator().manual_seed(int(seeds[0])))
    for offset in seeds[1:]:
        params = mutate(params, noise, int(offset), sigma)
    return params


def make_generation(parents: list, seed: int, generation: int, population: int, table_size: int, dim: int) -> list:
    """The seed lists of a generation, from random choices drawn from (seed, generation) alone, so every worker
    makes the same ones. Generation 0: N fresh individuals [tau_0]. Later: N - 1 mutants, each a parent chosen
    uniformly among the T parents with one new mutation offset appended (the encoding grows by one seed)."""
    rng = np.random.default_rng([seed, generation])
    if generation == 0:
        return [[int(tau)] for tau in rng.integers(0, 2 ** 31, size=population)]
    choice = rng.integers(0, len(parents), size=population - 1)
    offsets = rng.integers(0, table_size - dim + 1, size=population - 1)
    return [parents[k] + [int(o)] for k, o in zip(choice, offsets)]


def elite_candidates(individuals: list, fitness: np.ndarray, elite: Optional[list], num: int) -> list:
    """The candidates for the elite: the previous elite (if any) first, then the best of the generation by
    fitness (descending; ties by index), num in all."""
    order = np.argsort(-fitness, kind="stable")
    best = [individuals[i] for i in order[:num - (elite is not None)]]
    return ([elite] if elite is not None else []) + best


def next_parents(individuals: list, fitness: np.ndarray, elite: list, truncation: int) -> list:
    """Truncation selection: the elite, then the best of the generation other than the elite, T in all."""
    order = np.argsort(-fitness, kind="stable")
    return [elite] + [individuals[i] for i in order if individuals[i] != elite][:truncation - 1]


# ----------------------------------------------------------------------------------------------- roles
def rollout_population(policy: Policy, params: torch.Tensor, env_id: str, seed: int, cap: int, num_threads: int = 1):
    """One episode per row of params [P, num_params], all P at once: one envpool batch (env i seeded seed + i),
    one batched forward pass per step. Returns returns [P] and lengths [P]."""
    P = params.shape[0]
    envs = make_env(env_id, P, seed, num_threads)
    obs, _ = envs.reset()
    alive = np.ones(P, dtype=bool)
    returns, lengths = np.zeros(P), np.zeros(P, dtype=np.int64)
    for _ in range(cap):
        with torch.no_grad():
            action = policy.act(params, torch.as_tensor(obs, dtype=torch.float32))
        ids = np.flatnonzero(alive)  # step only the envs whose episode goes on (envpool steps a subset by id)
        o, r, term, trunc, info = envs.step(action[ids], ids)
        obs[info["env_id"]] = o
        returns[info["env_id"]] += r
        lengths[ids] += 1
        alive[info["env_id"]] = ~(term | trunc)
        if not alive.any():
            break
    envs.close()
    return returns, lengths


def gathered_bytes(count: int, world: int) -> int:
    """What run_episodes' all_gather hands every worker for `count` episodes: blocks of float64 rows padded alike."""
    return world * math.ceil(count / world) * 3 * 8


def run_episodes(policy, params_of, count: int, seed: int, args: Args, cap: int, env_threads: int):
    """Episodes 0..count-1 of a phase (episode j: parameters params_of(j), env seed `seed + j`), split over the
    workers in contiguous blocks. Only (index, return, length) rows travel (all_gather); every worker gets the
    returns and lengths of all episodes, in index order."""
    per_rank = math.ceil(count / args.world_size)
    lo, hi = min(args.rank * per_rank, count), min((args.rank + 1) * per_rank, count)
    rows = torch.full((per_rank, 3), -1.0, dtype=torch.float64)  # padding rows keep index -1
    if hi > lo:
        rets, lens = rollout_population(policy, torch.stack([params_of(j) for j in range(lo, hi)]), args.env_id,
                                        seed + lo, cap, env_threads)
        rows[:hi - lo, 0] = torch.arange(lo, hi, dtype=torch.float64)
        rows[:hi - lo, 1], rows[:hi - lo, 2] = torch.as_tensor(rets), torch.as_tensor(lens, dtype=torch.float64)
    if args.world_size > 1:
        gathered = [torch.empty_like(rows) for _ in range(args.world_size)]
        dist.all_gather(gathered, rows)
        rows = torch.cat(gathered)
    rows = rows[rows[:, 0] >= 0]
    assert torch.equal(rows[:, 0], torch.arange(count, dtype=torch.float64))
    return rows[:, 1].numpy(), rows[:, 2].numpy().astype(np.int64)


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
    threshold, max_steps = spec.reward_threshold, spec.config.max_episode_steps
    policy = Policy(spec.observation_space.shape[0], spec.action_space, args.hidden_sizes)
    dim, N, C, E = policy.num_params, args.population_size, args.elite_candidates, args.elite_episodes
    noise = noise_table(args.seed + 2**32, args.noise_table_size)  # its own stream, apart from the weights' (seed)
    cap = args.episode_cap or max_steps
    # An individual is its seed list. parents / elite are all the state there is; `cache` maps the seed lists of
    # the current parents to their parameters, so that building a child is one mutation.
    parents, elite, elite_score, cache = [], None, None, {}
    generation, global_step, wall_before, time_to_threshold, threshold_step = 0, 0, 0.0, None, None
    episodes = 0  # run in this process (a resumed run counts from its restart)
    recent = deque(maxlen=20)
    # Rank 0 reads the checkpoint and sends it to the other ranks: nodes need no shared filesystem.
    box = [torch.load(ckpt_path, weights_only=True) if args.resume and rank == 0 and os.path.exists(ckpt_path) else None]
    if world > 1:
        dist.broadcast_object_list(box, 0)
    ckpt = box[0]
    if ckpt is not None:
        parents, elite, elite_score, generation = ckpt["parents"], ckpt["elite"], ckpt["elite_score"], ckpt["generation"]
        global_step, wall_before = ckpt["global_step"], ckpt["wall_time_s"]
        time_to_threshold, threshold_step = ckpt["time_to_threshold_s"], ckpt["threshold_step"]
        recent.extend(ckpt["recent_returns"])

    def get_params(seeds: list) -> torch.Tensor:
        if tuple(seeds) in cache:
            return cache[tuple(seeds)]
        if tuple(seeds[:-1]) in cache:
            return mutate(cache[tuple(seeds[:-1])], noise, int(seeds[-1]), args.sigma)
        return params_from_seeds(policy, noise, seeds, args.sigma)

    def checkpoint():  # seed lists and counters: a few hundred bytes, whatever the network's size
        save_checkpoint(ckpt_path, dict(parents=parents, elite=elite, elite_score=elite_score, generation=generation,
                        global_step=global_step, wall_time_s=wall_before + time.time() - train_start,
                        time_to_threshold_s=time_to_threshold, threshold_step=threshold_step, recent_returns=list(recent)))

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

    train_start, last_print, steps_at_start, sps = time.time(), 0.0, global_step, 0.0
    while global_step < args.total_timesteps:
        if rank == 0 and args.checkpoint_every and generation % args.checkpoint_every == 0 and global_step > steps_at_start:
            checkpoint()
        t0 = time.time()
        cache = {tuple(p): get_params(p) for p in parents}
        # 1. The generation: N fresh individuals at first, then N - 1 mutants of uniformly chosen parents.
        individuals = make_generation(parents, args.seed, generation, N, args.noise_table_size, dim)
        fitness, lengths = run_episodes(policy, lambda j: get_params(individuals[j]), len(individuals),
                                        env_seed(args, generation, 0), args, cap, env_threads)
        # 2. The elite: the candidates' mean return over E more episodes each (episode j: candidate j // E).
        candidates = elite_candidates(individuals, fitness, elite, C)
        cand_params = [get_params(c) for c in candidates]
        cand_returns, cand_lengths = run_episodes(
            policy, lambda j: cand_params[j // E], len(candidates) * E, env_seed(args, generation, N), args,
            cap, env_threads)  # the same episode cap as the mutants (as in Uber's code)
        scores = cand_returns.reshape(len(candidates), E).mean(1)
        best = int(np.argmax(scores))  # ties: the first, so a previous elite that ties keeps its place
        elite, elite_score = candidates[best], float(scores[best])
        # 3. Truncation selection: the elite and the best T - 1 others are the next generation's parents.
        parents = next_parents(individuals, fitness, elite, args.truncation)
        global_step += int(lengths.sum() + cand_lengths.sum())
        generation += 1
        episodes += len(individuals) + len(candidates) * E
        rollout_time = time.time() - t0

        counters = torch.tensor([float(stop["signal"] != 0), rollout_time], dtype=torch.float64)
        if world > 1:
            dist.all_reduce(counters)
        # Training return for the threshold: the elite's re-evaluation episodes (the policy the GA returns),
        # not the mutants, which are exploration (their mean is logged as charts/episodic_return).
        for ret in cand_returns[best * E:(best + 1) * E]:
            recent.append(float(ret))
            if threshold is not None and time_to_threshold is None and len(recent) == 20 and np.mean(recent) >= threshold:
                time_to_threshold, threshold_step = time.time() - PROCESS_START, global_step
        if rank == 0:
            now = time.time()
            sps = global_step / (wall_before + now - train_start)  # whole run
            scalars = {"charts/episodic_return": fitness.mean(), "charts/episodic_length": lengths.mean(),
                       "charts/episodic_return_max": fitness.max(), "charts/elite_return": elite_score,
                       "charts/parents_return": float(np.sort(fitness)[::-1][:args.truncation].mean()),
                       "charts/SPS": sps, "charts/encoding_length": len(elite),
                       "stats/bytes_per_generation": gathered_bytes(len(individuals), world) + gathered_bytes(C * E, world),
                       "stats/parameter_bytes": float(dim * 4 * N), "stats/rollout_time_s": float(counters[1]) / world,
                       "stats/generation": generation}
            for key, value in scalars.items():
                writer.add_scalar(key, value, global_step)
            if now - last_print > 2.0 or global_step >= args.total_timesteps:
                last_print = now
                print(f"generation {generation} global_step={global_step} SPS={sps:.0f} return mean={fitness.mean():.1f} "
                      f"max={fitness.max():.1f} elite={elite_score:.1f} (last 20: {np.mean(recent):.1f})", flush=True)
        if counters[0] > 0:  # SIGTERM/SIGUSR1 on some worker (SLURM preemption): save, then exit cleanly
            if rank == 0:
                checkpoint()
                print(f"signal received: checkpoint of generation {generation} written to {ckpt_path}; "
                      "rerun with --resume to continue", flush=True)
            break
    else:
        if rank == 0:
            wall = wall_before + time.time() - train_start
            theta = get_params(elite)
            eval_returns, _ = rollout_population(policy, theta.expand(args.eval_episodes, dim), args.env_id,
                                                 args.seed + 10**6, max_steps, env_threads)
            for i, r in enumerate(eval_returns):
                writer.add_scalar("eval/episodic_return", r, i)
            summary = {"algo": "ga", "env_id": args.env_id, "seed": args.seed, "world_size": world,
                       "global_step": global_step, "generations": generation, "wall_time_s": time.time() - PROCESS_START,
                       "episodes_per_s": episodes / (time.time() - train_start), "sps": global_step / wall, "train_time_s": wall,
                       "eval_return_mean": float(np.mean(eval_returns)), "eval_return_std": float(np.std(eval_returns)),
                       "train_return_last20": float(np.mean(recent)) if recent else None,
                       "time_to_threshold_s": time_to_threshold, "threshold_step": threshold_step,
                       "reward_threshold": threshold, "num_params": dim, "elite_score": elite_score, "elite_seeds": elite,
                       "bytes_per_generation": gathered_bytes(N - 1, world) + gathered_bytes(C * E, world),  # after the first
                       "parameter_bytes": dim * 4 * N, "theta_sha256": hashlib.sha256(theta.numpy().tobytes()).hexdigest()}
            with open(os.path.join(run_dir, "summary.json"), "w") as f:
                json.dump(summary, f, indent=2)
            if args.save_model:
                save_checkpoint(os.path.join(run_dir, "model.pt"), {"theta": theta, "seeds": elite})
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

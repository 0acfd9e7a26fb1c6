# docs: docs/a3c.md | paper: https://arxiv.org/abs/1602.01783
"""A3C: Asynchronous Advantage Actor-Critic (Mnih et al., 2016).

Worker processes share one model and one optimizer state in shared memory. Each worker copies the shared
parameters, rolls out t_max steps on its own envs, computes n-step returns and the actor-critic gradient, and
applies it to the shared parameters without any lock (Hogwild). One node by nature (many: IMPALA, DD-PPO).

  python algos/a3c.py                                  # one worker per CPU this process may use, CartPole-v1
  python algos/a3c.py --num-workers 1                  # the reproducible reference (bitwise repeatable)
"""
import ctypes
import json
import math
import os
import queue
import signal
import sys
import time
import types
import warnings
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Literal, Optional


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
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
import tyro  # noqa: E402


@dataclass
class Args:
    # --- common to every distrl file ---
    exp_name: str = "a3c"  # the name of this experiment (part of the run name)
    seed: int = 1  # seed of the experiment
    torch_deterministic: bool = True  # kept for the common block: A3C runs on CPU, whose kernels here are deterministic
    cuda: bool = False  # kept for the common block: Hogwild workers share CPU memory; this flag is ignored
    track: bool = False  # log to Weights & Biases as well as TensorBoard
    wandb_project_name: str = "distrl"  # the wandb project name
    wandb_entity: Optional[str] = None  # the wandb entity (team)
    capture_video: bool = False  # save the first evaluation episode's frames (Atari) to runs/<run_name>/videos/
    save_model: bool = False  # write the final weights (state_dict) to runs/<run_name>/model.pt
    env_id: str = "CartPole-v1"  # the envpool environment id
    total_timesteps: int = 200_000  # total environment steps over all workers (the shared counter)
    eval_episodes: int = 10  # episodes of the final, greedy policy to evaluate at the end
    # --- algorithm ---
    t_max: int = 5  # steps per rollout segment before each update (paper: 5)
    num_envs: int = 8  # environments stepped by each worker (the paper: 1)
    gamma: float = 0.98  # discount factor (paper: 0.99; see docs/a3c.md, Defaults)
    optimizer: Literal["rmsprop", "adam"] = "adam"  # shared RMSProp (the paper's) or Adam with shared state
    learning_rate: float = 2e-3  # the optimizer's learning rate
    anneal_lr: bool = True  # anneal the learning rate linearly to zero over total_timesteps (as in the paper)
    rmsprop_alpha: float = 0.99  # shared RMSProp's decay alpha (paper: 0.99)
    rmsprop_eps: float = 0.1  # shared RMSProp's epsilon, inside the square root (paper: not stated)
    adam_eps: float = 1e-5  # Adam's epsilon
    ent_coef: float = 0.01  # entropy bonus beta (paper: 0.01)
    vf_coef: float = 0.5  # value loss coefficient
    max_grad_norm: float = 0.5  # per-worker gradient-norm clip before the shared update (0: off)
    use_lstm: bool = False  # an LSTM core between torso and heads (the paper's A3C LSTM)
    torch_threads: int = 1  # torch threads per worker
    # --- distributed ---
    num_workers: int = 0  # Hogwild worker processes (0: the CPUs this process may use, at most 4; see docs)
    checkpoint_every: int = 0  # write runs/<run_name>/checkpoint.pt every this many shared updates (0: on signals only)
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
    for name in ["total_timesteps", "t_max", "num_envs", "eval_episodes", "learning_rate", "rmsprop_eps", "adam_eps",
                 "torch_threads"]:
        if getattr(args, name) <= 0:
            fail(name, f"must be positive, got {getattr(args, name)}")
    for name in ["num_workers", "checkpoint_every", "ent_coef", "vf_coef", "max_grad_norm"]:
        if getattr(args, name) < 0:
            fail(name, f"must not be negative, got {getattr(args, name)}")
    for name in ["gamma", "rmsprop_alpha"]:
        if not 0.0 < getattr(args, name) <= 1.0:
            fail(name, f"must be in (0, 1], got {getattr(args, name)}")
    if "WORLD_SIZE" in os.environ:
        fail("num_workers", "A3C runs on one node and spawns its own workers: run it without torchrun")
    if args.env_id not in envpool.list_all_envs():
        fail("env_id", f"'{args.env_id}' is not an envpool environment")
    spec = envpool.make_spec(args.env_id)
    obs_space, act_space = spec.observation_space, spec.action_space
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) not in (1, 3):
        fail("env_id", f"'{args.env_id}' has observation space {obs_space}; A3C here needs a flat or image Box")
    if not isinstance(act_space, (gym.spaces.Discrete, gym.spaces.Box)) or len(act_space.shape) > 1:
        fail("env_id", f"'{args.env_id}' has action space {act_space}; A3C here needs Discrete or 1-D Box")
    if args.capture_video and len(obs_space.shape) != 3:
        fail("capture_video", "frames are saved for Atari (image) environments only")


# ----------------------------------------------------------------------------------------------- environment
def make_env(env_id: str, num_envs: int, seed: int, num_threads: int = 1, **kwargs):
    """An envpool batch. Env i of the batch is seeded with seed + i. Atari gets DeepMind preprocessing."""
    extra = {}
    if len(envpool.make_spec(env_id).observation_space.shape) == 3:  # Atari: 84x84 grey, 4 stacked, skip 4
        extra = dict(episodic_life=True, reward_clip=True, noop_max=30, repeat_action_probability=0.0)
    extra.update(kwargs)
    return envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, num_threads=num_threads,
                        thread_affinity_offset=-1, **extra)


def env_seed(args: Args, worker: int, segment: int) -> int:
    """Seed of env 0 of `worker` in run segment `segment` (0, then one more per resume): distinct for every env."""
    return args.seed + (segment * args.num_workers + worker) * args.num_envs


# ----------------------------------------------------------------------------------------------- networks
def layer_init(layer: nn.Module, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Module:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(n_in: int, n_out: int, out_std: float) -> nn.Module:
    return nn.Sequential(layer_init(nn.Linear(n_in, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh(),
                         layer_init(nn.Linear(64, n_out), out_std))


class Agent(nn.Module):
    """Actor-critic: 64-64 tanh MLP heads (vectors) or a Nature-CNN torso with linear heads (images), an optional LSTM
    core; softmax policy (Discrete) or Gaussian with state-independent log-std (Box). Inputs have a time axis."""

    def __init__(self, obs_shape, action_space, use_lstm: bool = False):
        super().__init__()
        self.image, self.continuous = len(obs_shape) == 3, isinstance(action_space, gym.spaces.Box)
        n_out = int(np.prod(action_space.shape)) if self.continuous else int(action_space.n)
        if self.image:
            self.torso, width = nn.Sequential(
                layer_init(nn.Conv2d(obs_shape[0], 32, 8, stride=4)), nn.ReLU(),
                layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
                layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(), nn.Flatten(),
                layer_init(nn.Linear(64 * 7 * 7, 512)), nn.ReLU()), 512
        else:
            self.torso, width = nn.Identity(), int(np.prod(obs_shape))
        self.core = nn.LSTMCell(width, 256 if self.image else 64) if use_lstm else None
        width = self.core.hidden_size if use_lstm else width
        head = (lambda n, std: layer_init(nn.Linear(width, n), std)) if self.image else (lambda n, std: mlp(width, n, std))
        self.actor, self.critic = head(n_out, 0.01), head(1, 1.0)
        if self.continuous:
            self.actor_logstd = nn.Parameter(torch.zeros(n_out))

    def initial_state(self, n: int) -> torch.Tensor:  # zero LSTM state (h, c) as [2, n, width]; empty without LSTM
        return torch.zeros(2, n, self.core.hidden_size if self.core is not None else 0)

    def forward(self, obs: torch.Tensor, valid: torch.Tensor, state: torch.Tensor):
        """obs [T, N, ...], valid [T, N] (0 on envpool's reset steps: the LSTM state restarts from zero there),
        state [2, N, H] -> policy outputs [T, N, A], values [T, N], state after the last step."""
        T, N = obs.shape[:2]
        x = obs.reshape((T * N,) + obs.shape[2:]).float()
        h = self.torso(x / 255.0 if self.image else x)
        if self.core is not None:
            h, outs, (hx, cx) = h.view(T, N, -1), [], (state[0], state[1])
            for t in range(T):
                hx, cx = self.core(h[t], (hx, cx))
                outs.append(hx)
                keep = valid[t].unsqueeze(-1)  # after a reset step the next episode starts from the zero state
                hx, cx = hx * keep, cx * keep
            h, state = torch.stack(outs).view(T * N, -1), torch.stack([hx, cx])
        return self.actor(h).view(T, N, -1), self.critic(h).view(T, N), state

    def logprob_entropy(self, out: torch.Tensor, actions: torch.Tensor):
        """log pi(a|s) and the entropy H(pi(.|s)) for policy outputs out [..., A] and actions."""
        if self.continuous:
            std = self.actor_logstd.exp()
            logp = (-0.5 * ((actions - out) / std) ** 2 - std.log() - 0.5 * math.log(2 * math.pi)).sum(-1)
            return logp, (0.5 + 0.5 * math.log(2 * math.pi) + self.actor_logstd).sum().expand(out.shape[:-1])
        logp_all = torch.log_softmax(out, dim=-1)
        return logp_all.gather(-1, actions.unsqueeze(-1)).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)


# ----------------------------------------------------------------------------------------------- algorithm
def nstep_returns(rewards, values, bootstrap, terms, dones, gamma: float):
    """The paper's n-step returns over a [T, N] segment, R_t = r_t + gamma R_{t+1}, R_T = V(s_T) = bootstrap. A termination
    stops the bootstrap; a truncation bootstraps from envpool's final observation (values[t + 1], or bootstrap)."""
    returns, acc = torch.zeros_like(rewards), bootstrap
    for t in reversed(range(rewards.shape[0])):
        v_next = bootstrap if t == rewards.shape[0] - 1 else values[t + 1]
        nxt = dones[t] * v_next + (1.0 - dones[t]) * acc  # an episode ended at t: do not reach into the next one
        returns[t] = acc = rewards[t] + gamma * (1.0 - terms[t]) * nxt
    return returns


def a3c_loss(agent: Agent, seg: dict, returns, args: Args):
    """Policy gradient with advantage R_t - V(s_t), squared-error value loss, entropy bonus; means over valid steps."""
    out, values, _ = agent(seg["obs"], seg["valid"], seg["state"])
    logp, entropy = agent.logprob_entropy(out, seg["actions"])
    valid, n = seg["valid"], seg["valid"].sum().clamp(min=1.0)
    advantages = (returns - values).detach()
    pg_loss = -(logp * advantages * valid).sum() / n
    v_loss = 0.5 * (((returns - values) ** 2) * valid).sum() / n
    ent = (entropy * valid).sum() / n
    return pg_loss + args.vf_coef * v_loss - args.ent_coef * ent, torch.stack([pg_loss, v_loss, ent]).detach()


def shared_rmsprop_step(flat, grad, state: dict, lr: float, alpha: float = 0.99, eps: float = 0.1) -> None:
    """The paper's shared RMSProp (Section 4), in place on the shared tensors, no lock: g <- alpha g + (1 - alpha)
    dtheta^2; theta <- theta - lr dtheta / sqrt(g + eps) (torch.optim.RMSprop puts eps outside: sqrt(g) + eps)."""
    state["g"].mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
    flat.sub_(lr * grad / (state["g"] + eps).sqrt())


def shared_adam_step(flat, grad, state: dict, step: int, lr: float, betas=(0.9, 0.999), eps: float = 1e-5) -> None:
    """Adam with its moments in shared memory, updated in place by every worker; `step` is the shared update count.
    One worker alone: equals torch.optim.Adam(params, lr, betas, eps).step() (tested bitwise)."""
    b1, b2 = betas
    state["m"].lerp_(grad, 1 - b1)
    state["v"].mul_(b2).addcmul_(grad, grad, value=1 - b2)
    denom = (state["v"].sqrt() / math.sqrt(1 - b2 ** step)).add_(eps)
    flat.sub_((lr / (1 - b1 ** step)) * state["m"] / denom)


def count(counter, steps: int):
    """Add steps and one update to the shared [env steps, updates] under its lock (exact); return the new values."""
    with counter.get_lock():
        counter[0] += steps
        counter[1] += 1
        return counter[0], counter[1]


def flatten_parameters(agent: nn.Module):
    """Parameters as views of one flat vector, gradients as views of another (backward adds into them in place)."""
    params = list(agent.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    grad = torch.zeros_like(flat)
    offset = 0
    for p in params:
        p.data, p.grad = flat[offset:offset + p.numel()].view_as(p), grad[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    return flat, grad


# ----------------------------------------------------------------------------------------------- roles
def worker(index: int, args: Args, spec, shared: dict, counter, stop, messages, segment: int, parent: int) -> None:
    """One Hogwild worker: copy the shared parameters, roll out t_max steps, compute the gradient on the local copy,
    apply it to the shared parameters without a lock. Sends episodes and, every 0.5 s, statistics to the parent."""
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the parent, whatever kills it
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):  # the parent turns these into a stop
        signal.signal(sig, signal.SIG_IGN)
    torch.set_num_threads(args.torch_threads)
    T, N, seed = args.t_max, args.num_envs, env_seed(args, index, segment)
    envs, generator = make_env(args.env_id, N, seed), torch.Generator().manual_seed(seed)
    bounds = (envs.action_space.low, envs.action_space.high) if isinstance(envs.action_space, gym.spaces.Box) else None
    agent = Agent(spec.observation_space.shape, spec.action_space, args.use_lstm)
    flat, grad = flatten_parameters(agent)
    obs, valid, state = torch.as_tensor(envs.reset()[0]), torch.ones(N), agent.initial_state(N)
    ep_return, ep_length, prev_done = np.zeros(N), np.zeros(N), np.zeros(N, dtype=bool)
    seg = {"obs": torch.zeros((T, N) + spec.observation_space.shape, dtype=obs.dtype), "valid": torch.zeros(T, N),
           "actions": torch.zeros((T, N) + spec.action_space.shape, dtype=torch.float32 if agent.continuous else torch.long)}
    rewards, terms, dones, values = (torch.zeros(T, N) for _ in range(4))
    start, steps_done, last_sent, global_step = time.time(), 0, 0.0, counter[0]
    while not stop.value and global_step < args.total_timesteps:  # each worker ends after the update that reaches it
        flat.copy_(shared["flat"])  # the paper's "synchronize thread-specific parameters theta' = theta"
        seg["state"] = state.clone()
        for t in range(T):
            seg["obs"][t], seg["valid"][t] = obs, valid
            with torch.no_grad():
                out, value, state = agent(obs.unsqueeze(0), valid.unsqueeze(0), state)
                if agent.continuous:  # sampled with the worker's own seeded generator
                    action = out[0] + agent.actor_logstd.exp() * torch.randn(out[0].shape, generator=generator)
                else:
                    action = torch.multinomial(torch.softmax(out[0], -1), 1, generator=generator).squeeze(-1)
            seg["actions"][t], values[t] = action, value[0]
            env_action = np.clip(action.numpy(), *bounds) if agent.continuous else action.numpy()
            o, r, term, trunc, info = envs.step(env_action)
            done = term | trunc
            obs, valid = torch.as_tensor(o), torch.as_tensor(~done, dtype=torch.float32)
            rewards[t], terms[t], dones[t] = torch.as_tensor(r), torch.as_tensor(term), torch.as_tensor(done)
            # Episode statistics (Atari: raw rewards and the real game over); the reset step after an end adds nothing.
            ep_return += info.get("reward", r) * ~prev_done
            ep_length += ~prev_done
            ended = (info["terminated"].astype(bool) | trunc) if "terminated" in info else done
            for i in np.flatnonzero(ended):
                messages.put((index, float(ep_return[i]), int(ep_length[i]), global_step, time.time()))
            ep_return[ended], ep_length[ended], prev_done = 0.0, 0, done
        with torch.no_grad():
            bootstrap = agent(obs.unsqueeze(0), valid.unsqueeze(0), state)[1][0]
        returns = nstep_returns(rewards, values, bootstrap, terms, dones, args.gamma)
        grad.zero_()
        loss, losses = a3c_loss(agent, seg, returns, args)
        loss.backward()
        if args.max_grad_norm:
            grad.mul_(torch.clamp(args.max_grad_norm / (grad.norm() + 1e-6), max=1.0))
        global_step, update = count(counter, T * N)
        lr = args.learning_rate * max(0.0, 1.0 - global_step / args.total_timesteps) if args.anneal_lr else args.learning_rate
        if args.optimizer == "rmsprop":
            shared_rmsprop_step(shared["flat"], grad, shared, lr, args.rmsprop_alpha, args.rmsprop_eps)
        else:
            shared_adam_step(shared["flat"], grad, shared, update, lr, eps=args.adam_eps)
        steps_done += T * N
        if time.time() - last_sent > 0.5:
            last_sent = time.time()
            messages.put((index, "update", losses.tolist(), steps_done / (last_sent - start), lr))
    envs.close()
    messages.put((index, "exit"))


def evaluate(agent: Agent, env_id: str, episodes: int, seed: int, video_dir: Optional[str] = None):
    """Returns of `episodes` episodes of the greedy policy, one env per episode (no bias to short episodes)."""
    envs = make_env(env_id, episodes, seed, **(dict(episodic_life=False, reward_clip=False) if agent.image else {}))
    obs, _ = envs.reset()
    returns, done = np.zeros(episodes), np.zeros(episodes, dtype=bool)
    state, valid, frames = agent.initial_state(episodes), torch.ones(1, episodes), []
    while not done.all():
        with torch.no_grad():
            out, _, state = agent(torch.as_tensor(obs).unsqueeze(0), valid, state)
        action = np.clip(out[0].numpy(), envs.action_space.low, envs.action_space.high) if agent.continuous \
            else out[0].argmax(-1).numpy()
        obs, r, term, trunc, info = envs.step(action)
        returns += info.get("reward", r) * ~done
        if video_dir is not None and not done[0]:
            frames.append(obs[0, -1])
        done |= (info["terminated"].astype(bool) if "terminated" in info else term) | trunc
        valid = torch.as_tensor(~(term | trunc), dtype=torch.float32).unsqueeze(0)
    if frames:
        os.makedirs(video_dir, exist_ok=True)
        np.savez_compressed(os.path.join(video_dir, "eval_episode0.npz"), frames=np.stack(frames))
    envs.close()
    return returns


def save_checkpoint(path: str, payload: dict) -> None:  # atomic: a temporary file beside the target, renamed over it
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save(payload, tmp)
    os.replace(tmp, path)


def default_num_workers() -> int:
    """The CPUs this process may use (its affinity mask, which taskset, SLURM and containers set), at most 4: with 8
    or 16 Hogwild workers the default learning rate made CartPole runs collapse on a 16-core machine (docs)."""
    return max(1, min(4, len(os.sched_getaffinity(0))))  # Linux, as /proc


def main(args: Args) -> int:
    warnings.filterwarnings("ignore", message=".*precision lowered by casting.*")  # envpool's spaces
    validate(args)
    args.num_workers = args.num_workers or default_num_workers()
    args.run_name = f"{args.env_id}__{args.exp_name}__{args.seed}"
    run_dir, ckpt_path = os.path.join("runs", args.run_name), os.path.join("runs", args.run_name, "checkpoint.pt")
    torch.set_num_threads(args.torch_threads)
    torch.manual_seed(args.seed)
    spec = envpool.make_spec(args.env_id)
    threshold = spec.reward_threshold  # None for envs without one (no time to threshold then)

    # The shared model and optimizer state: one flat vector each, in shared memory, updated in place by every worker.
    agent = Agent(spec.observation_space.shape, spec.action_space, args.use_lstm)
    flat, _ = flatten_parameters(agent)
    shared = {k: v.share_memory_() for k, v in {"flat": flat, **{k: torch.zeros_like(flat) for k in "gmv"}}.items()}
    progress = {"segment": 0, "global_step": 0, "updates": 0, "train_time_s": 0.0, "elapsed_s": 0.0, "recent_returns": [],
                "time_to_threshold_s": None, "train_time_to_threshold_s": None, "threshold_step": None}
    if args.resume and os.path.exists(ckpt_path):
        ckpt = torch.load(ckpt_path, weights_only=True)
        for k in shared:
            shared[k].copy_(ckpt["shared"][k])
        progress.update(ckpt["progress"], segment=ckpt["progress"]["segment"] + 1)
    counter = mp.Array("q", [progress["global_step"], progress["updates"]])  # exact under concurrency: it has a lock
    stop, recent = mp.Value("b", 0, lock=False), deque(progress["recent_returns"], maxlen=20)

    signals = {"signal": 0}  # before the fork; each worker then ignores these signals, the parent stops them
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: signals.update(signal=signum))
    ctx = mp.get_context("fork")
    messages = ctx.Queue(maxsize=10_000)  # small tuples: episodes, worker statistics, and each worker's "exit"
    train_start = time.time()
    workers = [ctx.Process(target=worker, daemon=True, args=(i, args, spec, shared, counter, stop, messages,
                                                             progress["segment"], os.getpid())) for i in range(args.num_workers)]
    for p in workers:
        p.start()
    try:  # whatever ends this (an exception too), no worker outlives it: they ignore the SIGTERM of exit
        from torch.utils.tensorboard import SummaryWriter  # after the fork: it (and wandb) start threads
        if args.track:
            import wandb
            wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True,
                       config=asdict(args), name=args.run_name, id=args.run_name, resume="allow")
        writer = SummaryWriter(run_dir, purge_step=progress["global_step"] if progress["segment"] else None)  # resume
        writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in asdict(args).items()))

        def checkpoint() -> None:  # the shared tensors as they are (Hogwild: workers may be writing them)
            global_step, updates = counter[:]  # one read under the counter's lock: a consistent pair
            save_checkpoint(ckpt_path, {"shared": {k: v.clone() for k, v in shared.items()}, "progress": {
                **progress, "global_step": global_step, "updates": updates, "recent_returns": list(recent),
                "train_time_s": progress["train_time_s"] + time.time() - train_start,
                "elapsed_s": progress["elapsed_s"] + time.time() - PROCESS_START}})

        exit_code, last_print, last_ckpt, worker_sps, exited = 0, 0.0, counter[1], {}, set()
        # Until every worker said "exit" (no message is left unread) and ended with code 0 (a death is always seen).
        while len(exited) < args.num_workers or any(p.exitcode != 0 for p in workers):
            msgs = []
            try:  # up to 256 messages per pass, waiting at most 0.2 s for the first
                msgs.append(messages.get(timeout=0.2))
                while len(msgs) < 256:
                    msgs.append(messages.get_nowait())
            except queue.Empty:
                pass
            dead = [f"worker {i} (pid {p.pid}) exited with code {p.exitcode}" for i, p in enumerate(workers) if p.exitcode]
            if dead:  # a dead worker ends the run, naming it
                print(f"{os.path.basename(sys.argv[0])}: error: {dead[0]}; stopping", file=sys.stderr, flush=True)
                exit_code = 1
                break
            stop.value = stop.value or int(signals["signal"] != 0)  # SIGTERM/SIGUSR1/Ctrl-C: workers end their segment
            global_step = counter.get_obj()[0]  # for logging, without the lock a killed worker may hold
            for msg in msgs:
                if msg[1] == "exit":
                    exited.add(msg[0])
                elif msg[1] == "update":
                    _, _, losses, worker_sps[msg[0]], lr = msg
                    for key, value in zip(["losses/policy_loss", "losses/value_loss", "losses/entropy",
                                           "charts/learning_rate"], losses + [lr]):
                        writer.add_scalar(key, value, global_step)
                else:
                    _, ret, length, step, ended_at = msg  # when the worker saw the episode end (the parent may lag)
                    recent.append(ret)
                    writer.add_scalar("charts/episodic_return", ret, step)
                    writer.add_scalar("charts/episodic_length", length, step)
                    if threshold is not None and progress["time_to_threshold_s"] is None and len(recent) == 20 \
                            and np.mean(recent) >= threshold:
                        progress["time_to_threshold_s"] = progress["elapsed_s"] + ended_at - PROCESS_START
                        progress["train_time_to_threshold_s"] = progress["train_time_s"] + ended_at - train_start
                        progress["threshold_step"] = step
            if args.checkpoint_every and counter.get_obj()[1] - last_ckpt >= args.checkpoint_every:
                last_ckpt = counter.get_obj()[1]
                checkpoint()
            if time.time() - last_print > 2.0:
                last_print = time.time()
                sps = (global_step - progress["global_step"]) / (time.time() - train_start)
                for key, value in {"charts/SPS": sps, **{f"stats/worker{i}_sps": v for i, v in worker_sps.items()}}.items():
                    writer.add_scalar(key, value, global_step)
                mean = f"{np.mean(recent):.1f}" if recent else "n/a"
                print(f"global_step={global_step} SPS={sps:.0f} return(last {len(recent)})={mean}", flush=True)
    finally:
        for p in workers:
            p.kill()  # a no-op for a worker that ended on its own
            p.join()
    train_time = progress["train_time_s"] + time.time() - train_start
    if exit_code == 0 and signals["signal"]:  # a checkpoint; a run that had reached its steps goes on to its summary
        checkpoint()
        print(f"signal received: checkpoint of update {counter[1]} written to {ckpt_path}; "
              "rerun with --resume to continue", flush=True)
    if exit_code == 0 and counter[0] >= args.total_timesteps:
        video_dir = os.path.join(run_dir, "videos") if args.capture_video else None
        eval_returns = evaluate(agent, args.env_id, args.eval_episodes, args.seed + 10**6, video_dir)
        for i, r in enumerate(eval_returns):
            writer.add_scalar("eval/episodic_return", r, i)
        summary = {"algo": "a3c", "env_id": args.env_id, "seed": args.seed, "world_size": 1, "num_workers": args.num_workers,
                   "global_step": counter[0], "updates": counter[1], "train_time_s": train_time,
                   "wall_time_s": progress["elapsed_s"] + time.time() - PROCESS_START, "sps": counter[0] / train_time,
                   "eval_return_mean": float(np.mean(eval_returns)), "eval_return_std": float(np.std(eval_returns)),
                   "train_return_last20": float(np.mean(recent)) if recent else None,
                   **{k: progress[k] for k in ["time_to_threshold_s", "train_time_to_threshold_s", "threshold_step"]},
                   "reward_threshold": threshold}
        with open(os.path.join(run_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        if args.save_model:
            save_checkpoint(os.path.join(run_dir, "model.pt"), {k: v.clone() for k, v in agent.state_dict().items()})
        print(f"eval return {summary['eval_return_mean']:.1f} +- {summary['eval_return_std']:.1f}; time to threshold: "
              f"{summary['time_to_threshold_s']}; summary in {run_dir}/summary.json", flush=True)
    writer.close()
    if args.track:
        wandb.finish()
    return exit_code


if __name__ == "__main__":
    sys.exit(main(tyro.cli(Args)))

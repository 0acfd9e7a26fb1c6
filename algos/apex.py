# docs: docs/apex.md | paper: https://arxiv.org/abs/1803.00933
"""Ape-X DQN: Distributed Prioritized Experience Replay (Horgan et al., 2018).

Actors step envpool batches with a local Q-network, each env with its own epsilon_i, form n-step transitions with
initial priorities and hand them over in blocks (shared memory, bounded index queues). The learner keeps a central
proportional prioritized replay, trains a dueling double-Q network on it and publishes parameters. Under torchrun,
rank 0 hosts learner and replay; every other rank is one more actor shipping blocks through torch.distributed.

  python algos/apex.py                                              # learner + actors on one machine, CartPole-v1
  torchrun --standalone --nproc_per_node=3 algos/apex.py            # rank 0 learner + replay, ranks 1-2 actors
"""
import ctypes
import json
import math
import os
import queue
import random
import signal
import sys
import threading
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
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
import tyro  # noqa: E402


@dataclass
class Args:
    # --- common to every distrl file ---
    exp_name: str = "apex"  # the name of this experiment (part of the run name)
    seed: int = 1  # seed of the experiment
    torch_deterministic: bool = True  # deterministic CUDA kernels (the CPU kernels used here are anyway)
    cuda: bool = True  # run the learner on CUDA when it is available (actors always run on the CPU)
    track: bool = False  # log to Weights & Biases as well as TensorBoard
    wandb_project_name: str = "distrl"  # the wandb project name
    wandb_entity: Optional[str] = None  # the wandb entity (team)
    capture_video: bool = False  # kept for scripts that pass it to every file; Ape-X saves no frames
    save_model: bool = False  # write the final weights (state_dict) to runs/<run_name>/model.pt
    env_id: str = "CartPole-v1"  # the envpool environment id
    total_timesteps: int = 400_000  # total environment steps taken by all actors
    eval_episodes: int = 10  # episodes of the final, greedy policy to evaluate at the end
    # --- algorithm ---
    mask_velocity: bool = False  # CartPole-v1 with the velocities removed (observation: cart position, pole angle)
    network: Literal["auto", "mlp", "nature"] = "auto"  # torso: 2-layer ReLU MLP or Nature-CNN (auto: by observation)
    hidden_size: int = 128  # width of the MLP torso's two layers (vector observations)
    learning_rate: float = 1e-3  # Adam's learning rate (paper: centered RMSProp, 0.00025 / 4; see docs/apex.md)
    anneal_lr: bool = True  # anneal the learning rate linearly to zero over total_timesteps (see docs/apex.md)
    adam_eps: float = 1e-5  # Adam's epsilon
    batch_size: int = 256  # transitions per learner update (paper: 512)
    buffer_size: int = 400_000  # replay capacity in transitions; the oldest are evicted first (paper: 2M)
    gamma: float = 0.99  # discount factor
    n_step: int = 3  # n of the n-step returns (paper: 3)
    alpha: float = 0.6  # priority exponent: P(i) = p_i^alpha / sum_k p_k^alpha (paper: 0.6)
    beta: float = 0.4  # importance-sampling exponent at the start, annealed linearly to 1 (paper: 0.4)
    priority_eps: float = 1e-6  # added to |delta| so that no transition has priority 0
    epsilon: float = 0.4  # epsilon_i = epsilon^(1 + epsilon_alpha i / (N - 1)) over the N environments (paper: 0.4)
    epsilon_alpha: float = 7.0  # the exponent's spread alpha of the epsilon_i schedule (paper: 7)
    target_network_frequency: int = 250  # learner updates between copies to the target network (paper: 2500)
    max_grad_norm: float = 10.0  # global gradient-norm clip (paper: 40)
    learning_starts: int = 1000  # environment steps before the learner starts (per run segment)
    steps_per_update: float = 8.0  # environment steps per learner update: the rate limit between actors and learner
    num_envs: int = 16  # environments stepped by each actor (each with its own epsilon_i)
    block_length: int = 8  # steps of an actor's batch per block sent to the replay (block_length x num_envs transitions)
    actor_update_interval: int = 32  # steps of an actor's batch between parameter refreshes (paper: 400 frames)
    threshold_epsilon: float = 0.01
    """only envs with epsilon_i at most this (or the least) count in train_return_last20 and time_to_threshold"""
    torch_threads: int = 0  # learner's torch threads (0: 1; actors always use 1)
    env_threads: int = 0  # envpool threads per actor (0: 1)
    # --- distributed ---
    num_actors: int = 0  # actor processes on rank 0 (0: one per available CPU but one, at least 1)
    num_buffers: int = 0  # shared block buffers (0: 2 per actor, counting remote ranks, plus 2)
    deterministic: bool = False
    """blocks inserted in a fixed order (by round, then actor), actors act with the parameters of the round before
    last: bitwise reproducible on CPU, at the price of actors waiting"""
    checkpoint_every: int = 0  # write runs/<run_name>/checkpoint.pt every this many learner updates (0: on signals only)
    resume: bool = False  # continue from runs/<run_name>/checkpoint.pt when it exists (the replay is refilled)
    # --- computed at run time ---
    world_size: int = field(default=1, init=False)
    rank: int = field(default=0, init=False)
    local_rank: int = field(default=0, init=False)
    total_actors: int = field(default=0, init=False)
    segment: int = field(default=0, init=False)
    run_name: str = field(default="", init=False)


def fail(arg: str, message: str) -> None:
    """Bad argument: one line naming it on stderr, exit code 2 (as argparse does)."""
    print(f"{os.path.basename(sys.argv[0])}: error: --{arg.replace('_', '-')}: {message}", file=sys.stderr)
    sys.exit(2)


def validate(args: Args) -> None:
    if not 0 <= args.seed < 2**30:  # env seeds add offsets to it and must stay 32-bit
        fail("seed", f"must be in [0, 2**30), got {args.seed}")
    for name in ["total_timesteps", "eval_episodes", "learning_rate", "adam_eps", "batch_size", "buffer_size", "n_step",
                 "priority_eps", "target_network_frequency", "steps_per_update", "num_envs", "block_length", "hidden_size",
                 "actor_update_interval", "max_grad_norm"]:
        if getattr(args, name) <= 0:
            fail(name, f"must be positive, got {getattr(args, name)}")
    for name in ["torch_threads", "env_threads", "num_actors", "num_buffers", "checkpoint_every", "learning_starts",
                 "alpha", "epsilon_alpha", "threshold_epsilon"]:
        if getattr(args, name) < 0:
            fail(name, f"must not be negative, got {getattr(args, name)}")
    for name in ["gamma", "beta", "epsilon"]:
        if not 0.0 < getattr(args, name) <= 1.0:
            fail(name, f"must be in (0, 1], got {getattr(args, name)}")
    if args.batch_size > args.buffer_size:
        fail("batch_size", f"{args.batch_size} exceeds --buffer-size {args.buffer_size}")
    if args.block_length * args.num_envs > args.buffer_size:
        fail("buffer_size", f"{args.buffer_size} is smaller than one block ({args.block_length} x {args.num_envs})")
    if args.num_buffers and args.num_buffers < 2 * (default_num_actors(args) + int(os.environ.get("WORLD_SIZE", "1")) - 1):
        fail("num_buffers", f"{args.num_buffers} is too few: every actor needs two")
    if args.env_id not in envpool.list_all_envs():
        fail("env_id", f"'{args.env_id}' is not an envpool environment")
    spec = envpool.make_spec(args.env_id)
    obs_space, act_space = spec.observation_space, spec.action_space
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) not in (1, 3):
        fail("env_id", f"'{args.env_id}' has observation space {obs_space}; Ape-X here needs a flat or image Box")
    if not isinstance(act_space, gym.spaces.Discrete):
        fail("env_id", f"'{args.env_id}' has action space {act_space}; DQN needs Discrete actions")
    if args.mask_velocity and args.env_id != "CartPole-v1":
        fail("mask_velocity", f"is for CartPole-v1, not '{args.env_id}'")
    if args.network != "auto" and (args.network == "nature") != (len(obs_space.shape) == 3):
        fail("network", f"'{args.network}' does not fit observations of shape {obs_space.shape} ('{args.env_id}')")


# ----------------------------------------------------------------------------------------------- environment
def make_env(env_id: str, num_envs: int, seed: int, num_threads: int = 1, **kwargs):
    """An envpool batch. Env i of the batch is seeded with seed + i. Atari gets DeepMind preprocessing."""
    extra = {}
    if len(envpool.make_spec(env_id).observation_space.shape) == 3:  # Atari: 84x84 grey, 4 stacked, skip 4
        extra = dict(episodic_life=True, reward_clip=True, noop_max=30, repeat_action_probability=0.0)
    extra.update(kwargs)
    return envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, num_threads=num_threads,
                        thread_affinity_offset=-1, **extra)


def observe(obs: np.ndarray, mask_velocity: bool) -> np.ndarray:
    """What the network sees: with --mask-velocity, CartPole's cart position and pole angle (columns 0 and 2) only."""
    return obs[..., [0, 2]] if mask_velocity else obs


def obs_shape(args: Args, spec) -> tuple:
    return (2,) if args.mask_velocity else spec.observation_space.shape


def env_seed(args: Args, actor: int) -> int:
    """Seed of env 0 of `actor` (local ones, then one per remote rank) in run segment args.segment (0, +1 per resume)."""
    return args.seed + (args.segment * args.total_actors + actor) * args.num_envs


# ----------------------------------------------------------------------------------------------- networks
def layer_init(layer: nn.Module, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Module:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


class QNetwork(nn.Module):
    """Dueling architecture (Wang et al., 2016): Q(s, a) = V(s) + A(s, a) - mean_a' A(s, a') over a torso: a 2-layer
    ReLU MLP for vectors, the Nature CNN for images (uint8 frames divided by 255 here: the replay keeps uint8)."""

    def __init__(self, obs_shape, num_actions: int, network: str = "auto", hidden: int = 128):
        super().__init__()
        self.image = len(obs_shape) == 3
        if (network == "auto" and self.image) or network == "nature":
            self.torso = nn.Sequential(
                layer_init(nn.Conv2d(obs_shape[0], 32, 8, stride=4)), nn.ReLU(),
                layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
                layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(), nn.Flatten())
            self.value = nn.Sequential(layer_init(nn.Linear(3136, 512)), nn.ReLU(), layer_init(nn.Linear(512, 1), 1.0))
            self.advantage = nn.Sequential(layer_init(nn.Linear(3136, 512)), nn.ReLU(),
                                           layer_init(nn.Linear(512, num_actions), 1.0))
        else:
            self.torso = nn.Sequential(layer_init(nn.Linear(int(np.prod(obs_shape)), hidden)), nn.ReLU(),
                                       layer_init(nn.Linear(hidden, hidden)), nn.ReLU())
            self.value, self.advantage = layer_init(nn.Linear(hidden, 1), 1.0), layer_init(nn.Linear(hidden, num_actions), 1.0)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float()
        h = self.torso(x / 255.0 if self.image else x)
        adv = self.advantage(h)
        return self.value(h) + adv - adv.mean(-1, keepdim=True)


# ----------------------------------------------------------------------------------------------- algorithm
def epsilons(epsilon: float, alpha: float, n: int) -> np.ndarray:
    """The paper's exploration rates epsilon_i = epsilon^(1 + alpha i / (N - 1)), i = 0..N-1 (N = 1: epsilon)."""
    return epsilon ** (1.0 + alpha * np.arange(n) / max(n - 1, 1))


def n_step_targets(rewards, terms, dones, gamma: float, n: int):
    """n-step returns for the windows starting at s = 0..L-n of [L, N] steps (vectorized over windows and envs):
      m_s = min(n, steps up to and including the first episode end at or after s)
      G_s = sum_{k < m_s} gamma^k r_{s+k},  discount_s = gamma^m_s (1 - terminated_{s+m_s-1}),  bootstrap at x_{s+m_s}

    A truncation bootstraps (from the final observation envpool returns as x_{s+m}), a termination does not.
    Returns G, discount and the bootstrap index s + m_s, each [L-n+1, N]."""
    L = rewards.shape[0]
    W = L - n + 1
    G, alive, disc = np.zeros((W,) + rewards.shape[1:]), np.ones((W,) + rewards.shape[1:]), np.ones((W,) + rewards.shape[1:])
    m, term_end = np.zeros(G.shape, dtype=np.int64), np.zeros(G.shape)
    for k in range(n):
        G += alive * disc * rewards[k:k + W]
        m += alive.astype(np.int64)
        term_end = np.where(alive > 0, terms[k:k + W], term_end)
        disc = np.where(alive > 0, disc * gamma, disc)
        alive = alive * (1.0 - dones[k:k + W])
    return G, disc * (1.0 - term_end), np.arange(W).reshape((W,) + (1,) * (rewards.ndim - 1)) + m


def td_errors(q_net: nn.Module, target_net: nn.Module, obs, actions, returns, discounts, next_obs):
    """Double Q-learning n-step TD errors (van Hasselt et al., 2016): the online network picks the bootstrap action,
    the target network values it: delta = G + discount Q_target(x', argmax_a Q(x', a)) - Q(x, a). Returns
    (delta, Q(x, a)); delta carries no gradient through the target."""
    q = q_net(torch.cat([obs, next_obs]))
    q_sa = q[:obs.shape[0]].gather(1, actions.unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        best = q[obs.shape[0]:].argmax(1, keepdim=True)
        target = returns + discounts * target_net(next_obs).gather(1, best).squeeze(1)
    return target - q_sa, q_sa


def apex_loss(q_net: nn.Module, target_net: nn.Module, batch: dict, weights: torch.Tensor):
    """Importance-weighted Huber loss of the double-Q n-step TD errors; returns (loss, |delta|) for the priorities."""
    delta, _ = td_errors(q_net, target_net, batch["obs"], batch["actions"], batch["returns"], batch["discounts"],
                         batch["next_obs"])
    huber = torch.where(delta.abs() < 1.0, 0.5 * delta ** 2, delta.abs() - 0.5)
    return (weights * huber).mean(), delta.detach().abs()


class SumTree:
    """Proportional prioritization's structure (Schaul et al., 2016): binary trees over `capacity` leaves (rounded up
    to a power of two) whose inner nodes hold the sum (and, in a second tree, the min) of their children: sampling
    and updates in O(log capacity), vectorized over batches. Unwritten leaves: 0 (sum tree), +inf (min tree)."""

    def __init__(self, capacity: int):
        self.size = 1 << max(1, (capacity - 1).bit_length())
        self.sum, self.min = np.zeros(2 * self.size), np.full(2 * self.size, np.inf)

    def update(self, leaves: np.ndarray, priorities: np.ndarray) -> None:
        """Set the priorities (already raised to alpha) of `leaves`; the last one wins for a repeated leaf."""
        nodes = np.asarray(leaves) + self.size
        self.sum[nodes], self.min[nodes] = priorities, priorities
        nodes = np.unique(nodes // 2)  # sorted, so each level's parents are deduplicated by comparing neighbours
        while True:
            self.sum[nodes] = self.sum[2 * nodes] + self.sum[2 * nodes + 1]
            self.min[nodes] = np.minimum(self.min[2 * nodes], self.min[2 * nodes + 1])
            if nodes[0] == 1:
                return
            nodes = nodes // 2
            nodes = nodes[np.concatenate([[True], nodes[1:] != nodes[:-1]])]

    def total(self) -> float:
        return float(self.sum[1])

    def find(self, values: np.ndarray) -> np.ndarray:
        """The leaves whose prefix-sum intervals contain `values` (each in [0, total)): descend left when the value
        is below the left child's sum, else subtract it and descend right."""
        nodes, values = np.ones(len(values), dtype=np.int64), np.array(values, dtype=np.float64)
        while nodes[0] < self.size:
            left = self.sum[2 * nodes]
            right = values >= left
            values -= left * right
            nodes = 2 * nodes + right
        return nodes - self.size


class PrioritizedReplay:
    """Ape-X's central replay: a ring of `capacity` transitions (FIFO eviction), trees over their p_i^alpha. Sampling
    is stratified (one draw in each of batch_size equal slices of the total); w_i = (N P(i))^-beta / max_j w_j.
    `fields`: one transition's tensors (shape and dtype of each field)."""

    def __init__(self, capacity: int, fields: dict, alpha: float, eps: float, device):
        self.capacity, self.alpha, self.eps, self.pos, self.size = capacity, alpha, eps, 0, 0
        self.tree = SumTree(capacity)
        self.data = {k: torch.zeros((capacity,) + v.shape, dtype=v.dtype) for k, v in fields.items()}
        self.device = device

    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.data.values()) + self.tree.sum.nbytes + self.tree.min.nbytes

    def add(self, transitions: dict, abs_td: torch.Tensor) -> None:
        k = abs_td.shape[0]
        if k == 0:  # a block whose windows all start on reset steps
            return
        idx = (self.pos + np.arange(k)) % self.capacity
        t = torch.from_numpy(idx)
        for key, value in self.data.items():
            value[t] = transitions[key]
        self.tree.update(idx, (abs_td.double().numpy() + self.eps) ** self.alpha)
        self.pos, self.size = (self.pos + k) % self.capacity, min(self.size + k, self.capacity)

    def sample(self, batch_size: int, beta: float, rng: np.random.Generator):
        total = self.tree.total()
        values = (np.arange(batch_size) + rng.random(batch_size)) * (total / batch_size)
        idx = np.minimum(self.tree.find(np.minimum(values, np.nextafter(total, 0))), self.size - 1)
        weights = (self.tree.sum[idx + self.tree.size] / self.tree.min[1]) ** (-beta)
        t = torch.from_numpy(idx)
        batch = {key: value[t].to(self.device, non_blocking=True) for key, value in self.data.items()}
        return idx, batch, torch.as_tensor(weights, dtype=torch.float32, device=self.device)

    def update_priorities(self, idx: np.ndarray, abs_td: torch.Tensor) -> None:
        self.tree.update(idx, (abs_td.double().cpu().numpy() + self.eps) ** self.alpha)


def adam_step(params, grad: torch.Tensor, state: dict, lr: float, betas=(0.9, 0.999), eps: float = 1e-5) -> None:
    """Adam on the flat gradient, bitwise torch.optim.Adam (tested); written out because constructing a torch.optim
    optimizer imports torch._dynamo (over a second of start-up)."""
    b1, b2 = betas
    state["step"] += 1
    state["m"].lerp_(grad, 1 - b1)
    state["v"].mul_(b2).addcmul_(grad, grad, value=1 - b2)
    denom = (state["v"].sqrt() / math.sqrt(1 - b2 ** state["step"])).add_(eps)
    apply_update(params, (lr / (1 - b1 ** state["step"])) * state["m"] / denom)


def apply_update(params, update: torch.Tensor) -> None:
    with torch.no_grad():
        offset = 0
        for p in params:
            p.sub_(update[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def optimizer_init(params) -> dict:
    n = sum(p.numel() for p in params)
    return {"step": 0, "m": torch.zeros(n, device=params[0].device), "v": torch.zeros(n, device=params[0].device)}


def clip_grad(grad: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Scale the flat gradient to a global norm of at most max_norm (as torch.nn.utils.clip_grad_norm_)."""
    return grad.mul_(torch.clamp(max_norm / (grad.norm() + 1e-6), max=1.0))


# ----------------------------------------------------------------------------------------------- roles
TRANSITION_KEYS = ("obs", "next_obs", "actions", "returns", "discounts")


def block_buffers(args: Args, spec, num_buffers: int, shared: bool = True) -> dict:
    """Preallocated blocks [K, ...]: per transition (T x N) x, action, n-step return, discount, x', the actor's |delta|,
    valid (0 where a window starts on envpool's reset step); per step collected (an actor's first block has n - 1
    more) the return and length of an episode that ended there (NaN elsewhere); version, actor, sequence."""
    T, N, L, shape = args.block_length, args.num_envs, args.block_length + args.n_step - 1, obs_shape(args, spec)
    dtype = torch.uint8 if len(shape) == 3 else torch.float32
    b = {k: torch.zeros((num_buffers, T * N) + shape, dtype=dtype) for k in ("obs", "next_obs")}
    b.update({k: torch.zeros((num_buffers, T * N)) for k in ("returns", "discounts", "priorities", "valid")})
    b.update(actions=torch.zeros((num_buffers, T * N), dtype=torch.long), ep_return=torch.zeros((num_buffers, L, N)),
             ep_length=torch.zeros((num_buffers, L, N)), meta=torch.zeros((num_buffers, 3), dtype=torch.long))
    return {k: v.share_memory_() for k, v in b.items()} if shared else b


class ParameterStore:
    """The learner's parameters in shared memory, double-buffered (version v in slot v % 2); a sequence counter per
    slot (odd while written) lets actors copy without a lock, so an actor killed mid-copy blocks no one."""

    def __init__(self, num_params: int):
        self.slots = torch.zeros(2, num_params).share_memory_()
        self.seq = torch.zeros(2, dtype=torch.long).share_memory_()
        self.slot_version = torch.full((2,), -1, dtype=torch.long).share_memory_()
        self.version = torch.full((1,), -1, dtype=torch.long).share_memory_()

    def publish(self, flat: torch.Tensor, version: int) -> None:
        s = version % 2
        self.seq[s] += 1
        self.slots[s].copy_(flat)
        self.slot_version[s] = version
        self.seq[s] += 1
        self.version[0] = version

    def read(self, out: torch.Tensor, version: Optional[int] = None, give_up=lambda: False) -> int:
        """Copy version `version` (None: the latest) into out; waits until it is published (-1 if give_up())."""
        while True:
            v = int(self.version[0]) if version is None else version
            if v < 0 or int(self.version[0]) < v:
                if give_up():
                    return -1
                time.sleep(0.0005)
                continue
            s = v % 2
            before = int(self.seq[s])
            if before % 2 == 0 and int(self.slot_version[s]) == v:
                out.copy_(self.slots[s])
                if int(self.seq[s]) == before:
                    return v
            if version is not None and int(self.version[0]) > v + 1:
                raise RuntimeError(f"parameter version {v} was overwritten before it was read")


def flat_params(net: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()]).cpu()


def load_flat(net: nn.Module, flat: torch.Tensor) -> None:
    torch.nn.utils.vector_to_parameters(flat, net.parameters())


class LocalLink:
    """A local actor's way to the learner: shared block buffers, index queues, the parameter store."""

    def __init__(self, buffers: dict, store: ParameterStore, free_q, full_q):
        self.buffers, self.store, self.free_q, self.full_q, self.k = buffers, store, free_q, full_q, None
        self.send, self.latest, self.params = lambda: full_q.put(self.k), lambda: int(store.version[0]), store.read

    def block(self) -> dict:  # a free buffer to fill (waits for one: the backpressure of the rate limit)
        self.k = self.free_q.get()
        return {key: value[self.k] for key, value in self.buffers.items()}


class RemoteLink:
    """A remote actor's (rank > 0) way to the learner: its block goes to rank 0 through torch.distributed (a gloo
    pair group); rank 0's bridge answers with [version] and parameters: those of the version the deterministic
    schedule asks for, else the latest; version -1 means stop."""

    def __init__(self, args: Args, spec, group, num_params: int):
        self.buf = {k: v[0] for k, v in block_buffers(args, spec, 1, shared=False).items()}
        self.group, self.version, self.flat = group, torch.zeros(1, dtype=torch.long), torch.zeros(num_params)
        self.block, self.latest = lambda: self.buf, lambda: int(self.version[0])
        self.send(receive_only=True)

    def send(self, receive_only: bool = False) -> None:
        for key in [] if receive_only else sorted(self.buf):
            dist.send(self.buf[key], 0, group=self.group)
        dist.recv(self.version, 0, group=self.group)
        dist.recv(self.flat, 0, group=self.group)

    def params(self, out: torch.Tensor, version: Optional[int] = None) -> int:
        out.copy_(self.flat)
        return int(self.version[0])


def actor_loop(actor: int, args: Args, spec, link, local: bool = True) -> None:
    """One actor: step an envpool batch, env j epsilon_i-greedy (i = actor * num_envs + j) with a local Q-network;
    send blocks of block_length windows' n-step transitions with their initial priorities |delta| (local network).
    Parameters: the latest every actor_update_interval steps (remote: with each block's reply); deterministic
    mode: block s uses version max(s - 1, 0), published once the learner has taken round s - 2."""
    if local:  # die with the learner, whatever kills it (PR_SET_PDEATHSIG); the learner turns signals into a checkpoint
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    torch.set_num_threads(1)
    T, n, N, A = args.block_length, args.n_step, args.num_envs, spec.action_space.n
    L = T + n - 1
    seed = env_seed(args, actor)
    envs, rng = make_env(args.env_id, N, seed, args.env_threads or 1), np.random.default_rng(seed)
    eps = epsilons(args.epsilon, args.epsilon_alpha, args.total_actors * N)[actor * N:(actor + 1) * N]
    net = QNetwork(obs_shape(args, spec), A, args.network, args.hidden_size)
    flat = flat_params(net)
    obs = observe(envs.reset()[0], args.mask_velocity)
    hist = {"obs": np.zeros((L + 1,) + obs.shape, dtype=obs.dtype), "actions": np.zeros((L, N), dtype=np.int64),
            "rewards": np.zeros((L, N)), "terms": np.zeros((L, N)), "dones": np.zeros((L, N)), "valid": np.zeros((L, N))}
    valid, fill = np.ones(N), 0  # valid: 0 while x_t is a final observation (envpool's reset step comes next)
    ep_return, ep_length, prev_done = np.zeros(N), np.zeros(N), np.zeros(N, dtype=bool)
    loaded, sequence, since = -1, 0, 0
    while True:
        if args.deterministic:
            wanted = max(sequence - 1, 0)
            if wanted != loaded:
                loaded = link.params(flat, wanted)
                if loaded < 0:
                    return
                load_flat(net, flat)
        block = link.block()
        if not local and link.latest() < 0:
            return
        block["ep_return"].fill_(float("nan"))
        for j in range(L - fill):
            if not args.deterministic and (loaded < 0 or since >= args.actor_update_interval) and link.latest() != loaded:
                loaded, since = link.params(flat), 0
                load_flat(net, flat)
            since += 1
            hist["obs"][fill] = obs
            with torch.no_grad():
                greedy = net(torch.as_tensor(obs)).argmax(-1).numpy()
            action = np.where(rng.random(N) < eps, rng.integers(A, size=N), greedy)
            o, r, term, trunc, info = envs.step(action)
            o, done = observe(o, args.mask_velocity), term | trunc
            # Episode statistics (Atari: raw rewards and real game over); the reset step after an end adds nothing.
            ep_return += info.get("reward", r) * ~prev_done
            ep_length += ~prev_done
            ended = (info["terminated"].astype(bool) | trunc) if "terminated" in info else done
            block["ep_return"][j] = torch.as_tensor(np.where(ended, ep_return, np.nan))
            block["ep_length"][j] = torch.as_tensor(ep_length)
            ep_return[ended], ep_length[ended], prev_done = 0.0, 0, done
            for key, value in (("actions", action), ("rewards", r), ("terms", term), ("dones", done), ("valid", valid)):
                hist[key][fill] = value
            obs, valid, fill = o, (~done).astype(np.float64), fill + 1
        hist["obs"][L] = obs
        G, disc, boot = n_step_targets(hist["rewards"], hist["terms"], hist["dones"], args.gamma, n)
        x, x_next = hist["obs"][:T], hist["obs"][boot, np.arange(N)]
        out = {"obs": x, "next_obs": x_next, "actions": hist["actions"][:T], "returns": G, "discounts": disc}
        out = {k: torch.as_tensor(v).reshape((T * N,) + v.shape[2:]) for k, v in out.items()}
        with torch.no_grad():  # initial priorities, from the actor's own network (online and target alike)
            delta, _ = td_errors(net, net, out["obs"], out["actions"], out["returns"].float(), out["discounts"].float(),
                                 out["next_obs"])
        for k, v in out.items():
            block[k].copy_(v)
        block["priorities"].copy_(delta.abs())
        block["valid"].copy_(torch.as_tensor(hist["valid"][:T]).reshape(-1))
        block["meta"].copy_(torch.tensor([loaded, actor, sequence]))
        link.send()
        sequence += 1
        for k in ("actions", "rewards", "terms", "dones", "valid"):  # the last n - 1 steps start the next windows
            hist[k][:n - 1] = hist[k][T:]
        hist["obs"][:n] = hist["obs"][T:]
        fill = n - 1


def remote_bridge(actor: int, peer: int, group, args: Args, buffers: dict, store: ParameterStore, free_q, full_q,
                  control: dict) -> None:
    """Rank 0's stand-in for the remote actor on rank `peer`: send it parameters, receive each of its blocks into a
    free shared buffer and queue it like a local actor's, answer with the parameters for its next block (or stop)."""
    flat, version, scratch = torch.zeros_like(store.slots[0]), torch.zeros(1, dtype=torch.long), None
    stopped = lambda: control.get("stop", False)  # noqa: E731
    try:
        sequence = 0
        while True:
            wanted = max(sequence - 1, 0) if args.deterministic else None
            version[0] = -1 if stopped() else store.read(flat, wanted, give_up=stopped)
            dist.send(version, peer, group=group)
            dist.send(flat, peer, group=group)
            if version[0] < 0:
                return
            k = None
            while k is None and not stopped():
                try:
                    k = free_q.get(timeout=0.2)
                except queue.Empty:
                    pass
            # Stopping: take the block the actor is sending into a scratch copy, then answer "stop".
            scratch = scratch or {key: value[0].clone() for key, value in buffers.items()}
            target = scratch if k is None else {key: value[k] for key, value in buffers.items()}
            for key in sorted(target):
                dist.recv(target[key], peer, group=group)
            if k is not None:
                full_q.put(k)
            sequence += 1
    except Exception as e:  # noqa: BLE001 - any failure of the link ends the job
        control.setdefault("error", f"remote actor {actor} (rank {peer}): {e!r}")


class ActorDied(RuntimeError):
    """An actor (or the link to a remote one) is gone: the job ends non-zero."""


def evaluate(net: QNetwork, env_id: str, episodes: int, seed: int, device, mask_velocity: bool = False):
    """Returns of `episodes` episodes of the greedy policy, one env per episode (no bias to short episodes)."""
    envs = make_env(env_id, episodes, seed, **(dict(episodic_life=False, reward_clip=False) if net.image else {}))
    obs, _ = envs.reset()
    returns, done = np.zeros(episodes), np.zeros(episodes, dtype=bool)
    while not done.all():
        with torch.no_grad():
            action = net(torch.as_tensor(observe(obs, mask_velocity), device=device)).argmax(-1).cpu().numpy()
        obs, r, term, trunc, info = envs.step(action)
        returns += info.get("reward", r) * ~done
        done |= (info["terminated"].astype(bool) if "terminated" in info else term) | trunc
    envs.close()
    return returns


def save_checkpoint(path: str, payload: dict) -> None:  # atomic: a temporary file beside the target, renamed over it
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save(payload, tmp)
    os.replace(tmp, path)


def available_cpus() -> int:
    """CPUs this process may use (its affinity mask, which taskset, SLURM and containers set; not the machine's
    core count), shared among the ranks on this node (torchrun's LOCAL_WORLD_SIZE)."""
    return max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))  # Linux, as /proc


def default_num_actors(args: Args) -> int:
    """--num-actors 0: one actor per available CPU but one, which the learner needs more (at least one actor)."""
    return args.num_actors or max(1, available_cpus() - 1)


def setup_distributed(args: Args):
    """torchrun sets RANK/LOCAL_RANK/WORLD_SIZE. Rank 0 hosts learner, replay and its actors; rank r > 0 is one
    remote actor linked to rank 0 by a gloo pair group (CPU tensors). Alone: world size 1."""
    args.world_size = int(os.environ.get("WORLD_SIZE", "1"))
    args.rank, args.local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = args.cuda and torch.cuda.is_available() and args.rank == 0
    device = torch.device(f"cuda:{args.local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    groups = {}
    if args.world_size > 1:
        dist.init_process_group("gloo", init_method="env://")
        groups = {r: dist.new_group([0, r]) for r in range(1, args.world_size)}  # every rank creates every group
    return device, groups


def main(args: Args) -> int:
    warnings.filterwarnings("ignore", message=".*precision lowered by casting.*")  # envpool's spaces
    validate(args)
    device, groups = setup_distributed(args)
    rank, world = args.rank, args.world_size
    args.num_actors = default_num_actors(args)
    args.run_name = f"{args.env_id}__{args.exp_name}__{args.seed}"
    run_dir, ckpt_path = os.path.join("runs", args.run_name), os.path.join("runs", args.run_name, "checkpoint.pt")
    torch.set_num_threads(args.torch_threads or 1)
    random.seed(args.seed), np.random.seed(args.seed), torch.manual_seed(args.seed)
    spec = envpool.make_spec(args.env_id)
    A = spec.action_space.n
    ckpt = torch.load(ckpt_path, map_location=device, weights_only=True) \
        if args.resume and rank == 0 and os.path.exists(ckpt_path) else None
    shared = torch.tensor([ckpt["segment"] + 1 if ckpt else 0, args.num_actors])
    if world > 1:  # rank 0's segment and actor count decide every actor's index, env seeds and epsilon_i
        dist.broadcast(shared, 0)
    args.segment, args.num_actors = shared.tolist()
    args.total_actors = args.num_actors + world - 1
    num_buffers = args.num_buffers or 2 * args.total_actors + 2
    num_params = sum(p.numel() for p in QNetwork(obs_shape(args, spec), A, args.network, args.hidden_size).parameters())
    if rank > 0:  # a remote actor: its index follows the learner's local actors
        actor_loop(args.num_actors + rank - 1, args, spec, RemoteLink(args, spec, groups[rank], num_params), local=False)
        dist.barrier()
        dist.destroy_process_group()
        return 0
    if device.type == "cuda":  # CPU ops used here are deterministic already; this call costs ~1 s of imports
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS refuses deterministic mode without it
        torch.use_deterministic_algorithms(args.torch_deterministic)
        torch.backends.cudnn.deterministic = args.torch_deterministic

    threshold = spec.reward_threshold  # None for envs without one
    q_net = QNetwork(obs_shape(args, spec), A, args.network, args.hidden_size).to(device)
    target_net = QNetwork(obs_shape(args, spec), A, args.network, args.hidden_size).to(device)
    params = list(q_net.parameters())
    opt_state = optimizer_init(params)
    global_step, updates, wall_before, elapsed_before, time_to_threshold, threshold_step = 0, 0, 0.0, 0.0, None, None
    recent = deque(maxlen=20)
    if ckpt:
        q_net.load_state_dict(ckpt["model"])
        opt_state, elapsed_before, wall_before = ckpt["optimizer"], ckpt["elapsed_s"], ckpt["wall_time_s"]
        global_step, updates, time_to_threshold = ckpt["global_step"], ckpt["updates"], ckpt["time_to_threshold_s"]
        threshold_step = ckpt["threshold_step"]
        recent.extend(ckpt["recent_returns"])
    target_net.load_state_dict(ckpt["target"] if ckpt else q_net.state_dict())
    eps_all = torch.as_tensor(epsilons(args.epsilon, args.epsilon_alpha, args.total_actors * args.num_envs))
    eps_all = eps_all.view(args.total_actors, -1)
    counted_eps = max(args.threshold_epsilon, eps_all.min().item())  # episodes of these envs count for the threshold

    # Shared memory and actors first (fork before the learner computes anything), then the bridges and logging.
    buffers = block_buffers(args, spec, num_buffers)
    store = ParameterStore(num_params)
    store.publish(flat_params(q_net), 0)
    versions = {0: updates}  # parameter version -> learner updates behind it (for the policy lag)
    ctx = mp.get_context("fork")
    free_q, full_q = ctx.Queue(maxsize=num_buffers), ctx.Queue(maxsize=num_buffers)
    for k in range(num_buffers):
        free_q.put(k)
    actors = [ctx.Process(target=actor_loop, args=(i, args, spec, LocalLink(buffers, store, free_q, full_q)), daemon=True)
              for i in range(args.num_actors)]
    for p in actors:
        p.start()
    control = {}
    bridges = [threading.Thread(target=remote_bridge, daemon=True, args=(args.num_actors + r - 1, r, groups[r], args,
                                buffers, store, free_q, full_q, control)) for r in range(1, world)]
    for b in bridges:
        b.start()
    replay = PrioritizedReplay(args.buffer_size, {k: buffers[k][0, 0] for k in TRANSITION_KEYS}, args.alpha,
                               args.priority_eps, device)
    rng = np.random.default_rng(args.seed + 10**9 + args.segment)

    from torch.utils.tensorboard import SummaryWriter
    if args.track:
        import wandb
        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True,
                   config=asdict(args), name=args.run_name, id=args.run_name, resume="allow")
    writer = SummaryWriter(run_dir, purge_step=global_step if ckpt else None)  # drop points after it
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in asdict(args).items()))

    stop = {"signal": 0}
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, lambda signum, frame: stop.update(signal=signum))

    def checkpoint():
        save_checkpoint(ckpt_path, {"model": q_net.state_dict(), "target": target_net.state_dict(), "optimizer": opt_state,
                                    "updates": updates, "global_step": global_step, "segment": args.segment,
                                    "wall_time_s": wall_before + time.time() - train_start,
                                    "elapsed_s": elapsed_before + time.time() - PROCESS_START, "recent_returns": list(recent),
                                    "time_to_threshold_s": time_to_threshold, "threshold_step": threshold_step})

    def next_block(pending: dict, expected: tuple) -> int:
        """A filled buffer's index, watching the actors. Deterministic: block `expected` = (sequence, actor) only."""
        while True:
            if args.deterministic and expected in pending:
                return pending.pop(expected)
            try:
                k = full_q.get(timeout=0.5)
            except queue.Empty:
                k = None
            for i, p in enumerate(actors):  # checked at every block: the other actors may keep the queue busy
                if p.exitcode is not None:
                    raise ActorDied(f"actor {i} (pid {p.pid}) exited with code {p.exitcode}")
            if "error" in control:
                raise ActorDied(control["error"])
            if k is not None and not args.deterministic:
                return k
            if k is not None:
                _, actor, sequence = buffers["meta"][k].tolist()
                pending[(sequence, actor)] = k

    segment_start, segment_updates, pending, blocks, last_print, exit_code = global_step, updates, {}, 0, 0.0, 0
    lr = args.learning_rate
    lags, t_insert, t_sample, n_insert, n_sample, t_learn, losses = [], 1e-9, 1e-9, 0, 0, 1e-9, torch.zeros(2)
    block_steps = args.block_length * args.num_envs
    train_start = time.time()
    try:
        while True:
            # The rate limit: one learner update per steps_per_update environment steps after learning_starts.
            while global_step - segment_start >= args.learning_starts and \
                    replay.size and updates - segment_updates < (global_step - segment_start - args.learning_starts) / args.steps_per_update:
                t0 = time.time()
                beta = args.beta + (1.0 - args.beta) * min(1.0, global_step / args.total_timesteps)
                idx, batch, weights = replay.sample(args.batch_size, beta, rng)
                t1 = time.time()
                loss, abs_td = apex_loss(q_net, target_net, batch, weights)
                q_net.zero_grad(set_to_none=False)
                loss.backward()
                grad = clip_grad(torch.cat([p.grad.reshape(-1) for p in params]), args.max_grad_norm)
                frac = max(0.0, 1.0 - global_step / args.total_timesteps)  # the last block may pass total_timesteps
                lr = args.learning_rate * frac if args.anneal_lr else args.learning_rate
                adam_step(params, grad, opt_state, lr, eps=args.adam_eps)
                t2 = time.time()
                replay.update_priorities(idx, abs_td)
                updates += 1
                t_sample, n_sample, t_learn = t_sample + (t1 - t0) + (time.time() - t2), n_sample + args.batch_size, t_learn + t2 - t1
                losses = torch.stack([loss.detach(), abs_td.mean()])
                if updates % args.target_network_frequency == 0:
                    target_net.load_state_dict(q_net.state_dict())
                if args.checkpoint_every and updates % args.checkpoint_every == 0:
                    checkpoint()
            # Parameters for the actors: after every block (deterministic mode: after every round).
            if not args.deterministic or blocks % args.total_actors == 0:
                version = blocks // args.total_actors if args.deterministic else blocks
                store.publish(flat_params(q_net), version)
                versions[version] = updates
                versions.pop(version - 100 * num_buffers, None)  # no actor holds parameters that old
            if global_step >= args.total_timesteps or stop["signal"]:
                break
            k = next_block(pending, (blocks // args.total_actors, blocks % args.total_actors))
            t0 = time.time()
            valid = buffers["valid"][k] > 0
            replay.add({key: buffers[key][k][valid] for key in TRANSITION_KEYS}, buffers["priorities"][k][valid])
            t_insert, n_insert = t_insert + time.time() - t0, n_insert + int(valid.sum())
            version, actor, _ = buffers["meta"][k].tolist()
            ep_return, ep_length = buffers["ep_return"][k].clone(), buffers["ep_length"][k].clone()
            free_q.put(k)
            blocks, global_step = blocks + 1, global_step + block_steps
            lags.append(updates - versions.get(version, min(versions.values())))  # an older one: at least this lag
            ended = ~torch.isnan(ep_return)
            env_eps = eps_all[actor].expand_as(ended)[ended].tolist()
            for ret, length, e in zip(ep_return[ended].tolist(), ep_length[ended].tolist(), env_eps):
                for key, value in (("episodic_return", ret), ("episodic_length", length), ("epsilon", e)):
                    writer.add_scalar(f"charts/{key}", value, global_step)
                if e <= counted_eps:
                    recent.append(ret)
                    if threshold is not None and time_to_threshold is None and len(recent) == 20 and np.mean(recent) >= threshold:
                        time_to_threshold, threshold_step = elapsed_before + time.time() - PROCESS_START, global_step
            now = time.time()
            if now - last_print > 2.0:
                sps = global_step / (wall_before + now - train_start)
                scalars = {"charts/SPS": sps, "charts/policy_lag": lags[-1], "charts/learning_rate": lr,
                           "losses/td_loss": losses[0].item(), "losses/abs_td_error": losses[1].item(), "stats/replay_size": replay.size,
                           "stats/replay_inserts_per_s": n_insert / t_insert, "stats/replay_samples_per_s": n_sample / t_sample,
                           "stats/learner_updates_per_s": updates / (wall_before + now - train_start),
                           "stats/full_queue": full_q.qsize()}
                for key, value in scalars.items():
                    writer.add_scalar(key, value, global_step)
                last_print, mean = now, f"{np.mean(recent):.1f}" if recent else "n/a"
                print(f"global_step={global_step} updates={updates} SPS={sps:.0f} replay={replay.size} "
                      f"policy_lag={lags[-1]} return(last {len(recent)})={mean}", flush=True)
        if stop["signal"]:  # SIGTERM/SIGUSR1 (SLURM preemption): save, then exit cleanly
            checkpoint()
            print(f"signal received: checkpoint of update {updates} written to {ckpt_path}; rerun with --resume to "
                  "continue", flush=True)
        else:
            wall = wall_before + time.time() - train_start
            control["stop"] = True
            for p in actors:  # the actors' CPU is the evaluation's now
                p.kill()
            eval_returns = evaluate(q_net, args.env_id, args.eval_episodes, args.seed + 10**6, device, args.mask_velocity)
            for i, r in enumerate(eval_returns):
                writer.add_scalar("eval/episodic_return", r, i)
            import hashlib
            summary = {"algo": "apex", "env_id": args.env_id, "mask_velocity": args.mask_velocity, "seed": args.seed, "world_size": world, "num_actors": args.num_actors,
                       "total_actors": args.total_actors, "deterministic": args.deterministic, "global_step": global_step,
                       "learner_updates": updates, "wall_time_s": elapsed_before + time.time() - PROCESS_START,
                       "sps": global_step / wall, "train_time_s": wall, "eval_return_mean": float(np.mean(eval_returns)),
                       "eval_return_std": float(np.std(eval_returns)), "reward_threshold": threshold,
                       "train_return_last20": float(np.mean(recent)) if recent else None, "threshold_step": threshold_step,
                       "time_to_threshold_s": time_to_threshold, "policy_lag_mean": float(np.mean(lags)) if lags else None,
                       "replay_inserts_per_s": n_insert / t_insert, "replay_samples_per_s": n_sample / t_sample,
                       "learner_updates_per_s": updates / wall, "learner_compute_s": t_learn, "replay_bytes": replay.nbytes(),
                       "replay_bytes_per_transition": replay.nbytes() / args.buffer_size,
                       "params_sha256": hashlib.sha256(flat_params(q_net).numpy().tobytes()).hexdigest()}
            with open(os.path.join(run_dir, "summary.json"), "w") as f:
                json.dump(summary, f, indent=2)
            if args.save_model:
                save_checkpoint(os.path.join(run_dir, "model.pt"), {k: v.cpu() for k, v in q_net.state_dict().items()})
            print(f"eval return {summary['eval_return_mean']:.1f} +- {summary['eval_return_std']:.1f}; "
                  f"time to threshold: {time_to_threshold}; summary in {run_dir}/summary.json", flush=True)
    except ActorDied as e:
        print(f"{os.path.basename(sys.argv[0])}: error: {e}; stopping", file=sys.stderr, flush=True)
        exit_code = 1
    finally:
        control["stop"] = True
        for p in actors:
            p.kill()
        for p in actors:
            p.join()
    writer.close()
    if args.track:
        wandb.finish()  # imported above, with wandb.init
    if world > 1:
        if exit_code:
            os._exit(exit_code)  # torchrun stops the remote actors
        for b in bridges:
            b.join(timeout=30)
        dist.barrier()
        dist.destroy_process_group()
    return exit_code


if __name__ == "__main__":
    sys.exit(main(tyro.cli(Args)))

# docs: docs/r2d2.md | paper: https://openreview.net/forum?id=r1lyTjAqYX
"""R2D2: Recurrent Experience Replay in Distributed Reinforcement Learning (Kapturowski et al., 2019).

Ape-X's actors and central prioritized replay with an LSTM Q-network and sequence replay: actors step envpool
batches with a local recurrent Q-network, each env with its own epsilon_i, cut each env's stream into fixed-length
sequences (overlapping by half, never crossing an episode end) stored with the recurrent state at their start and a
burn-in prefix, and hand them over in blocks with initial priorities. The learner unrolls the burn-in without loss
to refresh the stored state, then trains n-step double-Q (value rescaling on Atari) on the rest. Under torchrun, rank 0
hosts learner and replay; every other rank is one more actor shipping blocks through torch.distributed.

  python algos/r2d2.py --mask-velocity                              # masked CartPole-v1 (positions only)
  torchrun --standalone --nproc_per_node=3 algos/r2d2.py            # rank 0 learner + replay, ranks 1-2 actors
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
    exp_name: str = "r2d2"  # the name of this experiment (part of the run name)
    seed: int = 1  # seed of the experiment
    torch_deterministic: bool = True  # deterministic CUDA kernels (the CPU kernels used here are anyway)
    cuda: bool = True  # run the learner on CUDA when it is available (actors always run on the CPU)
    track: bool = False  # log to Weights & Biases as well as TensorBoard
    wandb_project_name: str = "distrl"  # the wandb project name
    wandb_entity: Optional[str] = None  # the wandb entity (team)
    capture_video: bool = False  # kept for scripts that pass it to every file; R2D2 saves no frames
    save_model: bool = False  # write the final weights (state_dict) to runs/<run_name>/model.pt
    env_id: str = "CartPole-v1"  # the envpool environment id
    total_timesteps: int = 400_000  # total environment steps taken by all actors
    eval_episodes: int = 10  # episodes of the final, greedy policy to evaluate at the end
    # --- algorithm ---
    mask_velocity: bool = False  # CartPole-v1 with the velocities removed (observation: cart position, pole angle)
    network: Literal["auto", "mlp", "nature"] = "auto"  # torso: 1-layer ReLU MLP or Nature-CNN (auto: by observation)
    hidden_size: int = 64  # width of the MLP torso and of the LSTM (paper: 512, as Atari here)
    learning_rate: float = 1e-3  # Adam's learning rate (paper: 1e-4)
    anneal_lr: bool = True  # anneal the learning rate linearly to zero over total_timesteps (see docs/r2d2.md)
    adam_eps: float = 1e-3  # Adam's epsilon (paper: 1e-3)
    batch_size: int = 32  # sequences per learner update (paper: 64)
    buffer_size: int = 20_000  # replay capacity in sequences; the oldest are evicted first (paper: 100k)
    gamma: float = 0.99  # discount factor (paper: 0.997, for episodes of thousands of steps)
    n_step: int = 5  # n of the n-step returns (paper: 5)
    sequence_length: int = 20  # steps of a replayed sequence that carry a loss (paper: 80)
    sequence_overlap: int = 10  # steps shared by adjacent sequences of one episode (paper: 40, half)
    burn_in: int = 10  # steps before a sequence unrolled from the stored state without loss (paper: 40)
    value_rescaling: Literal["auto", "on", "off"] = "auto"  # h on the targets (auto: on for images, as the paper)
    value_rescaling_eps: float = 1e-3  # epsilon of h(x) = sign(x)(sqrt(|x| + 1) - 1) + epsilon x (paper: 1e-3)
    alpha: float = 0.9  # priority exponent: P(i) = p_i^alpha / sum_k p_k^alpha (paper: 0.9)
    eta: float = 0.9  # sequence priority p = eta max_t |delta_t| + (1 - eta) mean_t |delta_t| (paper: 0.9)
    beta: float = 0.6  # importance-sampling exponent (paper: none, i.e. 0; Acme's R2D2: 0.6)
    priority_eps: float = 1e-6  # added to p so that no sequence has priority 0
    epsilon: float = 0.4  # epsilon_i = epsilon^(1 + epsilon_alpha i / (N - 1)) over the N environments (paper: 0.4)
    epsilon_alpha: float = 7.0  # the exponent's spread alpha of the epsilon_i schedule (paper: 7)
    target_network_frequency: int = 250  # learner updates between copies to the target network (paper: 2500)
    max_grad_norm: float = 10.0  # global gradient-norm clip (paper: none given)
    learning_starts: int = 2000  # environment steps before the learner starts (per run segment)
    steps_per_update: float = 32.0  # environment steps per learner update: the rate limit between actors and learner
    num_envs: int = 16  # environments stepped by each actor (each with its own epsilon_i)
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
                 "priority_eps", "target_network_frequency", "steps_per_update", "num_envs", "hidden_size",
                 "actor_update_interval", "max_grad_norm", "sequence_length", "value_rescaling_eps"]:
        if getattr(args, name) <= 0:
            fail(name, f"must be positive, got {getattr(args, name)}")
    for name in ["torch_threads", "env_threads", "num_actors", "num_buffers", "checkpoint_every", "learning_starts",
                 "alpha", "epsilon_alpha", "threshold_epsilon", "burn_in", "sequence_overlap"]:
        if getattr(args, name) < 0:
            fail(name, f"must not be negative, got {getattr(args, name)}")
    for name in ["gamma", "epsilon"]:
        if not 0.0 < getattr(args, name) <= 1.0:
            fail(name, f"must be in (0, 1], got {getattr(args, name)}")
    for name in ["beta", "eta"]:
        if not 0.0 <= getattr(args, name) <= 1.0:
            fail(name, f"must be in [0, 1], got {getattr(args, name)}")
    if args.sequence_overlap >= args.sequence_length:
        fail("sequence_overlap", f"{args.sequence_overlap} must be below --sequence-length {args.sequence_length}")
    if args.batch_size > args.buffer_size:
        fail("batch_size", f"{args.batch_size} exceeds --buffer-size {args.buffer_size}")
    if 2 * args.num_envs > args.buffer_size:
        fail("buffer_size", f"{args.buffer_size} is smaller than one block (up to 2 x {args.num_envs} sequences)")
    if args.num_buffers and args.num_buffers < 2 * (default_num_actors(args) + int(os.environ.get("WORLD_SIZE", "1")) - 1):
        fail("num_buffers", f"{args.num_buffers} is too few: every actor needs two")
    if args.env_id not in envpool.list_all_envs():
        fail("env_id", f"'{args.env_id}' is not an envpool environment")
    spec = envpool.make_spec(args.env_id)
    obs_space, act_space = spec.observation_space, spec.action_space
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) not in (1, 3):
        fail("env_id", f"'{args.env_id}' has observation space {obs_space}; R2D2 here needs a flat or image Box")
    if not isinstance(act_space, gym.spaces.Discrete):
        fail("env_id", f"'{args.env_id}' has action space {act_space}; DQN needs Discrete actions")
    if args.mask_velocity and args.env_id != "CartPole-v1":
        fail("mask_velocity", f"is for CartPole-v1, not '{args.env_id}'")
    if args.network != "auto" and (args.network == "nature") != (len(obs_space.shape) == 3):
        fail("network", f"'{args.network}' does not fit observations of shape {obs_space.shape} ('{args.env_id}')")


# ----------------------------------------------------------------------------------------------- environment
def make_env(env_id: str, num_envs: int, seed: int, num_threads: int = 1, **kwargs):
    """An envpool batch. Env i of the batch is seeded with seed + i. Atari gets DeepMind preprocessing, but (as in
    the paper) neither a lost life as episode end nor reward clipping: value rescaling takes the clipping's place."""
    extra = {}
    if len(envpool.make_spec(env_id).observation_space.shape) == 3:  # Atari: 84x84 grey, 4 stacked, skip 4
        extra = dict(episodic_life=False, reward_clip=False, noop_max=30, repeat_action_probability=0.0)
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
    """Torso (a 1-layer ReLU MLP for vectors, the Nature CNN for uint8 images divided by 255), an LSTM fed the torso's
    output with the previous action (one-hot; none, -1, at an episode's first step) and reward (squashed by tanh), and
    the dueling streams (Wang et al., 2016), each with a hidden layer as wide as the LSTM: Q(s, a) = V(s) + A(s, a) -
    mean_a' A(s, a'). forward() unrolls sequences
    [B, T, ...] from state (h, c), each [B, H]; where valid is 0 (padding) the state is carried over unchanged."""

    def __init__(self, obs_shape, num_actions: int, network: str = "auto", hidden: int = 128):
        super().__init__()
        self.image = len(obs_shape) == 3
        if (network == "auto" and self.image) or network == "nature":
            self.torso = nn.Sequential(
                layer_init(nn.Conv2d(obs_shape[0], 32, 8, stride=4)), nn.ReLU(),
                layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
                layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(), nn.Flatten())
            features, self.hidden = 3136, 512
        else:
            self.torso = nn.Sequential(layer_init(nn.Linear(int(np.prod(obs_shape)), hidden)), nn.ReLU())
            features, self.hidden = hidden, hidden
        self.num_actions = num_actions
        self.lstm = nn.LSTMCell(features + num_actions + 1, self.hidden)
        H = self.hidden
        self.value = nn.Sequential(layer_init(nn.Linear(H, H)), nn.ReLU(), layer_init(nn.Linear(H, 1), 1.0))
        self.advantage = nn.Sequential(layer_init(nn.Linear(H, H)), nn.ReLU(), layer_init(nn.Linear(H, num_actions), 1.0))

    def initial_state(self, batch: int, device=None) -> tuple:
        return torch.zeros(batch, self.hidden, device=device), torch.zeros(batch, self.hidden, device=device)

    def forward(self, obs: torch.Tensor, prev_action: torch.Tensor, prev_reward: torch.Tensor, valid: torch.Tensor,
                state: tuple):
        B, T = obs.shape[:2]
        x = obs.reshape((B * T,) + obs.shape[2:]).float()
        one_hot = (prev_action[..., None] == torch.arange(self.num_actions, device=obs.device)).float()  # -1: zeros
        features = torch.cat([self.torso(x / 255.0 if self.image else x).view(B, T, -1), one_hot,
                              torch.tanh(prev_reward[..., None].float())], -1)
        h, c, outputs = state[0], state[1], []
        for t in range(T):  # one LSTM step per time step (the same cell as the actors' single steps)
            h_new, c_new = self.lstm(features[:, t], (h, c))
            keep = valid[:, t:t + 1] > 0
            h, c = torch.where(keep, h_new, h), torch.where(keep, c_new, c)
            outputs.append(h)
        out = torch.stack(outputs, 1)
        adv = self.advantage(out)
        return self.value(out) + adv - adv.mean(-1, keepdim=True), (h, c)


# ----------------------------------------------------------------------------------------------- algorithm
def epsilons(epsilon: float, alpha: float, n: int) -> np.ndarray:
    """The Ape-X exploration rates epsilon_i = epsilon^(1 + alpha i / (N - 1)), i = 0..N-1 (N = 1: epsilon)."""
    return epsilon ** (1.0 + alpha * np.arange(n) / max(n - 1, 1))


def n_step_targets(rewards, terms, dones, gamma: float, n: int):
    """n-step returns for the windows starting at s = 0..L-n of [L, N] steps (vectorized over windows and envs):
      m_s = min(n, steps up to and including the first episode end at or after s)
      G_s = sum_{k < m_s} gamma^k r_{s+k},  discount_s = gamma^m_s (1 - terminated_{s+m_s-1}),  bootstrap at x_{s+m_s}

    A truncation bootstraps (from the final observation envpool returns as x_{s+m}), a termination does not; so
    does the end of a stored sequence (its last step is marked done, not terminated).
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


def h(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """Value rescaling (Pohlen et al., 2018): h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1.0) - 1.0) + eps * x


def h_inv(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """The exact inverse of h: sign(x) (((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1)."""
    return torch.sign(x) * (((torch.sqrt(1.0 + 4.0 * eps * (x.abs() + 1.0 + eps)) - 1.0) / (2.0 * eps)) ** 2 - 1.0)


def rescaling_eps(args: Args, spec) -> Optional[float]:
    """h's epsilon where value rescaling is on, else None. auto: on for images (Atari: it replaces reward clipping,
    as in the paper), off for vectors (CartPole's returns need no squashing, and h shrinks the gaps between actions)."""
    on = args.value_rescaling == "on" or (args.value_rescaling == "auto" and len(obs_shape(args, spec)) == 3)
    return args.value_rescaling_eps if on else None


INPUT_KEYS = ("obs", "prev_action", "prev_reward", "obs_valid")  # what the network reads of a stored sequence


def r2d2_loss(q_net: nn.Module, target_net: nn.Module, batch: dict, weights: torch.Tensor, burn_in: int, eta: float,
              eps: Optional[float] = 1e-3):
    """Both networks start from the stored state and unroll the burn-in prefix without gradient (it only refreshes
    the state); on the sequence after it, n-step double-Q targets with value rescaling
      y_t = h(G_t + discount_t h^-1(Q_target(x_b, argmax_a Q(x_b, a)))),  b = the bootstrap step of t (eps None: no h),
    loss = weighted mean over sequences of the mean over valid steps of delta_t^2 / 2, delta_t = y_t - Q(x_t, a_t);
    priority of a sequence eta max_t |delta_t| + (1 - eta) mean_t |delta_t|. Returns (loss, priorities)."""
    inputs, state = [batch[k] for k in INPUT_KEYS], (batch["state"][:, 0], batch["state"][:, 1])
    with torch.no_grad():
        burnt = q_net(*[x[:, :burn_in] for x in inputs], state)[1] if burn_in else state
        q_target, _ = target_net(*inputs, state)
    q, _ = q_net(*[x[:, burn_in:] for x in inputs], burnt)  # [B, S + 1, A]: the S steps and the last bootstrap
    S, mask = q.shape[1] - 1, batch["train"][:, burn_in:]
    q_sa = q[:, :S].gather(2, batch["actions"][:, burn_in:, None]).squeeze(2)
    with torch.no_grad():
        boot = (batch["boot"][:, burn_in:] - burn_in).clamp(0, S)[:, :, None]
        best = q.gather(1, boot.expand(-1, -1, q.shape[2])).argmax(2, keepdim=True)
        q_boot = q_target[:, burn_in:].gather(1, boot.expand(-1, -1, q.shape[2])).gather(2, best).squeeze(2)
        returns, discounts = batch["returns"][:, burn_in:], batch["discounts"][:, burn_in:]
        y = returns + discounts * q_boot if eps is None else h(returns + discounts * h_inv(q_boot, eps), eps)
    delta = (y - q_sa) * mask
    count = mask.sum(1).clamp(min=1.0)
    loss = (weights * (0.5 * delta ** 2).sum(1) / count).mean()
    abs_delta = delta.detach().abs()
    return loss, eta * abs_delta.max(1).values + (1.0 - eta) * abs_delta.sum(1) / count


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
    """The central replay: a ring of `capacity` sequences (FIFO eviction), trees over their p_i^alpha. Sampling is
    stratified (one draw in each of batch_size equal slices of the total); w_i = (N P(i))^-beta / max_j w_j (the
    paper omits them: beta = 0). `fields`: one sequence's tensors (shape and dtype of each field)."""

    def __init__(self, capacity: int, fields: dict, alpha: float, eps: float, device):
        self.capacity, self.alpha, self.eps, self.pos, self.size = capacity, alpha, eps, 0, 0
        self.tree = SumTree(capacity)
        self.data = {k: torch.zeros((capacity,) + v.shape, dtype=v.dtype) for k, v in fields.items()}
        self.device = device

    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.data.values()) + self.tree.sum.nbytes + self.tree.min.nbytes

    def add(self, transitions: dict, abs_td: torch.Tensor) -> None:
        k = abs_td.shape[0]
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
SEQUENCE_KEYS = ("obs", "prev_action", "prev_reward", "obs_valid", "actions", "returns", "discounts", "boot", "train",
                 "state")


def block_buffers(args: Args, spec, num_buffers: int, shared: bool = True) -> dict:
    """Preallocated blocks [K, ...] of up to 2 x num_envs sequences. Per sequence of P = burn_in + sequence_length
    steps: x_0..x_P with the action and reward before each, which are real (obs_valid: 0 on padding), actions,
    n-step returns, discounts and bootstrap steps, the steps with a loss (train), the LSTM state (h, c) before x_0;
    its priority, the env it came from, and the return and length of the episode it ended (NaN elsewhere).
    meta: version, actor, sequence, count, steps."""
    K, P, shape = 2 * args.num_envs, args.burn_in + args.sequence_length, obs_shape(args, spec)
    H = 512 if len(shape) == 3 else args.hidden_size
    b = {"obs": torch.zeros((num_buffers, K, P + 1) + shape, dtype=torch.uint8 if len(shape) == 3 else torch.float32),
         "obs_valid": torch.zeros((num_buffers, K, P + 1)), "prev_reward": torch.zeros((num_buffers, K, P + 1)),
         "prev_action": torch.zeros((num_buffers, K, P + 1), dtype=torch.long), "state": torch.zeros((num_buffers, K, 2, H))}
    b.update({k: torch.zeros((num_buffers, K, P)) for k in ("returns", "discounts", "train")})
    b.update({k: torch.zeros((num_buffers, K, P), dtype=torch.long) for k in ("actions", "boot")})
    b.update({k: torch.zeros((num_buffers, K)) for k in ("priorities", "ep_return", "ep_length")})
    b.update(env=torch.zeros((num_buffers, K), dtype=torch.long), meta=torch.zeros((num_buffers, 5), dtype=torch.long))
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


class SequenceBuilder:
    """Cuts each env's stream into the paper's sequences, vectorized over the envs: P = burn_in + sequence_length
    steps, the last sequence_length of them with a loss; a new sequence every sequence_length - sequence_overlap
    steps, its burn-in prefix the steps before it (padding at an episode's start); an episode's end closes the
    sequence early (padding after it). A sequence keeps the LSTM state before its first step, x_0..x_P (the last one
    only to bootstrap from) with the action and reward before each (-1 and 0 at an episode's first step; padding
    holds 0, unread), and its n-step returns, discounts and bootstrap steps, cut at its end."""

    def __init__(self, num_envs: int, burn_in: int, length: int, overlap: int, n: int, gamma: float, obs, hidden: int):
        N, self.P, self.B, self.n, self.gamma, self.period = num_envs, burn_in + length, burn_in, n, gamma, length - overlap
        self.seq = {"obs": np.zeros((N, self.P + 1) + obs.shape[1:], dtype=obs.dtype), "obs_valid": np.zeros((N, self.P + 1)),
                    "state": np.zeros((N, self.P + 1, 2, hidden), dtype=np.float32), "actions": np.zeros((N, self.P), dtype=np.int64),
                    "rewards": np.zeros((N, self.P)), "terms": np.zeros((N, self.P)),
                    "prev_action": np.zeros((N, self.P + 1), dtype=np.int64), "prev_reward": np.zeros((N, self.P + 1))}
        self.pos, self.rows = np.full(N, burn_in), np.arange(N)  # where each env's next step goes
        self.last_action, self.last_reward = np.full(N, -1), np.zeros(N)  # each env's previous step (-1: none)

    def add(self, obs, state, action, reward, term, done, next_obs, real) -> Optional[dict]:
        """One batch step: x_t, the LSTM state (h, c) before it, a_t, r_t, terminated, terminated or truncated, x_t+1;
        real is False on envpool's reset step (which stores nothing). Returns the sequences it closed (their envs in
        "env") or None."""
        seq, pos, P, B, n = self.seq, self.pos, self.P, self.B, self.n
        i = self.rows[real]
        seq["obs"][i, pos[i]], seq["obs_valid"][i, pos[i]], seq["state"][i, pos[i]] = obs[i], 1.0, state[i]
        seq["actions"][i, pos[i]], seq["rewards"][i, pos[i]], seq["terms"][i, pos[i]] = action[i], reward[i], term[i]
        seq["prev_action"][i, pos[i]], seq["prev_reward"][i, pos[i]] = self.last_action[i], self.last_reward[i]
        self.last_action[i], self.last_reward[i] = action[i], reward[i]
        pos[i] += 1
        c = self.rows[real & (done | (pos == P))]  # sequences to close: full, or their episode ended
        if not len(c):
            return None
        seq["obs"][c, pos[c]], seq["obs_valid"][c, pos[c]] = next_obs[c], 1.0  # x_P, or the final observation
        seq["prev_action"][c, pos[c]], seq["prev_reward"][c, pos[c]] = self.last_action[c], self.last_reward[c]
        last = np.zeros((len(c), P + n - 1))
        last[np.arange(len(c)), pos[c] - 1] = 1.0  # the sequence's last step ends its n-step windows
        pad = np.zeros((len(c), n - 1))
        G, disc, boot = n_step_targets(np.concatenate([seq["rewards"][c], pad], 1).T,
                                       np.concatenate([seq["terms"][c], pad], 1).T, last.T, self.gamma, n)
        out = {"obs": seq["obs"][c], "obs_valid": seq["obs_valid"][c], "actions": seq["actions"][c], "returns": G.T,
               "prev_action": seq["prev_action"][c], "prev_reward": seq["prev_reward"][c],
               "discounts": disc.T, "boot": boot.T, "train": (np.arange(P) >= B) & (np.arange(P) < pos[c][:, None]),
               "state": seq["state"][c, 0], "env": c}
        full, ended = c[~done[c]], c[done[c]]
        for value in seq.values():  # a full sequence: the next one starts `period` steps later
            value[full, :value.shape[1] - self.period] = value[full, self.period:]
            value[ended] = 0  # an ended episode: the next sequence starts with a padded burn-in prefix
        seq["obs_valid"][full, P + 1 - self.period:] = 0.0
        pos[full], pos[ended] = pos[full] - self.period, B
        self.last_action[ended], self.last_reward[ended] = -1, 0.0
        return out


def actor_loop(actor: int, args: Args, spec, link, local: bool = True) -> None:
    """One actor: step an envpool batch, env j epsilon_i-greedy (i = actor * num_envs + j) with a local recurrent
    Q-network, cut the envs' streams into sequences (SequenceBuilder), send them in blocks (once num_envs are
    closed) with initial priorities from its own network. Parameters: the latest every actor_update_interval steps
    (remote: with each block's reply); deterministic mode: block s uses version max(s - 1, 0), published once the
    learner has taken round s - 2."""
    if local:  # die with the learner, whatever kills it (PR_SET_PDEATHSIG); the learner turns signals into a checkpoint
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    torch.set_num_threads(1)
    N, A = args.num_envs, spec.action_space.n
    seed = env_seed(args, actor)
    envs, rng = make_env(args.env_id, N, seed, args.env_threads or 1), np.random.default_rng(seed)
    eps = epsilons(args.epsilon, args.epsilon_alpha, args.total_actors * N)[actor * N:(actor + 1) * N]
    net = QNetwork(obs_shape(args, spec), A, args.network, args.hidden_size)
    flat, state = flat_params(net), net.initial_state(N)
    obs = observe(envs.reset()[0], args.mask_velocity)
    builder = SequenceBuilder(N, args.burn_in, args.sequence_length, args.sequence_overlap, args.n_step, args.gamma, obs,
                              net.hidden)
    ep_return, ep_length, prev_done = np.zeros(N), np.zeros(N), np.zeros(N, dtype=bool)
    prev_action, prev_reward = torch.full((N, 1), -1), torch.zeros(N, 1)  # -1: none (an episode's first step)
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
        count = steps = 0
        while count < N:
            if not args.deterministic and (loaded < 0 or since >= args.actor_update_interval) and link.latest() != loaded:
                loaded, since = link.params(flat), 0
                load_flat(net, flat)
            since, steps = since + 1, steps + 1
            with torch.no_grad():
                q, new_state = net(torch.as_tensor(obs)[:, None], prev_action, prev_reward, torch.ones(N, 1), state)
            action = np.where(rng.random(N) < eps, rng.integers(A, size=N), q[:, 0].argmax(-1).numpy())
            o, r, term, trunc, info = envs.step(action)
            o, done, real = observe(o, args.mask_velocity), term | trunc, ~prev_done  # not real: envpool's reset step
            closed = builder.add(obs, torch.stack(state, 1).numpy(), action, r, term, done, o, real)
            ep_return, ep_length = ep_return + r * real, ep_length + real
            if closed is not None:
                c, k = closed["env"], slice(count, count + len(closed["env"]))
                closed.update(ep_return=np.where(done[c], ep_return[c], np.nan), ep_length=ep_length[c])
                for key, value in closed.items():
                    block[key][k] = torch.as_tensor(value)
                count, ended = count + len(c), c[done[c]]
                ep_return[ended], ep_length[ended] = 0.0, 0
            reset = torch.as_tensor(prev_done)[:, None]  # after a reset step the new episode starts from a zero state
            prev_action = torch.where(reset, -1, torch.as_tensor(action)[:, None])
            prev_reward = torch.where(reset, 0.0, torch.as_tensor(r, dtype=torch.float32)[:, None])
            obs, prev_done, state = o, done, tuple(torch.where(reset, 0.0, x) for x in new_state)
        with torch.no_grad():  # initial priorities, from the actor's own network (online and target alike)
            _, priorities = r2d2_loss(net, net, {key: block[key][:count] for key in SEQUENCE_KEYS}, torch.ones(count),
                                      args.burn_in, args.eta, rescaling_eps(args, spec))
        block["priorities"][:count] = priorities
        block["meta"].copy_(torch.tensor([loaded, actor, sequence, count, steps]))
        link.send()
        sequence += 1


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
    envs = make_env(env_id, episodes, seed)
    obs, _ = envs.reset()
    returns, done, state = np.zeros(episodes), np.zeros(episodes, dtype=bool), net.initial_state(episodes, device)
    action, reward = torch.full((episodes, 1), -1, device=device), torch.zeros(episodes, 1, device=device)
    while not done.all():
        with torch.no_grad():
            x = torch.as_tensor(observe(obs, mask_velocity), device=device)[:, None]
            q, state = net(x, action, reward, torch.ones(episodes, 1, device=device), state)
        action = q[:, 0].argmax(-1, keepdim=True)
        obs, r, term, trunc, info = envs.step(action[:, 0].cpu().numpy())
        reward = torch.as_tensor(r, dtype=torch.float32, device=device)[:, None]
        returns += r * ~done
        done |= term | trunc
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
    replay = PrioritizedReplay(args.buffer_size, {k: buffers[k][0, 0] for k in SEQUENCE_KEYS}, args.alpha, args.priority_eps,
                               device)
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
                _, actor, sequence, _, _ = buffers["meta"][k].tolist()
                pending[(sequence, actor)] = k

    segment_start, segment_updates, pending, blocks, last_print, exit_code = global_step, updates, {}, 0, 0.0, 0
    lr = args.learning_rate
    lags, t_insert, t_sample, n_insert, n_sample, t_learn, losses = [], 1e-9, 1e-9, 0, 0, 1e-9, torch.zeros(2)
    train_start = time.time()
    try:
        while True:
            # The rate limit: one learner update per steps_per_update environment steps after learning_starts.
            while global_step - segment_start >= args.learning_starts and \
                    replay.size and updates - segment_updates < (global_step - segment_start - args.learning_starts) / args.steps_per_update:
                t0 = time.time()
                idx, batch, weights = replay.sample(args.batch_size, args.beta, rng)
                t1 = time.time()
                loss, abs_td = r2d2_loss(q_net, target_net, batch, weights, args.burn_in, args.eta, rescaling_eps(args, spec))
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
            version, actor, _, count, steps = buffers["meta"][k].tolist()
            replay.add({key: buffers[key][k][:count] for key in SEQUENCE_KEYS}, buffers["priorities"][k][:count])
            t_insert, n_insert = t_insert + time.time() - t0, n_insert + count
            ep_return, ep_length = buffers["ep_return"][k][:count].clone(), buffers["ep_length"][k][:count].clone()
            env_eps = eps_all[actor][buffers["env"][k][:count]]
            free_q.put(k)
            blocks, global_step = blocks + 1, global_step + steps * args.num_envs
            lags.append(updates - versions.get(version, min(versions.values())))  # an older one: at least this lag
            ended = ~torch.isnan(ep_return)
            for ret, length, e in zip(ep_return[ended].tolist(), ep_length[ended].tolist(), env_eps[ended].tolist()):
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
            summary = {"algo": "r2d2", "env_id": args.env_id, "mask_velocity": args.mask_velocity, "seed": args.seed, "world_size": world, "num_actors": args.num_actors,
                       "total_actors": args.total_actors, "deterministic": args.deterministic, "global_step": global_step,
                       "learner_updates": updates, "wall_time_s": elapsed_before + time.time() - PROCESS_START,
                       "sps": global_step / wall, "train_time_s": wall, "eval_return_mean": float(np.mean(eval_returns)),
                       "eval_return_std": float(np.std(eval_returns)), "reward_threshold": threshold,
                       "train_return_last20": float(np.mean(recent)) if recent else None, "threshold_step": threshold_step,
                       "time_to_threshold_s": time_to_threshold, "policy_lag_mean": float(np.mean(lags)) if lags else None,
                       "replay_inserts_per_s": n_insert / t_insert, "replay_samples_per_s": n_sample / t_sample,
                       "learner_updates_per_s": updates / wall, "learner_compute_s": t_learn, "replay_bytes": replay.nbytes(),
                       "replay_bytes_per_step": replay.nbytes() / (args.buffer_size * (args.sequence_length - args.sequence_overlap)),
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

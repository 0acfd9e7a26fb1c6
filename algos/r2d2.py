# docs: docs/r2d2.md | paper: https://openreview.net/forum?id=r1lyTjAqYX
"""R2D2: Recurrent Experience Replay in Distributed Reinforcement Learning (Kapturowski et al., 2019).

Ape-X's actors and central prioritized replay with an LSTM Q-network and sequence replay: actors
step envpool batches with a local recurrent Q-network, each env with its own epsilon_i, cut each
env's stream into fixed-length sequences (overlapping by half, never crossing an episode end) stored
with the recurrent state at their start and a burn-in prefix, and hand them over in blocks with
initial priorities. The learner unrolls the burn-in without loss to refresh the stored state, then
trains n-step double-Q (value rescaling on Atari) on the rest. Under torchrun, rank 0 hosts learner
and replay; every other rank is one more actor shipping blocks through torch.distributed.

  python algos/r2d2.py --mask-velocity                              # masked CartPole-v1 (positions only)
  torchrun --standalone --nproc_per_node=3 algos/r2d2.py            # rank 0 learner + replay, ranks 1-2 actors

The file reads top to bottom down to main(); below the "infrastructure" line are the flags, checks,
checkpoints, the determinism schedule, signals, the actors' health checks, torchrun plumbing and logging
that keep a run alive, none of it R2D2.
"""

import contextlib
import ctypes
import hashlib
import importlib
import json
import math
import os
import queue
import random
import signal
import sys
import threading
import time
import warnings
from collections import deque
from dataclasses import asdict, dataclass, field, fields
from datetime import timedelta
from typing import Literal, Optional

# under torchrun, die with the agent (prctl's PR_SET_PDEATHSIG), asked before the slow imports: see
# "the torchrun death request" below the fold
PR_SET_PDEATHSIG = 1
if "TORCHELASTIC_RUN_ID" in os.environ:
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

import envpool
import gymnasium as gym
import imageio
import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import tyro
from torch.utils.tensorboard import SummaryWriter


@dataclass
class Args:
    """The algorithm's and the environment's flags; the infrastructure's (checkpoints, determinism, timeouts,
    logging) are in `Infra`, below the fold, and the command line takes both."""

    # --- experiment and environment ---
    seed: int = 1  # seed of the experiment
    env_id: str = "CartPole-v1"  # the envpool environment id
    total_timesteps: int = 400_000  # total environment steps taken by all actors
    # --- algorithm ---
    mask_velocity: bool = False  # CartPole-v1 with the velocities removed (observation: cart position, pole angle)
    network: Literal["auto", "mlp", "nature"] = "auto"  # torso: 1-layer ReLU MLP or Nature-CNN (auto: by observation)
    hidden_size: int = 64  # width of the MLP torso and of the LSTM (paper: 512, as Atari here)
    learning_rate: float = 1e-3  # Adam's learning rate (paper: 1e-4)
    anneal_lr: bool = True  # anneal the learning rate linearly to zero over total_timesteps (see docs/r2d2.md)
    adam_eps: float = 1e-3  # Adam's epsilon (paper: 1e-3)
    batch_size: int = 32  # sequences per learner update (paper: 64)
    buffer_size: int = 40_000  # replay capacity in sequences; the oldest are evicted first (paper: 100k)
    gamma: float = 0.99  # discount factor (paper: 0.997, for episodes of thousands of steps)
    n_step: int = 5  # n of the n-step returns (paper: 5)
    sequence_length: int = 20  # steps of a replayed sequence that carry a loss (paper: 80)
    sequence_overlap: int = 10  # steps shared by adjacent sequences of one episode (paper: 40, half)
    burn_in: int = 10  # steps before a sequence unrolled from the stored state without loss (paper: 40)
    value_rescaling: Literal["auto", "on", "off"] = "auto"  # h on the targets (auto: on for images, as the paper)
    value_rescaling_eps: float = 1e-3  # epsilon of h(x) = sign(x)(sqrt(|x| + 1) - 1) + epsilon x (paper: 1e-3)
    alpha: float = 0.9  # priority exponent: P(i) = p_i^alpha / sum_k p_k^alpha (paper: 0.9)
    eta: float = 0.9  # sequence priority p = eta max_t |delta_t| + (1 - eta) mean_t |delta_t| (paper: 0.9)
    # importance-sampling exponent (paper: none in Section 2.3, 0.6 in the appendix table; Acme: 0.6)
    beta: float = 0.6
    priority_eps: float = 1e-6  # added to p so that no sequence has priority 0
    epsilon: float = 0.4  # epsilon_i = epsilon^(1 + epsilon_alpha i / (N - 1)) over the N environments (paper: 0.4)
    epsilon_alpha: float = 7.0  # the exponent's spread alpha of the epsilon_i schedule (paper: 7)
    target_network_frequency: int = 250  # learner updates between copies to the target network (paper: 2500)
    max_grad_norm: float = 10.0  # global gradient-norm clip (paper: none given)
    # environment steps before the learner starts (per run segment; with --restart-every, per run)
    learning_starts: int = 2000
    steps_per_update: float = 32.0  # environment steps per learner update: the rate limit between actors and learner
    num_envs: int = 16  # environments stepped by each actor (each with its own epsilon_i)
    # steps of an actor's batch between parameter refreshes (each env steps once per batch step);
    # paper: 400 environment steps (Acme's variable_update_period)
    actor_update_interval: int = 32
    # --- distributed: the actors ---
    num_actors: int = 0  # actor processes on rank 0 (0: one per available CPU but one, at least 1)
    num_buffers: int = 0  # shared block buffers (0: 2 per actor, counting remote ranks, plus 2)
    # --- computed at run time ---
    world_size: int = field(default=1, init=False)
    rank: int = field(default=0, init=False)
    local_rank: int = field(default=0, init=False)
    total_actors: int = field(default=0, init=False)
    segment: int = field(default=0, init=False)
    start_round: int = field(default=0, init=False)
    run_name: str = field(default="", init=False)


# `--preset atari`: the paper's values, replay scaled to one machine's memory (docs/r2d2.md); not run to a result
# on Pong; flags given beside it still apply
PRESETS = {
    "atari": dict(
        env_id="Pong-v5",
        total_timesteps=10_000_000,
        burn_in=40,
        sequence_length=80,
        sequence_overlap=40,
        gamma=0.997,
        learning_rate=1e-4,
        batch_size=64,
        buffer_size=4000,
        target_network_frequency=2500,
        learning_starts=50_000,
        anneal_lr=False,
        steps_per_update=64,
        beta=0.0,
    ),
}


# ----------------------------------------------------------------------------------------------- environment
def make_env(env_id: str, num_envs: int, seed: int, num_threads: int = 1, **kwargs):
    """An envpool batch. Env i of the batch is seeded with seed + i. Atari gets DeepMind
    preprocessing, but (as in the paper) neither a lost life as episode end nor reward clipping:
    value rescaling takes the clipping's place."""
    options = {}
    # Atari: 84x84 grey frames, 4 stacked, frame skip 4 (envpool's defaults)
    if len(envpool.make_spec(env_id).observation_space.shape) == 3:
        options = dict(episodic_life=False, reward_clip=False, noop_max=30, repeat_action_probability=0.0)
    options.update(kwargs)
    return envpool.make(
        env_id,
        env_type="gymnasium",
        num_envs=num_envs,
        seed=seed,
        num_threads=num_threads,
        thread_affinity_offset=-1,
        **options,
    )


def open_video(video_dir: str):
    """An MP4 writer for evaluation episode 0: envpool renders the frames and imageio-ffmpeg's own binary
    encodes them as they come, so no episode is held in memory."""
    os.makedirs(video_dir, exist_ok=True)
    return imageio.get_writer(os.path.join(video_dir, "eval_episode0.mp4"), fps=30, macro_block_size=1)


def observe(obs: np.ndarray, mask_velocity: bool) -> np.ndarray:
    """What the network sees: with --mask-velocity, CartPole's cart position and pole angle (columns
    0 and 2) only."""
    return obs[..., [0, 2]] if mask_velocity else obs


def obs_shape(args: Args, spec) -> tuple:
    return (2,) if args.mask_velocity else spec.observation_space.shape


def env_seed(args: Args, actor: int, round_: int) -> int:
    """Seed of env 0 of `actor` (local ones, then one per remote rank) when its envs start: in run
    segment args.segment (0, then +1 per resume), or with --restart-every at round `round_`."""
    start = round_ if args.restart_every else args.segment
    return args.seed + (start * args.total_actors + actor) * args.num_envs


# ----------------------------------------------------------------------------------------------- networks
def scale_frames(x: torch.Tensor) -> torch.Tensor:
    """uint8 frames [B, C, H, W] as floats in [0, 1]. Where a backward pass follows (the learner), stored channels
    last: oneDNN's faster layout for the convolutions' gradients on the CPU; the actors' small no-grad batches are
    faster in the default layout (docs/benchmarks.md, Where the time goes)."""
    x = x.float() / 255.0
    if torch.is_grad_enabled():
        x = x.contiguous(memory_format=torch.channels_last)
    return x


def layer_init(layer: nn.Module, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Module:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


class QNetwork(nn.Module):
    """Torso (a 1-layer ReLU MLP for vectors, the Nature CNN for uint8 images divided by 255), an
    LSTM fed the torso's output with the previous action (one-hot; none, -1, at an episode's first
    step) and reward (squashed by tanh), and the dueling streams (Wang et al., 2016), each with a
    hidden layer as wide as the LSTM: Q(s, a) = V(s) + A(s, a) - mean_a' A(s, a'). forward() unrolls
    sequences [B, T, ...] from state (h, c), each [B, H]; where valid is 0 (padding) the state is
    carried over unchanged."""

    def __init__(self, obs_shape, num_actions: int, network: str = "auto", hidden: int = 128):
        super().__init__()
        self.image = len(obs_shape) == 3
        if (network == "auto" and self.image) or network == "nature":
            self.torso = nn.Sequential(
                layer_init(nn.Conv2d(obs_shape[0], 32, 8, stride=4)),
                nn.ReLU(),
                layer_init(nn.Conv2d(32, 64, 4, stride=2)),
                nn.ReLU(),
                layer_init(nn.Conv2d(64, 64, 3, stride=1)),
                nn.ReLU(),
                nn.Flatten(),
            )
            features = 3136
            self.hidden = 512
        else:
            self.torso = nn.Sequential(layer_init(nn.Linear(int(np.prod(obs_shape)), hidden)), nn.ReLU())
            features = hidden
            self.hidden = hidden
        self.num_actions = num_actions
        self.lstm = nn.LSTMCell(features + num_actions + 1, self.hidden)
        H = self.hidden
        self.value = nn.Sequential(layer_init(nn.Linear(H, H)), nn.ReLU(), layer_init(nn.Linear(H, 1), 1.0))
        self.advantage = nn.Sequential(
            layer_init(nn.Linear(H, H)), nn.ReLU(), layer_init(nn.Linear(H, num_actions), 1.0)
        )

    def initial_state(self, batch: int, device=None) -> tuple:
        return torch.zeros(batch, self.hidden, device=device), torch.zeros(batch, self.hidden, device=device)

    def forward(self, obs, prev_action, prev_reward, valid, state: tuple):
        B, T = obs.shape[:2]
        x = obs.reshape((B * T,) + obs.shape[2:]).float()
        # an action of -1 (none) has an all-zero one-hot
        one_hot = (prev_action[..., None] == torch.arange(self.num_actions, device=obs.device)).float()
        torso = self.torso(scale_frames(x) if self.image else x).view(B, T, -1)
        features = torch.cat([torso, one_hot, torch.tanh(prev_reward[..., None].float())], -1)
        h = state[0]
        c = state[1]
        outputs = []
        # one LSTM step per time step (the same cell as the actors' single steps)
        for t in range(T):
            h_new, c_new = self.lstm(features[:, t], (h, c))
            keep = valid[:, t : t + 1] > 0
            h = torch.where(keep, h_new, h)
            c = torch.where(keep, c_new, c)
            outputs.append(h)
        out = torch.stack(outputs, 1)
        adv = self.advantage(out)
        return self.value(out) + adv - adv.mean(-1, keepdim=True), (h, c)


def make_network(args: Args, spec) -> QNetwork:
    return QNetwork(obs_shape(args, spec), spec.action_space.n, args.network, args.hidden_size)


# ----------------------------------------------------------------------------------------------- algorithm
def epsilons(epsilon: float, alpha: float, n: int) -> np.ndarray:
    """The Ape-X exploration rates epsilon_i = epsilon^(1 + alpha i / (N - 1)), i = 0..N-1 (N = 1:
    epsilon)."""
    return epsilon ** (1.0 + alpha * np.arange(n) / max(n - 1, 1))


def n_step_targets(rewards, terms, dones, gamma: float, n: int):
    """n-step returns for the windows starting at s = 0..L-n of [L, N] steps (vectorized over
    windows and envs):
      m_s = min(n, steps up to and including the first episode end at or after s)
      G_s = sum_{k < m_s} gamma^k r_{s+k},  discount_s = gamma^m_s (1 - terminated_{s+m_s-1}),  bootstrap at x_{s+m_s}

    A truncation bootstraps (from the final observation envpool returns as x_{s+m}), a termination
    does not; so does the end of a stored sequence (its last step is marked done, not terminated).
    Returns G, discount and the bootstrap index s + m_s, each [L-n+1, N]."""
    L = rewards.shape[0]
    W = L - n + 1
    G = np.zeros((W,) + rewards.shape[1:])
    alive = np.ones(G.shape)
    disc = np.ones(G.shape)
    m = np.zeros(G.shape, dtype=np.int64)
    term_end = np.zeros(G.shape)
    for k in range(n):
        G += alive * disc * rewards[k : k + W]
        m += alive.astype(np.int64)
        term_end = np.where(alive > 0, terms[k : k + W], term_end)
        disc = np.where(alive > 0, disc * gamma, disc)
        alive = alive * (1.0 - dones[k : k + W])
    return G, disc * (1.0 - term_end), np.arange(W).reshape((W,) + (1,) * (rewards.ndim - 1)) + m


def h(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """Value rescaling (Pohlen et al., 2018): h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1.0) - 1.0) + eps * x


def h_inv(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """The exact inverse of h: sign(x) (((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1)."""
    return torch.sign(x) * (((torch.sqrt(1.0 + 4.0 * eps * (x.abs() + 1.0 + eps)) - 1.0) / (2.0 * eps)) ** 2 - 1.0)


def rescaling_eps(args: Args, spec) -> Optional[float]:
    """h's epsilon where value rescaling is on, else None. auto: on for images (Atari: it replaces
    reward clipping, as in the paper), off for vectors (CartPole's returns need no squashing, and h
    shrinks the gaps between actions)."""
    on = args.value_rescaling == "on" or (args.value_rescaling == "auto" and len(obs_shape(args, spec)) == 3)
    return args.value_rescaling_eps if on else None


# what the network reads of a stored sequence
INPUT_KEYS = ("obs", "prev_action", "prev_reward", "obs_valid")


def frames_once(obs: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Sequences of stacked frames [N, L, C, H, W] (x_t: C frames, the newest last) stored with each frame once,
    [N, L + C - 1, H, W]: frame t + C - 1 is x_t's newest, and the first valid x_k is written whole at k..k + C - 1.
    A sequence's valid steps are one run within one episode, where x_t's older frames are x_(t-1)'s newer ones, so
    `restack` gives back every valid x_t (padding before and after the run reads other frames and is never valid).
    Vectors [N, L, D] are kept as they are."""
    if obs.ndim != 5:
        return obs
    N, L, C = obs.shape[:3]
    frames = np.zeros((N, L + C - 1) + obs.shape[3:], dtype=obs.dtype)
    frames[:, C - 1 :] = obs[:, :, -1]
    first = valid.argmax(1)
    rows = np.arange(N)
    frames[rows[:, None], first[:, None] + np.arange(C - 1)] = obs[rows, first, : C - 1]
    return frames


def restack(obs: torch.Tensor, num_obs: int) -> torch.Tensor:
    """x_0..x_(num_obs-1) of sequences stored by frames_once: frames [B, num_obs + C - 1, H, W] as
    [B, num_obs, C, H, W], x_t = frames t..t + C - 1 (a view, no copy). Anything else (vectors [B, num_obs, D],
    whole stacks) is returned as it is."""
    if obs.dim() != 4:
        return obs
    # C frames per observation
    return obs.unfold(1, obs.shape[1] - num_obs + 1, 1).permute(0, 1, 4, 2, 3)


def r2d2_loss(q_net, target_net, batch: dict, weights, burn_in: int, eta: float, eps: Optional[float] = 1e-3):
    """Both networks start from the stored state and unroll the burn-in prefix without gradient (it
    only refreshes the state); on the sequence after it, n-step double-Q targets with value rescaling
      y_t = h(G_t + discount_t h^-1(Q_target(x_b, argmax_a Q(x_b, a)))),  b = the bootstrap step of t
    (eps None: no h); delta_t = y_t - Q(x_t, a_t); the loss is the weighted mean over sequences of the
    mean over valid steps of delta_t^2 / 2; a sequence's priority is
      eta max_t |delta_t| + (1 - eta) mean_t |delta_t|.
    batch["obs"] holds x_0..x_P, or for images their frames, each stored once (frames_once).
    Returns (loss, priorities)."""
    # images: x_0..x_P rebuilt from their frames (restack), then the action and reward before each, valid
    obs = restack(batch["obs"], batch["obs_valid"].shape[1])
    inputs = [obs] + [batch[key] for key in INPUT_KEYS[1:]]
    state = (batch["state"][:, 0], batch["state"][:, 1])
    with torch.no_grad():
        burnt = q_net(*[x[:, :burn_in] for x in inputs], state)[1] if burn_in else state
        q_target, _ = target_net(*inputs, state)
    # [B, S + 1, A]: the S steps and the last bootstrap
    q, _ = q_net(*[x[:, burn_in:] for x in inputs], burnt)
    S = q.shape[1] - 1
    mask = batch["train"][:, burn_in:]
    q_sa = q[:, :S].gather(2, batch["actions"][:, burn_in:, None]).squeeze(2)
    with torch.no_grad():
        boot = (batch["boot"][:, burn_in:] - burn_in).clamp(0, S)[:, :, None]
        best = q.gather(1, boot.expand(-1, -1, q.shape[2])).argmax(2, keepdim=True)
        q_boot = q_target[:, burn_in:].gather(1, boot.expand(-1, -1, q.shape[2])).gather(2, best).squeeze(2)
        returns = batch["returns"][:, burn_in:]
        discounts = batch["discounts"][:, burn_in:]
        y = returns + discounts * q_boot if eps is None else h(returns + discounts * h_inv(q_boot, eps), eps)
    delta = (y - q_sa) * mask
    count = mask.sum(1).clamp(min=1.0)
    loss = (weights * (0.5 * delta**2).sum(1) / count).mean()
    abs_delta = delta.detach().abs()
    return loss, eta * abs_delta.max(1).values + (1.0 - eta) * abs_delta.sum(1) / count


class SumTree:
    """Proportional prioritization's structure (Schaul et al., 2016): binary trees over `capacity`
    leaves (rounded up to a power of two) whose inner nodes hold the sum (and, in a second tree, the
    min) of their children: sampling and updates in O(log capacity), vectorized over batches.
    Unwritten leaves: 0 (sum tree), +inf (min tree)."""

    def __init__(self, capacity: int):
        if capacity <= 0:
            raise ValueError(f"SumTree: capacity must be positive, got {capacity}")
        self.size = 1 << max(1, (capacity - 1).bit_length())
        self.sum = np.zeros(2 * self.size)
        self.min = np.full(2 * self.size, np.inf)

    def update(self, leaves: np.ndarray, priorities: np.ndarray) -> None:
        """Set the priorities (already raised to alpha) of `leaves`; the last one wins for a
        repeated leaf."""
        # a negative (or NaN) priority would make the sums lie about the tree's leaves
        if not np.all(np.asarray(priorities) >= 0):
            raise ValueError("SumTree: priorities must be non-negative numbers")
        nodes = np.asarray(leaves) + self.size
        self.sum[nodes] = priorities
        self.min[nodes] = priorities
        # sorted, so each level's parents are deduplicated by comparing neighbours
        nodes = np.unique(nodes // 2)
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
        """The leaves whose prefix-sum intervals contain `values` (each in [0, total)): descend left
        when the value is below the left child's sum, else subtract it and descend right."""
        nodes = np.ones(len(values), dtype=np.int64)
        values = np.array(values, dtype=np.float64)
        while nodes[0] < self.size:
            left = self.sum[2 * nodes]
            right = values >= left
            values -= left * right
            nodes = 2 * nodes + right
        return nodes - self.size


class PrioritizedReplay:
    """The central replay: a ring of `capacity` sequences (FIFO eviction), trees over their
    p_i^alpha. Sampling is stratified (one draw in each of batch_size equal slices of the total);
    w_i = (N P(i))^-beta / max_j w_j, the largest weight being that of the replay's least priority
    (Schaul et al.; Acme divides by the batch's largest weight instead, docs/r2d2.md). `fields`: one
    sequence's tensors (shape and dtype of each field)."""

    def __init__(self, capacity: int, fields: dict, alpha: float, eps: float, device):
        self.capacity = capacity
        self.alpha = alpha
        self.eps = eps
        self.pos = 0
        self.size = 0
        self.tree = SumTree(capacity)
        self.data = {key: torch.zeros((capacity,) + value.shape, dtype=value.dtype) for key, value in fields.items()}
        self.device = device

    def nbytes(self) -> int:
        data = sum(value.numel() * value.element_size() for value in self.data.values())
        return data + self.tree.sum.nbytes + self.tree.min.nbytes

    def add(self, items: dict, abs_td: torch.Tensor) -> None:
        count = abs_td.shape[0]
        indices = (self.pos + np.arange(count)) % self.capacity
        rows = torch.from_numpy(indices)
        for key, value in self.data.items():
            value[rows] = items[key]
        self.tree.update(indices, (abs_td.double().numpy() + self.eps) ** self.alpha)
        self.pos = (self.pos + count) % self.capacity
        self.size = min(self.size + count, self.capacity)

    def sample(self, batch_size: int, beta: float, rng: np.random.Generator):
        if self.size == 0:
            raise ValueError("PrioritizedReplay: cannot sample an empty replay")
        total = self.tree.total()
        values = (np.arange(batch_size) + rng.random(batch_size)) * (total / batch_size)
        indices = np.minimum(self.tree.find(np.minimum(values, np.nextafter(total, 0))), self.size - 1)
        weights = (self.tree.sum[indices + self.tree.size] / self.tree.min[1]) ** (-beta)
        rows = torch.from_numpy(indices)
        batch = gather_to_device(self.data, rows, self.device)
        return indices, batch, torch.as_tensor(weights, dtype=torch.float32, device=self.device)

    def update_priorities(self, indices: np.ndarray, abs_td: torch.Tensor) -> None:
        self.tree.update(indices, (abs_td.double().cpu().numpy() + self.eps) ** self.alpha)

    def state_dict(self) -> dict:
        """Everything the replay holds (its data, trees and ring position), for a checkpoint."""
        trees = {"sum": torch.from_numpy(self.tree.sum), "min": torch.from_numpy(self.tree.min)}
        return {"pos": self.pos, "size": self.size, "data": self.data, **trees}

    def load_state_dict(self, state: dict) -> None:
        for key, value in self.data.items():
            if state["data"][key].shape != value.shape:
                raise ValueError(
                    f"replay field {key} of shape {tuple(state['data'][key].shape)}, not {tuple(value.shape)}"
                )
            value.copy_(state["data"][key])
        self.tree.sum[:] = state["sum"].numpy()
        self.tree.min[:] = state["min"].numpy()
        self.pos = state["pos"]
        self.size = state["size"]


def flatten_parameters(net: nn.Module) -> torch.Tensor:
    """Make every parameter a view of one flat vector and every gradient a view of `flat.grad`
    (backward adds into them in place), so the clip and torch's Adam each act on one tensor. Call it
    after moving `net` to its device."""
    params = list(net.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    flat.grad = torch.zeros_like(flat)
    offset = 0
    for p in params:
        p.data = flat[offset : offset + p.numel()].view_as(p)
        p.grad = flat.grad[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    return flat


# ----------------------------------------------------------------------------------------------- roles
SEQUENCE_KEYS = (
    "obs",
    "prev_action",
    "prev_reward",
    "obs_valid",
    "actions",
    "returns",
    "discounts",
    "boot",
    "train",
    "state",
)


def block_buffers(args: Args, spec, num_buffers: int, shared: bool = True) -> dict:
    """Preallocated blocks [K, ...] of up to 2 x num_envs sequences. Per sequence of P = burn_in +
    sequence_length steps: x_0..x_P (images: their frames, each once) with the action and reward
    before each, which are real (obs_valid: 0 on padding), actions, n-step returns, discounts and
    bootstrap steps, the steps with a loss (train), the LSTM state (h, c) before x_0; its priority,
    the env it came from, and the return and length of the episode it ended (NaN elsewhere). meta:
    version, actor, sequence, count, steps."""
    sequences = 2 * args.num_envs
    steps = args.burn_in + args.sequence_length
    shape = obs_shape(args, spec)
    hidden = 512 if len(shape) == 3 else args.hidden_size
    dtype = torch.uint8 if len(shape) == 3 else torch.float32
    # images [C, H, W]: x_0..x_P as their P + C frames, each stored once (frames_once)
    stored = (steps + shape[0],) + shape[1:] if len(shape) == 3 else (steps + 1,) + shape
    buffers = {"obs": torch.zeros((num_buffers, sequences) + stored, dtype=dtype)}
    for key in ("obs_valid", "prev_reward"):
        buffers[key] = torch.zeros((num_buffers, sequences, steps + 1))
    buffers["prev_action"] = torch.zeros((num_buffers, sequences, steps + 1), dtype=torch.long)
    buffers["state"] = torch.zeros((num_buffers, sequences, 2, hidden))
    for key in ("returns", "discounts", "train"):
        buffers[key] = torch.zeros((num_buffers, sequences, steps))
    for key in ("actions", "boot"):
        buffers[key] = torch.zeros((num_buffers, sequences, steps), dtype=torch.long)
    for key in ("priorities", "ep_return", "ep_length"):
        buffers[key] = torch.zeros((num_buffers, sequences))
    buffers["env"] = torch.zeros((num_buffers, sequences), dtype=torch.long)
    buffers["meta"] = torch.zeros((num_buffers, 5), dtype=torch.long)
    return {key: value.share_memory_() for key, value in buffers.items()} if shared else buffers


class ParameterStore:
    """The learner's parameters in shared memory, double-buffered (version v in slot v % 2); a
    sequence counter per slot (odd while written) lets actors copy without a lock, so an actor
    killed mid-copy blocks no one.

    The lock-free protocol relies on x86's memory ordering (stores become visible in program order,
    loads are not reordered with other loads): a reader that sees the counter even and unchanged
    around its copy saw the whole slot. On weakly ordered CPUs (ARM, POWER) it would need memory
    fences or a lock; no such machine was tested."""

    def __init__(self, num_params: int):
        self.slots = torch.zeros(2, num_params).share_memory_()
        self.seq = torch.zeros(2, dtype=torch.long).share_memory_()
        self.slot_version = torch.full((2,), -1, dtype=torch.long).share_memory_()
        self.version = torch.full((1,), -1, dtype=torch.long).share_memory_()

    def publish(self, flat: torch.Tensor, version: int) -> None:
        slot = version % 2
        self.seq[slot] += 1
        self.slots[slot].copy_(flat)
        self.slot_version[slot] = version
        self.seq[slot] += 1
        self.version[0] = version

    def read(self, out: torch.Tensor, version: Optional[int] = None, give_up=lambda: False) -> int:
        """Copy version `version` (None: the latest) into out; waits until it is published (-1 if
        give_up())."""
        while True:
            wanted = int(self.version[0]) if version is None else version
            if wanted < 0 or int(self.version[0]) < wanted:
                if give_up():
                    return -1
                time.sleep(0.0005)
                continue
            slot = wanted % 2
            before = int(self.seq[slot])
            if before % 2 == 0 and int(self.slot_version[slot]) == wanted:
                out.copy_(self.slots[slot])
                if int(self.seq[slot]) == before:
                    return wanted
            if version is not None and int(self.version[0]) > wanted + 1:
                raise RuntimeError(f"parameter version {wanted} was overwritten before it was read")


def flat_params(net: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()]).cpu()


def load_flat(net: nn.Module, flat: torch.Tensor) -> None:
    torch.nn.utils.vector_to_parameters(flat, net.parameters())


class LocalLink:
    """A local actor's way to the learner: shared block buffers, index queues, the parameter
    store, the heartbeats (below the fold)."""

    def __init__(self, buffers: dict, store: ParameterStore, free_q, full_q, heartbeats, actor: int):
        self.buffers = buffers
        self.store = store
        self.free_q = free_q
        self.full_q = full_q
        self.heartbeats = heartbeats
        self.actor = actor
        self.index = None

    def beat(self) -> None:
        self.heartbeats.beat(self.actor)

    def block(self) -> dict:
        """A free buffer to fill (waits for one, beating every second: the backpressure of the rate limit)."""
        while True:
            self.beat()
            try:
                self.index = self.free_q.get(timeout=1.0)
                break
            except queue.Empty:
                pass
        return {key: value[self.index] for key, value in self.buffers.items()}

    def send(self) -> None:
        self.full_q.put(self.index)

    def latest(self) -> int:
        return int(self.store.version[0])

    def params(self, out: torch.Tensor, version: Optional[int] = None) -> int:
        return self.store.read(out, version, give_up=self.still_waiting)

    def still_waiting(self) -> bool:
        """Beat while the store waits for a version (deterministic mode); never give up."""
        self.beat()
        return False


class SequenceBuilder:
    """Cuts each env's stream into the paper's sequences, vectorized over the envs: P = burn_in +
    sequence_length steps, the last sequence_length of them with a loss; a new sequence every
    sequence_length - sequence_overlap steps, its burn-in prefix the steps before it (padding at an
    episode's start); an episode's end closes the sequence early (padding after it). A sequence
    keeps the LSTM state before its first step, x_0..x_P (the last one only to bootstrap from;
    images as their frames, each once: frames_once) with the action and reward before each (-1 and
    0 at an episode's first step; padding holds 0, unread), and its n-step returns, discounts and
    bootstrap steps, cut at its end."""

    def __init__(self, num_envs: int, burn_in: int, length: int, overlap: int, n: int, gamma: float, obs, hidden: int):
        self.steps = burn_in + length
        self.burn_in = burn_in
        self.n = n
        self.gamma = gamma
        self.period = length - overlap
        steps = self.steps
        # the sequence each env is filling
        self.filling = {
            "obs": np.zeros((num_envs, steps + 1) + obs.shape[1:], dtype=obs.dtype),
            "obs_valid": np.zeros((num_envs, steps + 1)),
            "state": np.zeros((num_envs, steps + 1, 2, hidden), dtype=np.float32),
            "actions": np.zeros((num_envs, steps), dtype=np.int64),
            "rewards": np.zeros((num_envs, steps)),
            "terms": np.zeros((num_envs, steps)),
            "prev_action": np.zeros((num_envs, steps + 1), dtype=np.int64),
            "prev_reward": np.zeros((num_envs, steps + 1)),
        }
        # where each env's next step goes
        self.position = np.full(num_envs, burn_in)
        self.rows = np.arange(num_envs)
        # each env's previous step (-1: none)
        self.last_action = np.full(num_envs, -1)
        self.last_reward = np.zeros(num_envs)

    def add(self, obs, state, action, reward, term, done, next_obs, real) -> Optional[dict]:
        """One batch step: x_t, the LSTM state (h, c) before it, a_t, r_t, terminated, terminated or
        truncated, x_t+1; real is False on envpool's reset step (which stores nothing). Returns the
        sequences it closed (their envs in "env") or None."""
        filling = self.filling
        position = self.position
        steps = self.steps
        rows = self.rows[real]
        at = position[rows]
        filling["obs"][rows, at] = obs[rows]
        filling["obs_valid"][rows, at] = 1.0
        filling["state"][rows, at] = state[rows]
        filling["actions"][rows, at] = action[rows]
        filling["rewards"][rows, at] = reward[rows]
        filling["terms"][rows, at] = term[rows]
        filling["prev_action"][rows, at] = self.last_action[rows]
        filling["prev_reward"][rows, at] = self.last_reward[rows]
        self.last_action[rows] = action[rows]
        self.last_reward[rows] = reward[rows]
        position[rows] += 1
        # sequences to close: full, or their episode ended
        closing = self.rows[real & (done | (position == steps))]
        if not len(closing):
            return None
        at = position[closing]
        # x_P, or the final observation
        filling["obs"][closing, at] = next_obs[closing]
        filling["obs_valid"][closing, at] = 1.0
        filling["prev_action"][closing, at] = self.last_action[closing]
        filling["prev_reward"][closing, at] = self.last_reward[closing]
        count = len(closing)
        # the sequence's last step ends its n-step windows
        last = np.zeros((count, steps + self.n - 1))
        last[np.arange(count), at - 1] = 1.0
        pad = np.zeros((count, self.n - 1))
        rewards = np.concatenate([filling["rewards"][closing], pad], 1)
        terms = np.concatenate([filling["terms"][closing], pad], 1)
        G, discounts, boot = n_step_targets(rewards.T, terms.T, last.T, self.gamma, self.n)
        step = np.arange(steps)
        sequences = {
            "obs": frames_once(filling["obs"][closing], filling["obs_valid"][closing]),
            "obs_valid": filling["obs_valid"][closing],
            "actions": filling["actions"][closing],
            "returns": G.T,
            "prev_action": filling["prev_action"][closing],
            "prev_reward": filling["prev_reward"][closing],
            "discounts": discounts.T,
            "boot": boot.T,
            "train": (step >= self.burn_in) & (step < at[:, None]),
            "state": filling["state"][closing, 0],
            "env": closing,
        }
        full = closing[~done[closing]]
        ended = closing[done[closing]]
        for value in filling.values():
            # a full sequence: the next one starts `period` steps later
            value[full, : value.shape[1] - self.period] = value[full, self.period :]
            # an ended episode: the next sequence starts with a padded burn-in prefix
            value[ended] = 0
        filling["obs_valid"][full, steps + 1 - self.period :] = 0.0
        position[full] = position[full] - self.period
        position[ended] = self.burn_in
        self.last_action[ended] = -1
        self.last_reward[ended] = 0.0
        return sequences


def actor_loop(actor: int, args: Args, spec, link, local: bool = True) -> None:
    """One actor: step an envpool batch, env j epsilon_i-greedy (i = actor * num_envs + j) with a
    local recurrent Q-network, cut the envs' streams into sequences (SequenceBuilder), send them in
    blocks (once num_envs are closed) with initial priorities from its own network. Parameters: the
    latest every actor_update_interval steps (remote: with each block's reply); deterministic mode:
    block s (round s) uses version_for(s); with --restart-every its envs start afresh at every
    restart point."""
    # a local actor dies with the learner; local or remote, the stop signals are the learner's (below the fold)
    tie_to_learner(die_with_parent=local)
    torch.set_num_threads(1)
    # the deterministic mode's rounds, restart points and parameter versions (below the fold)
    schedule = Schedule(args)
    num_envs = args.num_envs
    num_actions = spec.action_space.n
    rescaling = rescaling_eps(args, spec)
    epsilon = epsilons(args.epsilon, args.epsilon_alpha, args.total_actors * num_envs)
    epsilon = epsilon[actor * num_envs : (actor + 1) * num_envs]
    net = make_network(args, spec)
    flat = flat_params(net)
    loaded = -1
    sequence = args.start_round
    since_refresh = 0
    envs = None
    while True:
        # a start, or a restart point (--restart-every): envs, exploration, sequences and states begin afresh
        if envs is None or schedule.restart_point(sequence):
            if envs is not None:
                envs.close()
            seed = env_seed(args, actor, sequence)
            envs = make_env(args.env_id, num_envs, seed, args.env_threads or 1)
            rng = np.random.default_rng(seed)
            state = net.initial_state(num_envs)
            obs = observe(envs.reset()[0], args.mask_velocity)
            builder = SequenceBuilder(
                num_envs,
                args.burn_in,
                args.sequence_length,
                args.sequence_overlap,
                args.n_step,
                args.gamma,
                obs,
                net.hidden,
            )
            episode_return = np.zeros(num_envs)
            episode_length = np.zeros(num_envs)
            prev_done = np.zeros(num_envs, dtype=bool)
            # -1: no action before an episode's first step
            prev_action = torch.full((num_envs, 1), -1)
            prev_reward = torch.zeros(num_envs, 1)
        # deterministic mode: the parameter version the schedule gives this block (None: the latest, below)
        wanted = schedule.version_for(sequence)
        if wanted is not None and wanted != loaded:
            loaded = link.params(flat, wanted)
            if loaded < 0:
                return
            load_flat(net, flat)
        block = link.block()
        if not local and link.latest() < 0:
            return
        block["ep_return"].fill_(float("nan"))
        count = 0
        steps = 0
        while count < num_envs:
            link.beat()
            due = loaded < 0 or since_refresh >= args.actor_update_interval
            if not args.deterministic and due and link.latest() != loaded:
                loaded = link.params(flat)
                since_refresh = 0
                load_flat(net, flat)
            since_refresh += 1
            steps += 1
            with torch.no_grad():
                q, new_state = net(
                    torch.as_tensor(obs)[:, None], prev_action, prev_reward, torch.ones(num_envs, 1), state
                )
            explore = rng.random(num_envs) < epsilon
            action = np.where(explore, rng.integers(num_actions, size=num_envs), q[:, 0].argmax(-1).numpy())
            next_obs, reward, term, trunc, info = envs.step(action)
            next_obs = observe(next_obs, args.mask_velocity)
            done = term | trunc
            # not real: envpool's reset step after an episode's end, which stores nothing
            real = ~prev_done
            closed = builder.add(obs, torch.stack(state, 1).numpy(), action, reward, term, done, next_obs, real)
            episode_return = episode_return + reward * real
            episode_length = episode_length + real
            if closed is not None:
                closed_envs = closed["env"]
                rows = slice(count, count + len(closed_envs))
                closed["ep_return"] = np.where(done[closed_envs], episode_return[closed_envs], np.nan)
                closed["ep_length"] = episode_length[closed_envs]
                for key, value in closed.items():
                    block[key][rows] = torch.as_tensor(value)
                count += len(closed_envs)
                ended = closed_envs[done[closed_envs]]
                episode_return[ended] = 0.0
                episode_length[ended] = 0
            # after a reset step the new episode starts from a zero state
            reset = torch.as_tensor(prev_done)[:, None]
            prev_action = torch.where(reset, -1, torch.as_tensor(action)[:, None])
            prev_reward = torch.where(reset, 0.0, torch.as_tensor(reward, dtype=torch.float32)[:, None])
            obs = next_obs
            prev_done = done
            state = tuple(torch.where(reset, 0.0, x) for x in new_state)
        # initial priorities, from the actor's own network (online and target alike)
        with torch.no_grad():
            sequences = {key: block[key][:count] for key in SEQUENCE_KEYS}
            _, priorities = r2d2_loss(net, net, sequences, torch.ones(count), args.burn_in, args.eta, rescaling)
        block["priorities"][:count] = priorities
        block["meta"].copy_(torch.tensor([loaded, actor, sequence, count, steps]))
        link.send()
        sequence += 1


def next_block(args: Args, health, buffers: dict, full_q, pending: dict, expected: tuple) -> int:
    """A filled buffer's index, watching the actors meanwhile (health.check: one dead, or silent
    for --actor-timeout, ends the run). Deterministic: block `expected` = (sequence, actor) only."""
    while True:
        if args.deterministic and expected in pending:
            return pending.pop(expected)
        try:
            index = full_q.get(timeout=0.5)
        except queue.Empty:
            index = None
        # checked at every block: the other actors may keep the queue busy
        health.check()
        if index is not None and not args.deterministic:
            return index
        if index is not None:
            _, actor, sequence, _, _ = buffers["meta"][index].tolist()
            pending[(sequence, actor)] = index


def take_block(args: Args, buffers: dict, index: int, replay, free_q, epsilon, progress: dict, stats: dict) -> list:
    """The block intake: the block's sequences into the replay with their priorities, its buffer
    back to the actors, its steps counted, its policy lag noted. Returns its ended episodes as
    (return, length, epsilon_i)."""
    insert_start = time.time()
    version, actor, _, count, steps = buffers["meta"][index].tolist()
    items = {key: buffers[key][index][:count] for key in SEQUENCE_KEYS}
    replay.add(items, buffers["priorities"][index][:count])
    stats["insert_s"] += time.time() - insert_start
    stats["inserted"] += count
    episode_return = buffers["ep_return"][index][:count].clone()
    episode_length = buffers["ep_length"][index][:count].clone()
    sequence_epsilon = epsilon[actor][buffers["env"][index][:count]]
    free_q.put(index)
    stats["blocks"] += 1
    progress["global_step"] += steps * args.num_envs
    # a version no longer listed is older than any listed one: the lag is at least the oldest's
    versions = stats["versions"]
    stats["lag"] = progress["update"] - versions.get(version, min(versions.values()))
    progress["policy_lag_sum"] += stats["lag"]
    progress["policy_lag_count"] += 1
    ended = ~torch.isnan(episode_return)
    episode_epsilon = sequence_epsilon[ended].tolist()
    return list(zip(episode_return[ended].tolist(), episode_length[ended].tolist(), episode_epsilon, strict=True))


def updates_due(args: Args, progress: dict, replay, segment_start: dict) -> bool:
    """The rate limit: one learner update per steps_per_update environment steps after
    learning_starts (both counted from `segment_start`, where the replay last started empty: this run
    segment's start, or with a replay restored from the checkpoint, an earlier one's)."""
    steps = progress["global_step"] - segment_start["global_step"] - args.learning_starts
    updates = progress["update"] - segment_start["update"]
    return steps >= 0 and replay.size > 0 and updates < steps / args.steps_per_update


def learner_step(args: Args, q_net, target_net, optimizer, replay, rng, progress: dict, stats: dict, rescaling):
    """One learner update: a prioritized batch of sequences, the burn-in and the weighted double-Q
    loss (value rescaling with h's epsilon `rescaling`, None: off), the gradient clipped to
    max_grad_norm, Adam (learning rate annealed linearly to 0), the sequences' new priorities; every
    target_network_frequency updates the target network copies the online one."""
    # the flat parameter vector the optimizer steps (the networks' parameters are views of it)
    flat = optimizer.param_groups[0]["params"][0]
    sample_start = time.time()
    indices, batch, weights = replay.sample(args.batch_size, args.beta, rng)
    learn_start = time.time()
    loss, priorities = r2d2_loss(q_net, target_net, batch, weights, args.burn_in, args.eta, rescaling)
    # zeroed in place: the parameters' gradients are views of flat.grad
    optimizer.zero_grad(set_to_none=False)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([flat], args.max_grad_norm)
    # the last block may pass total_timesteps
    fraction = max(0.0, 1.0 - progress["global_step"] / args.total_timesteps)
    optimizer.param_groups[0]["lr"] = args.learning_rate * fraction if args.anneal_lr else args.learning_rate
    optimizer.step()
    learn_end = time.time()
    replay.update_priorities(indices, priorities)
    progress["update"] += 1
    stats["sample_s"] += (learn_start - sample_start) + (time.time() - learn_end)
    stats["sampled"] += args.batch_size
    stats["learn_s"] += learn_end - learn_start
    stats["losses"] = torch.stack([loss.detach(), priorities.mean()])
    if progress["update"] % args.target_network_frequency == 0:
        target_net.load_state_dict(q_net.state_dict())


def publish(args: Args, q_net, store: ParameterStore, progress: dict, stats: dict, schedule) -> None:
    """Parameters for the actors: after every block (deterministic mode: after every round of
    blocks), numbered by the schedule."""
    version = schedule.version_after(stats["blocks"])
    if version is None:
        return
    if args.deterministic:
        # whole rounds taken: the round a resumed run starts at
        progress["round"] = version
    store.publish(flat_params(q_net), version)
    stats["versions"][version] = progress["update"]
    # no actor holds parameters that old
    stats["versions"].pop(version - 100 * args.num_buffers, None)


def evaluate(
    net: QNetwork,
    env_id: str,
    episodes: int,
    seed: int,
    device,
    mask_velocity: bool = False,
    video_dir: Optional[str] = None,
):
    """Returns of `episodes` episodes of the greedy policy, one env per episode (no bias to short
    episodes). With video_dir, episode 0 is also written there as an MP4."""
    render_mode = "rgb_array" if video_dir is not None else None
    envs = make_env(env_id, episodes, seed, render_mode=render_mode)
    video = open_video(video_dir) if video_dir is not None else None
    obs, _ = envs.reset()
    returns = np.zeros(episodes)
    done = np.zeros(episodes, dtype=bool)
    state = net.initial_state(episodes, device)
    action = torch.full((episodes, 1), -1, device=device)
    reward = torch.zeros(episodes, 1, device=device)
    while not done.all():
        if video is not None and not done[0]:
            video.append_data(envs.render()[0])
        with torch.no_grad():
            x = torch.as_tensor(observe(obs, mask_velocity), device=device)[:, None]
            q, state = net(x, action, reward, torch.ones(episodes, 1, device=device), state)
        action = q[:, 0].argmax(-1, keepdim=True)
        obs, env_reward, term, trunc, info = envs.step(action[:, 0].cpu().numpy())
        reward = torch.as_tensor(env_reward, dtype=torch.float32, device=device)[:, None]
        returns += env_reward * ~done
        done |= term | trunc
    if video is not None:
        video.close()
    envs.close()
    return returns


# ----------------------------------------------------------------------------------------------- main
def main(args: Args) -> int:
    # stop signals, flag checks, torchrun's groups, the actor count, seeds and threads: all below the fold
    run = Run(args)
    spec = envpool.make_spec(args.env_id)
    num_params = sum(p.numel() for p in make_network(args, spec).parameters())
    if args.rank > 0:
        # a remote actor (torchrun's ranks 1, 2, ...): its index follows the learner's local actors; its blocks go
        # to rank 0 through torch.distributed, where a bridge thread queues them like a local actor's
        link = run.remote_link(spec, num_params)
        actor_loop(args.num_actors + args.rank - 1, args, spec, link, local=False)
        return run.finish()
    q_net = make_network(args, spec).to(run.device)
    target_net = make_network(args, spec).to(run.device)
    flat = flatten_parameters(q_net)
    # on CUDA fused: Adam's elementwise operations in one kernel
    optimizer = torch.optim.Adam([flat], lr=args.learning_rate, eps=args.adam_eps, fused=flat.is_cuda)
    # fresh progress, or a checkpoint's with --resume (the networks and the optimizer state loaded in place); every
    # rank then takes rank 0's actor count, run segment and first round (each actor's index, seeds and epsilon_i)
    progress = run.restore(q_net, target_net, optimizer)
    epsilon = torch.as_tensor(epsilons(args.epsilon, args.epsilon_alpha, args.total_actors * args.num_envs))
    epsilon = epsilon.view(args.total_actors, -1)
    rescaling = rescaling_eps(args, spec)
    # Shared memory and actors first (fork before the learner computes anything), then the replay and logging.
    buffers = block_buffers(args, spec, args.num_buffers)
    store = ParameterStore(num_params)
    store.publish(flat_params(q_net), args.start_round)
    # the local actors' processes and a bridge thread per remote actor; the queues pass buffer indices
    heartbeats = Heartbeats(args.num_actors)
    control = {}
    actors, bridges, free_q, full_q = start_actors(args, spec, run.groups, buffers, store, control, heartbeats)
    # the learner's look at them where it waits (dead, silent, a lost link): below the fold
    health = ActorHealth(args, actors, heartbeats, control)
    # whatever ends this (an exception too: a replay too large), no actor outlives it; an actor's death ends the run
    with run.actors_running(health, bridges, full_q):
        fields = {key: buffers[key][0, 0] for key in SEQUENCE_KEYS}
        replay = PrioritizedReplay(args.buffer_size, fields, args.alpha, args.priority_eps, run.device)
        # with --restart-every, the checkpoint's replay (loaded in place); the rate limit counts from where it began
        segment_start = run.restore_replay(replay)
        # the writer and this segment's counters (blocks taken, versions published, timings); training starts
        stats = run.start_training(epsilon)
        # deterministic mode: blocks that came before their turn
        pending = {}
        while progress["global_step"] < args.total_timesteps:
            # COLLECT: the next block into the replay (deterministic mode: by round, then actor)
            expected = run.schedule.expected_block(stats["blocks"])
            index = next_block(args, health, buffers, full_q, pending, expected)
            finished = take_block(args, buffers, index, replay, free_q, epsilon, progress, stats)
            # LEARN: as many updates as the rate limit allows
            while updates_due(args, progress, replay, segment_start):
                learner_step(args, q_net, target_net, optimizer, replay, run.schedule.rng, progress, stats, rescaling)
            # PUBLISH: parameters for the actors
            publish(args, q_net, store, progress, stats, run.schedule)
            # BOOKKEEPING: clocks, episodes (the least-exploring envs' count), logs, checkpoints; a stop signal ends
            # the loop after a checkpoint
            if run.end_block(finished):
                break
        # unless a signal stopped the run: the actors stop, then the final evaluation and summary.json
        run.summarize()
    # the writer and the process group; exit 1 when an actor died
    return run.finish()


# ==== infrastructure: flags, schedule, actors' health, checkpoints, torchrun, logging; nothing below is R2D2 ====
@dataclass
class Infra:
    """The flags that keep a run alive, watched, reproducible and resumable, not what it learns."""

    exp_name: str = "r2d2"  # the name of this experiment (part of the run name)
    preset: Optional[Literal[tuple(PRESETS)]] = None  # start from a preset's values (PRESETS, above the fold)
    torch_deterministic: bool = True  # deterministic CUDA kernels (the CPU kernels used here are anyway)
    cuda: bool = True  # run the learner on CUDA when it is available (actors always run on the CPU)
    track: bool = False  # log to Weights & Biases as well as TensorBoard
    wandb_project_name: str = "distrl"  # the wandb project name
    wandb_entity: Optional[str] = None  # the wandb entity (team)
    capture_video: bool = False  # write the first evaluation episode as runs/<run_name>/videos/eval_episode0.mp4
    save_model: bool = False  # write the final weights (state_dict) to runs/<run_name>/model.pt
    eval_episodes: int = 10  # episodes of the final, greedy policy to evaluate at the end
    threshold_epsilon: float = 0.01
    """only envs with epsilon_i at most this (or the least) count in train_return_last20 and
    time_to_threshold"""
    torch_threads: int = 0  # learner's torch threads (0: 1; actors always use 1)
    env_threads: int = 0  # envpool threads per actor (0: 1)
    deterministic: bool = False
    """blocks inserted in a fixed order (by round, then actor), actors act with the parameters of
    the round before last: bitwise reproducible on CPU, at the price of actors waiting"""
    restart_every: int = 0
    """with --deterministic: every this many rounds the actors start afresh (a restart point) and
    checkpoints hold the replay, so that a checkpoint written there resumes bitwise as the
    uninterrupted run (0: only at the start)"""
    # write runs/<run_name>/checkpoint.pt every this many learner updates (0: on signals only; with
    # --restart-every: at the first restart point after each such count)
    checkpoint_every: int = 0
    # continue from runs/<run_name>/checkpoint.pt when it exists (the replay is refilled, except with --restart-every)
    resume: bool = False
    collective_timeout: float = 600.0  # seconds a rank waits for another before it fails (torch's default: 1800)
    actor_timeout: float = 60.0  # seconds a local actor may fall silent (stopped, hung; 5x that to start): the job ends


# every flag of the command line, the algorithm's first (in --help too)
@dataclass
class RunArgs(Infra, Args):
    pass


# a checkpoint of another format version ends the run with exit 2 (read_checkpoint)
CHECKPOINT_VERSION = 1


class Run:
    """The infrastructure of one run, as main() uses it: set-up, restore, the actors' start, watch and stop, the
    determinism schedule, clocks, the bookkeeping of each block (episodes, TensorBoard, progress lines,
    checkpoints, stop signals) and the end (the final evaluation, summary.json, closing the writer and the process
    group)."""

    def __init__(self, args: RunArgs):
        # first of all: a signal during start-up ends in a checkpoint (forked processes keep the handlers)
        self.stop = install_stop_handlers()
        # envpool's spaces warn that they cast their float64 bounds to float32
        warnings.filterwarnings("ignore", message=".*precision lowered by casting.*")
        validate(args)
        self.device, self.groups = setup_distributed(args)
        args.num_actors = default_num_actors(args)
        args.run_name = f"{args.env_id}__{args.exp_name}__{args.seed}"
        self.run_dir = os.path.join("runs", args.run_name)
        self.checkpoint_path = os.path.join(self.run_dir, "checkpoint.pt")
        seed_everything(args, self.device)
        keep_freed_memory()
        self.args = args
        self.threshold = envpool.make_spec(args.env_id).reward_threshold
        self.stopped = False
        self.exit_code = 0
        self.bridges = []
        self.writer = None

    def remote_link(self, spec, num_params: int):
        """A remote actor's link to its bridge on rank 0, once rank 0 has said how many actors there are and where
        the run segment starts (agree_on_actors)."""
        agree_on_actors(self.args, 0, 0)
        return RemoteLink(self.args, spec, self.groups[self.args.rank], num_params)

    def restore(self, q_net, target_net, optimizer) -> dict:
        """Fresh progress, or the checkpoint's with --resume (the networks and the optimizer state loaded in place; a
        resumed run is the next run segment); then every rank takes rank 0's run segment, first round and actor
        count (agree_on_actors), where the determinism schedule starts. The run keeps the networks and the optimizer
        for its checkpoints and summary."""
        args = self.args
        self.q_net = q_net
        self.target_net = target_net
        self.optimizer = optimizer
        self.progress = restore(args, q_net, optimizer, self.device, self.checkpoint_path, target_net)
        agree_on_actors(args, self.progress["segment"], self.progress["round"] if args.deterministic else 0)
        self.schedule = Schedule(args)
        return self.progress

    @contextlib.contextmanager
    def actors_running(self, health, bridges: list, full_q):
        """Whatever ends the block, an exception too, every local actor is killed and reaped: they ignore the SIGTERM
        that the interpreter's exit sends them, which would wait for them for ever. An actor's death (ActorDied)
        ends the block with one line on stderr and the run with exit 1. The run keeps the bridges (stopped at its
        end) and the queue of filled buffers (its length is logged)."""
        self.health = health
        self.bridges = bridges
        self.full_q = full_q
        try:
            yield
        except ActorDied as e:
            print(f"{os.path.basename(sys.argv[0])}: error: {e}; stopping", file=sys.stderr, flush=True)
            self.exit_code = 1
        finally:
            self.health.stop()

    def restore_replay(self, replay) -> dict:
        """The checkpoint's replay, loaded in place, where it has one (written with --restart-every). Returns the
        counts the rate limit runs from (restore_replay). The run keeps the replay for its checkpoints, logs and
        summary."""
        self.replay = replay
        self.segment_start = restore_replay(replay, self.progress, self.checkpoint_path)
        # the checkpoint's copy of the replay was freed with it
        release_freed_memory()
        return self.segment_start

    def start_training(self, epsilon: torch.Tensor) -> dict:
        """Rank 0's writer and this segment's learner counters (new_stats), returned; training time counts from
        here. Episodes of the envs that explore least (epsilon_i at most --threshold-epsilon, or the least one)
        count towards the threshold."""
        args = self.args
        self.writer = open_writer(args, self.run_dir, self.progress)
        self.stats = new_stats(self.progress, args.start_round)
        # episodes of these envs count for the threshold
        self.counted_epsilon = max(args.threshold_epsilon, epsilon.min().item())
        self.last_print = 0.0
        self.saved_at = self.progress["update"]
        self.clock = start_clock(self.progress)
        return self.stats

    def end_block(self, finished: list) -> bool:
        """One block's bookkeeping: the clocks, its ended episodes (those of the least-exploring envs count towards
        the threshold), the log (the learner's scalars every 2 s) and progress line, a checkpoint when due or asked
        for. Returns True when a stop signal came (checkpoint written: the loop ends)."""
        args = self.args
        progress = self.progress
        self.clock = advance_clock(progress, self.clock)
        counted = [episode_return for episode_return, _, epsilon in finished if epsilon <= self.counted_epsilon]
        record_returns(progress, counted, self.threshold)
        due = time.time() - self.last_print >= 2.0
        scalars = learner_scalars(progress, self.stats, self.optimizer, self.replay, self.full_q) if due else {}
        log_update(self.writer, progress, finished, scalars)
        self.last_print = print_progress(progress, args.total_timesteps, self.last_print)
        # SIGTERM/SIGUSR1 (SLURM preemption) or Ctrl-C: save, then exit cleanly
        self.stopped = self.stop["signal"] != 0
        if self.stopped or checkpoint_due(args, progress, self.stats, self.saved_at, self.schedule):
            networks = (self.q_net, self.target_net, self.optimizer)
            write_checkpoint(args, self.checkpoint_path, progress, *networks, self.replay, self.segment_start)
            self.saved_at = progress["update"]
        if self.stopped:
            announce_stop(progress, self.checkpoint_path)
        return self.stopped

    def summarize(self) -> None:
        """Unless a stop signal ended the loop (also after resuming a checkpoint past the budget): the actors stop,
        their CPU is the final evaluation's now; then summary.json and, with --save-model, the weights."""
        if self.stopped:
            return
        self.clock = advance_clock(self.progress, self.clock)
        self.health.stop()
        write_summary(
            self.args,
            self.q_net,
            self.writer,
            self.progress,
            self.clock,
            self.device,
            self.run_dir,
            self.stats,
            self.replay,
        )

    def finish(self) -> int:
        """Rank 0's writer (and wandb) closed, then the process group left (after an actor's death at once: torchrun
        stops the remote actors). Returns the exit code: 1 when an actor died."""
        if self.writer is not None:
            close_writer(self.args, self.writer)
        finish_distributed(self.args, self.exit_code, self.bridges)
        return self.exit_code


class Schedule:
    """The deterministic mode's schedule (--deterministic), alike in every run: blocks go into the replay by
    round, then actor (round s: block s of every actor), and block s is collected with parameter version
    version_for(s); with --restart-every, restart points. It holds the learner's sampling generator (`rng`),
    which starts afresh at each restart point. Without --deterministic: no restart points, every block
    publishes a version and actors take the latest."""

    def __init__(self, args: RunArgs):
        self.args = args
        self.rng = self.learner_rng(args.start_round)

    def restart_point(self, round_: int) -> bool:
        """With --restart-every: every --restart-every-th round the actors start afresh (new envs seeded
        for it, exploration reseeded, no partial sequences, zero recurrent states, the parameters of that
        very round) and the learner reseeds its sampling, in every run alike, so that a run resumed from a
        checkpoint there (which holds the replay) goes on bitwise as the uninterrupted one."""
        args = self.args
        return args.deterministic and args.restart_every > 0 and round_ % args.restart_every == 0

    def version_for(self, sequence: int) -> Optional[int]:
        """Deterministic mode: the parameter version that an actor's block `sequence` (round) is collected
        with: that of the round before last, published once the learner has taken round sequence - 2,
        but at the segment's first round and at a restart point the current one (a round of waiting).
        Otherwise None: the latest, whichever it is."""
        args = self.args
        if not args.deterministic:
            return None
        start = args.start_round
        if args.restart_every:
            start = max(start, sequence - sequence % args.restart_every)
        return max(sequence - 1, start)

    def version_after(self, blocks: int) -> Optional[int]:
        """The version the learner publishes once it has taken `blocks` blocks in this run segment: one per
        block, or in deterministic mode one per round of blocks (None mid-round: none)."""
        args = self.args
        if not args.deterministic:
            return blocks
        if blocks % args.total_actors != 0:
            return None
        return args.start_round + blocks // args.total_actors

    def expected_block(self, blocks: int) -> tuple:
        """(round, actor) of the block the learner takes after `blocks` blocks in deterministic mode; at a
        restart point's first block the learner's sampling generator starts afresh."""
        args = self.args
        round_, actor = divmod(args.start_round * args.total_actors + blocks, args.total_actors)
        if actor == 0 and self.restart_point(round_):
            self.rng = self.learner_rng(round_)
        return round_, actor

    def learner_rng(self, round_: int) -> np.random.Generator:
        """The learner's sampling generator: one per run segment, or with --restart-every one per restart
        point (and per segment start)."""
        args = self.args
        start = round_ if args.restart_every else args.segment
        return np.random.default_rng(args.seed + 10**9 + start)


# ----------------------------------------------------------------------------------------------- actors' health
class Heartbeats:
    """One shared clock reading per local actor, written as it steps its envs and while it waits for a
    free buffer: a stopped or hung actor falls silent while its process lives on, which its exit
    code cannot show."""

    # an actor's first beat comes once it has built its envs and network: until then it may take this many
    # times the timeout (a machine with many more actors than cores starts them slowly)
    STARTUP_GRACE = 5

    def __init__(self, count: int):
        # 0: no beat yet
        self.last = torch.zeros(count, dtype=torch.float64).share_memory_()
        # the learner's side: when it last looked, and since when silence counts
        self.looked = time.monotonic()
        self.since = self.looked

    def beat(self, actor: int) -> None:
        """An actor is alive: now."""
        self.last[actor] = time.monotonic()

    def silent_actor(self, timeout: float) -> Optional[tuple]:
        """The first actor silent for over `timeout` seconds (STARTUP_GRACE times it before its first beat)
        and how long, or None. When the learner itself was away for over half of the timeout (the whole
        job suspended, say), silence counts from the learner's return."""
        now = time.monotonic()
        if now - self.looked > timeout / 2:
            self.since = now
        self.looked = now
        grace = self.STARTUP_GRACE * timeout
        for actor, last in enumerate(self.last.tolist()):
            if last == 0 and now - self.since > grace:
                return actor, f"not started after {grace:g} s, {self.STARTUP_GRACE} x --actor-timeout"
            if last != 0 and now - max(last, self.since) > timeout:
                return actor, f"silent for {timeout:g} s"
        return None


class ActorDied(RuntimeError):
    """An actor (or the link to a remote one) is gone: the job ends non-zero."""


class ActorHealth:
    """The learner's watch over its actors, where it waits for their blocks (next_block): a local actor's
    death (its exit code), its silence (Heartbeats: stopped or hung for --actor-timeout, STARTUP_GRACE times
    that before its first beat), a remote actor's broken link (the error its bridge leaves in `control`)."""

    def __init__(self, args: RunArgs, actors: list, heartbeats: Heartbeats, control: dict):
        self.actors = actors
        self.heartbeats = heartbeats
        self.control = control
        self.timeout = args.actor_timeout

    def check(self) -> None:
        """ActorDied, naming the actor, when one is gone."""
        for actor, process in enumerate(self.actors):
            if process.exitcode is not None:
                raise ActorDied(f"actor {actor} (pid {process.pid}) exited with code {process.exitcode}")
        silent = self.heartbeats.silent_actor(self.timeout)
        if silent is not None:
            actor, how_long = silent
            raise ActorDied(f"actor {actor} (pid {self.actors[actor].pid}) {how_long} (stopped or hung)")
        if "error" in self.control:
            raise ActorDied(self.control["error"])

    def stop(self) -> None:
        """Every local actor killed and reaped, the bridges told to end (stop_actors)."""
        stop_actors(self.actors, self.control)


def tie_to_learner(die_with_parent: bool = True) -> None:
    """An actor: a local one dies with its learner, whatever kills the learner (a remote actor is a rank of its
    own, which torchrun stops), and local or remote it ignores the stop signals, which are the learner's."""
    if die_with_parent:
        # die with the learner, whatever kills it (PR_SET_PDEATHSIG)
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    # local or remote, the learner turns signals (Ctrl-C reaches every process) into a checkpoint
    for signal_number in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(signal_number, signal.SIG_IGN)


def start_actors(
    args: RunArgs, spec, groups: dict, buffers: dict, store: ParameterStore, control: dict, heartbeats: Heartbeats
):
    """Fork the local actors over the shared buffers (all free at first) and start one bridge thread
    per remote rank. Returns (actor processes, bridge threads, free queue, full queue)."""
    context = mp.get_context("fork")
    free_q = context.Queue(maxsize=args.num_buffers)
    full_q = context.Queue(maxsize=args.num_buffers)
    for index in range(args.num_buffers):
        free_q.put(index)
    actors = []
    for actor in range(args.num_actors):
        link = LocalLink(buffers, store, free_q, full_q, heartbeats, actor)
        actors.append(context.Process(target=actor_loop, args=(actor, args, spec, link), daemon=True))
    bridges = []
    for rank in range(1, args.world_size):
        bridge_args = (args.num_actors + rank - 1, rank, groups[rank], args, buffers, store, free_q, full_q, control)
        bridges.append(threading.Thread(target=remote_bridge, args=bridge_args, daemon=True))
    # a failed fork or thread, or a second Ctrl-C, here: the actors already started must not outlive it
    try:
        for process in actors:
            process.start()
        # stop_actors kills an actor wherever it is, even mid-put holding full_q's lock: then a bridge's put
        # never reaches the pipe, and this process must not wait at exit to flush it
        full_q.cancel_join_thread()
        for bridge in bridges:
            bridge.start()
    except BaseException:
        stop_actors([process for process in actors if process.pid is not None], control)
        raise
    return actors, bridges, free_q, full_q


def stop_actors(actors: list, control: dict) -> None:
    """Kill and reap every actor, with Ctrl-C ignored meanwhile: raised here, it would leave an actor running, and
    the interpreter's exit would wait for it for ever (actors ignore the SIGTERM that exit sends them)."""
    control["stop"] = True
    previous_handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    for process in actors:
        process.kill()
    for process in actors:
        process.join()
    signal.signal(signal.SIGINT, previous_handler)


# ----------------------------------------------------------------------------------------------- checks
def fail(arg: str, message: str) -> None:
    """Bad argument: one line naming it on stderr, exit code 2 (as argparse does)."""
    print(f"{os.path.basename(sys.argv[0])}: error: --{arg.replace('_', '-')}: {message}", file=sys.stderr)
    sys.exit(2)


def validate(args: RunArgs) -> None:
    # env seeds add offsets to the seed and must stay 32-bit
    if not 0 <= args.seed < 2**30:
        fail("seed", f"must be in [0, 2**30), got {args.seed}")
    positive = [
        "collective_timeout",
        "total_timesteps",
        "eval_episodes",
        "learning_rate",
        "adam_eps",
        "batch_size",
        "buffer_size",
        "n_step",
        "priority_eps",
        "target_network_frequency",
        "steps_per_update",
        "num_envs",
        "hidden_size",
        "actor_update_interval",
        "max_grad_norm",
        "sequence_length",
        "value_rescaling_eps",
    ]
    for name in positive:
        if getattr(args, name) <= 0:
            fail(name, f"must be positive, got {getattr(args, name)}")
    # a pause of the learner's own over half the timeout (the whole job suspended) restarts the silence count, and
    # it looks at its actors between updates (every 0.5 s while it waits): a shorter timeout might never fire
    if args.actor_timeout < 2:
        fail("actor_timeout", f"must be at least 2 s, got {args.actor_timeout}")
    not_negative = [
        "torch_threads",
        "env_threads",
        "num_actors",
        "num_buffers",
        "checkpoint_every",
        "restart_every",
        "learning_starts",
        "alpha",
        "epsilon_alpha",
        "threshold_epsilon",
        "burn_in",
        "sequence_overlap",
    ]
    for name in not_negative:
        if getattr(args, name) < 0:
            fail(name, f"must not be negative, got {getattr(args, name)}")
    if args.restart_every and not args.deterministic:
        fail("restart_every", "needs --deterministic (its restart points make resumes bitwise)")
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
    total_actors = default_num_actors(args) + int(os.environ.get("WORLD_SIZE", "1")) - 1
    if args.num_buffers and args.num_buffers < 2 * total_actors:
        fail("num_buffers", f"{args.num_buffers} is too few: every actor needs two")
    if args.env_id not in envpool.list_all_envs():
        fail("env_id", f"'{args.env_id}' is not an envpool environment")
    env_family = envpool.registration.registry.specs[args.env_id][0]
    if args.capture_video and env_family not in ("envpool.atari", "envpool.classic_control"):
        # envpool renders MuJoCo through a GPU context: without one, its render() ends the process
        fail("capture_video", f"'{args.env_id}' is not Atari or classic control, the envs recorded here")
    spec = envpool.make_spec(args.env_id)
    obs_space = spec.observation_space
    act_space = spec.action_space
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) not in (1, 3):
        fail("env_id", f"'{args.env_id}' has observation space {obs_space}; R2D2 here needs a flat or image Box")
    if not isinstance(act_space, gym.spaces.Discrete):
        fail("env_id", f"'{args.env_id}' has action space {act_space}; DQN needs Discrete actions")
    if args.mask_velocity and args.env_id != "CartPole-v1":
        fail("mask_velocity", f"is for CartPole-v1, not '{args.env_id}'")
    if args.network != "auto" and (args.network == "nature") != (len(obs_space.shape) == 3):
        fail("network", f"'{args.network}' does not fit observations of shape {obs_space.shape} ('{args.env_id}')")


# ----------------------------------------------------------------------------------------------- bookkeeping
def process_start_time() -> float:
    """When this process started (Linux /proc), so that startup_s also counts the imports."""
    with open("/proc/self/stat") as stat:
        start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as uptime:
        uptime_s = float(uptime.read().split()[0])
    return time.time() - uptime_s + start_ticks / os.sysconf("SC_CLK_TCK")


def new_progress(config: dict) -> dict:
    """Everything a resumed run continues from; every time in it is a whole-run figure
    (docs/conventions.md §1a). The file adds `segment`: the run segment (0, then one more per
    resume), which seeds the actors' envs (with --restart-every, the round does)."""
    return {
        "update": 0,
        "global_step": 0,
        "startup_s": 0.0,
        "train_time_s": 0.0,
        "wall_time_s": 0.0,
        "time_to_threshold_s": None,
        "threshold_step": None,
        "recent_returns": deque(maxlen=20),
        # the policy lag summed over the blocks counted: its whole-run mean in summary.json
        "policy_lag_sum": 0.0,
        "policy_lag_count": 0,
        # deterministic mode: rounds of blocks taken (one block from every actor each)
        "round": 0,
        "config": config,
        "segment": 0,
    }


def new_stats(progress: dict, first_version: int = 0) -> dict:
    """This segment's learner counters: blocks taken, published versions (version -> learner updates
    behind it, for the policy lag), the last block's lag, replay insert and sample work, learner
    compute, the last batch's losses."""
    return {
        "blocks": 0,
        "versions": {first_version: progress["update"]},
        "lag": 0,
        "insert_s": 1e-9,
        "inserted": 0,
        "sample_s": 1e-9,
        "sampled": 0,
        "learn_s": 1e-9,
        "losses": torch.zeros(2),
    }


def start_clock(progress: dict) -> float:
    """Training starts now: add this segment's start-up (process start to now) to the whole-run times."""
    now = time.time()
    startup = now - process_start_time()
    progress["startup_s"] += startup
    progress["wall_time_s"] += startup
    return now


def advance_clock(progress: dict, since: float, training: bool = True) -> float:
    """Add the time since `since` to the whole-run wall time (and training time); returns now."""
    now = time.time()
    progress["wall_time_s"] += now - since
    if training:
        progress["train_time_s"] += now - since
    return now


def record_returns(progress: dict, returns: list, threshold) -> None:
    """Finished training episodes; the first time the last-20 mean reaches the threshold is kept."""
    for episode_return in returns:
        progress["recent_returns"].append(episode_return)
        recent = progress["recent_returns"]
        reached = threshold is not None and len(recent) == recent.maxlen and np.mean(recent) >= threshold
        if reached and progress["time_to_threshold_s"] is None:
            progress["time_to_threshold_s"] = progress["train_time_s"]
            progress["threshold_step"] = progress["global_step"]


def log_update(writer, progress: dict, finished: list, scalars: dict) -> None:
    """TensorBoard points of one iteration: its finished episodes, then the named scalars. This
    file's episodes come as (return, length, epsilon_i): each env explores at its own rate, which is
    logged with the episode."""
    step = progress["global_step"]
    for episode_return, episode_length, episode_epsilon in finished:
        writer.add_scalar("charts/episodic_return", episode_return, step)
        writer.add_scalar("charts/episodic_length", episode_length, step)
        writer.add_scalar("charts/epsilon", episode_epsilon, step)
    for key, value in scalars.items():
        writer.add_scalar(key, value, step)


def learner_scalars(progress: dict, stats: dict, optimizer, replay, full_q) -> dict:
    train_time = max(progress["train_time_s"], 1e-9)
    return {
        "charts/SPS": progress["global_step"] / train_time,
        "charts/policy_lag": stats["lag"],
        "charts/learning_rate": optimizer.param_groups[0]["lr"],
        "losses/td_loss": stats["losses"][0].item(),
        "losses/abs_td_error": stats["losses"][1].item(),
        "stats/replay_size": replay.size,
        "stats/replay_inserts_per_s": stats["inserted"] / stats["insert_s"],
        "stats/replay_samples_per_s": stats["sampled"] / stats["sample_s"],
        "stats/learner_updates_per_s": progress["update"] / train_time,
        "stats/full_queue": full_q.qsize(),
    }


def print_progress(progress: dict, total_timesteps: int, last_print: float) -> float:
    """A progress line at most every 2 s (and at the end); returns when one was last printed. The
    loop runs to total_timesteps (its learner updates follow the rate limit), so the line counts
    steps."""
    now = time.time()
    if now - last_print < 2.0 and progress["global_step"] < total_timesteps:
        return last_print
    recent = progress["recent_returns"]
    mean_return = f"{np.mean(recent):.1f}" if recent else "n/a"
    sps = progress["global_step"] / max(progress["train_time_s"], 1e-9)
    print(
        f"update {progress['update']} global_step={progress['global_step']}/{total_timesteps} SPS={sps:.0f} "
        f"return(last {len(recent)})={mean_return}",
        flush=True,
    )
    return now


# ----------------------------------------------------------------------------------------------- checkpoints
def save_checkpoint(path: str, payload: dict) -> None:
    """Atomic: write a temporary file beside the target, then rename it over the target."""
    payload = {**payload, "algo": "r2d2", "version": CHECKPOINT_VERSION}
    payload["recent_returns"] = list(payload["recent_returns"])
    temporary = f"{path}.tmp{os.getpid()}"
    torch.save(payload, temporary)
    os.replace(temporary, path)


def as_typed(flag: str, value) -> str:
    """A setting of run_config as a user types it: `--learning-rate 0.00025`, `--no-anneal-lr`; the process count
    as torchrun's count."""
    if flag == "world_size":
        return f"world size {value}"
    name = flag.replace("_", "-")
    if isinstance(value, bool):
        return f"--{name}" if value else f"--no-{name}"
    if isinstance(value, (list, tuple)):
        value = " ".join(str(item) for item in value)
    return f"--{name} {value}".rstrip()


def read_checkpoint(checkpoint_path: str, progress: dict) -> dict:
    """The dict that save_checkpoint wrote, or exit 2 with one line saying what is wrong with the file,
    which is left as it is: unreadable (truncated, empty, random bytes), written by another file, of
    another format version, without this file's counters, or of a run with other flags (run_config)."""
    # a damaged file raises one of many types (from zipfile, pickle or torch), all of them meaning the same here
    try:
        checkpoint = torch.load(checkpoint_path, map_location="cpu", weights_only=True)
    except Exception as error:
        fail("resume", f"{checkpoint_path} is not a readable checkpoint ({type(error).__name__}); move it away")
    if not isinstance(checkpoint, dict):
        fail("resume", f"{checkpoint_path} holds a {type(checkpoint).__name__}, not a checkpoint; move it away")
    written_by = checkpoint.pop("algo", None)
    if written_by not in (None, "r2d2"):
        fail("resume", f"{checkpoint_path} was written by {written_by}.py, not r2d2.py; use another --exp-name")
    version = checkpoint.pop("version", "unversioned")
    if version != CHECKPOINT_VERSION:
        fail(
            "resume",
            f"{checkpoint_path} is of checkpoint format {version}, this file reads format {CHECKPOINT_VERSION}; "
            "use another --exp-name",
        )
    missing = sorted(set(progress) - set(checkpoint))
    if missing:
        fail(
            "resume",
            f"{checkpoint_path} lacks {', '.join(missing)}: not a checkpoint of r2d2.py; use another --exp-name",
        )
    recorded = checkpoint["config"]
    changed = {flag: value for flag, value in progress["config"].items() if recorded.get(flag) != value}
    if changed:
        was = ", ".join(
            f"{as_typed(flag, recorded.get(flag))} (now {as_typed(flag, value)})" for flag, value in changed.items()
        )
        fail("resume", f"{checkpoint_path} is of a run with {was}; resume with its settings or use another --exp-name")
    return checkpoint


def refuse_checkpoint(checkpoint_path: str, error: Exception) -> None:
    """Exit 2 with one line: the checkpoint's weights or optimizer state do not fit this run's."""
    problem = " ".join(str(error).split())[:300]
    fail(
        "resume", f"{checkpoint_path} does not fit this run ({type(error).__name__}: {problem}); use another --exp-name"
    )


def run_config(args: RunArgs) -> dict:
    """The flags that define the run, which a resumed run must share with its checkpoint: the algorithm's
    (`Args`) but the budget, which may grow, and the actor and buffer counts, which may follow the cores of
    the node a requeued job lands on; and two of `Infra`'s (below). Values derived from the flags
    (init=False) follow from them."""
    may_change = {"total_timesteps", "num_actors", "num_buffers"}
    config = {flag.name: getattr(args, flag.name) for flag in fields(Args) if flag.init and flag.name not in may_change}
    # two flags of the infrastructure define the run too: --restart-every where the actors' envs and the learner's
    # sampling start afresh (and whether checkpoints hold the replay), --threshold-epsilon which episodes count
    # towards the threshold
    config["restart_every"] = args.restart_every
    config["threshold_epsilon"] = args.threshold_epsilon
    return config


def load_optimizer(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """A checkpoint's optimizer state under this run's implementation of Adam (fused on CUDA), not the one that
    wrote it: a run resumed on another device keeps its device's, and Adam's step counter goes where that needs."""
    for saved, group in zip(state["param_groups"], optimizer.param_groups, strict=True):
        if "fused" in group:
            saved["fused"] = group["fused"]
    optimizer.load_state_dict(state)


def restore(args: RunArgs, model, optimizer, device, checkpoint_path: str, target_net) -> dict:
    """A fresh progress dict, or with --resume and a checkpoint, the checkpoint's, with the model,
    the target network and the optimizer loaded in place; a resumed run is the next run segment.
    (Rank 0 only: the other ranks are actors, which take their parameters from the learner.)"""
    progress = new_progress(run_config(args))
    if not (args.resume and os.path.exists(checkpoint_path)):
        target_net.load_state_dict(model.state_dict())
        return progress
    checkpoint = read_checkpoint(checkpoint_path, progress)
    try:
        model.load_state_dict(checkpoint.pop("model"))
        target_net.load_state_dict(checkpoint.pop("target"))
        load_optimizer(optimizer, checkpoint.pop("optimizer"))
    except (KeyError, RuntimeError, ValueError, TypeError, AttributeError) as error:
        refuse_checkpoint(checkpoint_path, error)
    recent_returns = checkpoint.pop("recent_returns")
    progress.update(checkpoint)
    progress["recent_returns"].extend(recent_returns)
    progress["segment"] += 1
    return progress


def restore_replay(replay: PrioritizedReplay, progress: dict, checkpoint_path: str) -> dict:
    """The replay of a checkpoint written with --restart-every, loaded in place. Returns the counts the
    rate limit runs from: those of where the restored replay started empty, else this segment's (whose
    replay starts empty)."""
    saved = progress.pop("replay", None)
    if saved is None:
        return {"global_step": progress["global_step"], "update": progress["update"]}
    try:
        replay.load_state_dict(saved)
        return dict(saved["since"])
    except (KeyError, RuntimeError, ValueError, TypeError, AttributeError) as error:
        refuse_checkpoint(checkpoint_path, error)


def write_checkpoint(
    args: RunArgs, checkpoint_path, progress, q_net, target_net, optimizer, replay, segment_start
) -> None:
    """Progress, networks and optimizer state; with --restart-every the replay too, and the counts its
    rate limit runs from."""
    checkpoint = {**progress, "model": q_net.state_dict(), "optimizer": optimizer.state_dict()}
    kept = {"replay": {**replay.state_dict(), "since": segment_start}} if args.restart_every else {}
    save_checkpoint(checkpoint_path, {**checkpoint, "target": target_net.state_dict(), **kept})


def checkpoint_due(args: RunArgs, progress: dict, stats: dict, saved_at: int, schedule) -> bool:
    """A periodic checkpoint: once --checkpoint-every more updates have passed since the last one, or
    with --restart-every at the first restart point after that (where a resume is bitwise)."""
    every = args.checkpoint_every
    if not every or progress["update"] // every <= saved_at // every:
        return False
    round_ended = stats["blocks"] % args.total_actors == 0
    return not args.restart_every or (round_ended and schedule.restart_point(progress["round"]))


# ----------------------------------------------------------------------------------------------- signals and output
def install_stop_handlers() -> dict:
    """SIGTERM, SIGUSR1 (SLURM preemption) and Ctrl-C's SIGINT ask for a checkpoint at the end of the
    current update. A second Ctrl-C ends the run at once (KeyboardInterrupt, no checkpoint)."""
    stop = {"signal": 0}

    def ask_to_stop(signum, frame):
        stop["signal"] = signum
        # a second Ctrl-C ends the run at once
        signal.signal(signal.SIGINT, signal.default_int_handler)

    for signal_number in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(signal_number, ask_to_stop)
    return stop


def announce_stop(progress: dict, checkpoint_path: str) -> None:
    """SIGTERM/SIGUSR1 (SLURM preemption) ended the loop after a checkpoint: say where it is."""
    print(
        f"signal received: checkpoint of update {progress['update']} written to {checkpoint_path}; "
        "rerun with --resume to continue",
        flush=True,
    )


def open_writer(args: RunArgs, run_dir: str, progress: dict) -> SummaryWriter:
    """TensorBoard (and wandb with --track); after a resume, points past the checkpoint's step are
    dropped."""
    if args.track:
        import wandb

        wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            sync_tensorboard=True,
            config=asdict(args),
            name=args.run_name,
            id=args.run_name,
            resume="allow",
        )
    writer = SummaryWriter(run_dir, purge_step=progress["global_step"] if progress["segment"] else None)
    table = "\n".join(f"|{key}|{value}|" for key, value in asdict(args).items())
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + table)
    return writer


def close_writer(args: RunArgs, writer: SummaryWriter) -> None:
    writer.close()
    if args.track:
        import wandb

        wandb.finish()


def write_summary(
    args: RunArgs, q_net, writer, progress: dict, clock: float, device, run_dir: str, stats: dict, replay
):
    """The final evaluation, runs/<run_name>/summary.json (whole-run figures) and, with
    --save-model, the weights."""
    video_dir = os.path.join(run_dir, "videos") if args.capture_video else None
    eval_returns = evaluate(
        q_net, args.env_id, args.eval_episodes, args.seed + 10**6, device, args.mask_velocity, video_dir
    )
    for episode, episode_return in enumerate(eval_returns):
        writer.add_scalar("eval/episodic_return", episode_return, episode)
    # the evaluation counts in wall time only
    advance_clock(progress, clock, training=False)
    recent = progress["recent_returns"]
    lag_sum = progress["policy_lag_sum"]
    summary = {
        "algo": "r2d2",
        "env_id": args.env_id,
        "mask_velocity": args.mask_velocity,
        "seed": args.seed,
        "world_size": args.world_size,
        "num_actors": args.num_actors,
        "total_actors": args.total_actors,
        "deterministic": args.deterministic,
        "global_step": progress["global_step"],
        "learner_updates": progress["update"],
        "wall_time_s": progress["wall_time_s"],
        "startup_s": progress["startup_s"],
        "train_time_s": progress["train_time_s"],
        "sps": progress["global_step"] / progress["train_time_s"],
        "eval_return_mean": float(np.mean(eval_returns)),
        "eval_return_std": float(np.std(eval_returns)),
        "reward_threshold": envpool.make_spec(args.env_id).reward_threshold,
        "train_return_last20": float(np.mean(recent)) if recent else None,
        "threshold_step": progress["threshold_step"],
        "time_to_threshold_s": progress["time_to_threshold_s"],
        "policy_lag_mean": lag_sum / progress["policy_lag_count"] if progress["policy_lag_count"] else None,
        "replay_inserts_per_s": stats["inserted"] / stats["insert_s"],
        "replay_samples_per_s": stats["sampled"] / stats["sample_s"],
        "learner_updates_per_s": progress["update"] / progress["train_time_s"],
        "learner_compute_s": stats["learn_s"],
        "replay_bytes": replay.nbytes(),
        "replay_bytes_per_step": replay.nbytes() / (args.buffer_size * (args.sequence_length - args.sequence_overlap)),
        "params_sha256": hashlib.sha256(flat_params(q_net).numpy().tobytes()).hexdigest(),
    }
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    if args.save_model:
        torch.save({key: value.cpu() for key, value in q_net.state_dict().items()}, os.path.join(run_dir, "model.pt"))
    print(
        f"eval return {summary['eval_return_mean']:.1f} +- {summary['eval_return_std']:.1f}; "
        f"time to threshold: {summary['time_to_threshold_s']}; summary in {run_dir}/summary.json",
        flush=True,
    )


# ----------------------------------------------------------------------------------------------- distribution
# The torchrun death request: a rank under torchrun asks the kernel (prctl's PR_SET_PDEATHSIG, above the imports)
# to kill it with its agent, whatever kills the agent: ranks that no longer use the agent's store would otherwise
# train on without it. It comes before the slow imports, so that an agent killed while they run takes its ranks
# with it (docs/conventions.md §8).
def available_cpus() -> int:
    """CPUs this process may use (its affinity mask, which taskset, SLURM and containers set; not
    the machine's core count), shared among the ranks on this node (torchrun's LOCAL_WORLD_SIZE)."""
    return max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def default_num_actors(args: RunArgs) -> int:
    """--num-actors 0: one actor per available CPU but one, which the learner needs more (at least
    one actor)."""
    return args.num_actors or max(1, available_cpus() - 1)


def setup_distributed(args: RunArgs):
    """torchrun sets RANK/LOCAL_RANK/WORLD_SIZE. Rank 0 hosts learner, replay and its actors; rank r
    > 0 is one remote actor linked to rank 0 by a gloo pair group (CPU tensors). Alone: world size
    1."""
    args.world_size = int(os.environ.get("WORLD_SIZE", "1"))
    args.rank = int(os.environ.get("RANK", "0"))
    args.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = args.cuda and torch.cuda.is_available() and args.rank == 0
    device = torch.device(f"cuda:{args.local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    groups = {}
    if args.world_size > 1:
        # torch.optim imports torch._dynamo on first use; imported once the group exists, it keeps references to
        # the group, destroy_process_group then leaves gloo's threads running, and a rank can abort as it exits
        importlib.import_module("torch._dynamo")
        timeout = timedelta(seconds=args.collective_timeout)
        # a stop signal during the rendezvous breaks the store's sockets (a NetworkError, exit 1): hold the
        # stop signals until the group exists, then their handlers run (a checkpoint after the first update)
        stop_signals = {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
        dist.init_process_group("gloo", init_method="env://", timeout=timeout)
        # every rank creates every group
        groups = {rank: dist.new_group([0, rank], timeout=timeout) for rank in range(1, args.world_size)}
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stop_signals)
    return device, groups


def seed_everything(args: RunArgs, device) -> None:
    """Threads and seeds (the same on every rank); on the learner's GPU, cuBLAS and cuDNN follow
    --torch-deterministic."""
    torch.set_num_threads(args.torch_threads or 1)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    if device.type == "cuda":
        # cuBLAS refuses deterministic mode without it
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(args.torch_deterministic)
        torch.backends.cudnn.deterministic = args.torch_deterministic


# glibc's mallopt parameters
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4


def keep_freed_memory() -> None:
    """glibc's malloc maps each large block (a batch of frames, a convolution's activations) on
    its own and unmaps it when freed, so the next update faults the same memory in again, page by
    page: on Pong that was up to half of a learner's time (docs/benchmarks.md, Freed memory kept).
    Here blocks come from the heap and freed memory stays there for reuse, so the process keeps
    about its peak (threads other than the main one still map blocks over 64 MiB on their own).
    Each process of a run sets it at start or inherits it from the one that forked it. Other C
    libraries are left as they are."""
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "gnu_get_libc_version"):
        return
    libc.mallopt(M_MMAP_MAX, 0)
    # -1: never trim
    libc.mallopt(M_TRIM_THRESHOLD, -1)


def release_freed_memory() -> None:
    """Gives the memory freed so far back to the system (glibc's malloc_trim), after a one-off large
    free that keep_freed_memory would otherwise keep: a checkpoint's copy of the replay."""
    libc = ctypes.CDLL(None)
    if hasattr(libc, "gnu_get_libc_version"):
        libc.malloc_trim(0)


def gather_to_device(buffers: dict, index: torch.Tensor, device) -> dict:
    """buffer[index] of each buffer, on `device`, in one host-to-device copy: gathered into one byte buffer
    (pinned where the device is CUDA, so that the copy runs asynchronously), moved, and viewed again as the
    gathered tensors. Each tensor starts on a 64-byte boundary."""
    device = torch.device(device)
    shapes, spans = {}, {}
    size = 0
    for key, buffer in buffers.items():
        shapes[key] = (len(index), *buffer.shape[1:])
        # the next 64-byte boundary
        start = -(-size // 64) * 64
        size = start + math.prod(shapes[key]) * buffer.element_size()
        spans[key] = (start, size)
    staging = torch.empty(size, dtype=torch.uint8, pin_memory=device.type == "cuda")
    for key, (start, end) in spans.items():
        gathered = staging[start:end].view(buffers[key].dtype).view(shapes[key])
        torch.index_select(buffers[key], 0, index, out=gathered)
    moved = staging.to(device, non_blocking=True)
    return {key: moved[start:end].view(buffers[key].dtype).view(shapes[key]) for key, (start, end) in spans.items()}


def agree_on_actors(args: RunArgs, segment: int, start_round: int) -> None:
    """Rank 0's run segment, first round and actor count decide every actor's index, env seeds,
    epsilon_i and first block: broadcast them."""
    shared = torch.tensor([segment, args.num_actors, start_round])
    if args.world_size > 1:
        dist.broadcast(shared, 0)
    args.segment = int(shared[0])
    args.num_actors = int(shared[1])
    args.start_round = int(shared[2])
    args.total_actors = args.num_actors + args.world_size - 1
    args.num_buffers = args.num_buffers or 2 * args.total_actors + 2


class RemoteLink:
    """A remote actor's (rank > 0) way to the learner: its block goes to rank 0 through
    torch.distributed (a gloo pair group); rank 0's bridge answers with [version] and parameters:
    those of the version the deterministic schedule asks for, else the latest; version -1 means
    stop."""

    def __init__(self, args: RunArgs, spec, group, num_params: int):
        self.buffer = {key: value[0] for key, value in block_buffers(args, spec, 1, shared=False).items()}
        self.group = group
        self.version = torch.zeros(1, dtype=torch.long)
        self.flat = torch.zeros(num_params)
        self.send(receive_only=True)

    def beat(self) -> None:
        """Nothing: a silent remote actor leaves rank 0's bridge waiting until --collective-timeout."""

    def block(self) -> dict:
        return self.buffer

    def send(self, receive_only: bool = False) -> None:
        for key in [] if receive_only else sorted(self.buffer):
            dist.send(self.buffer[key], 0, group=self.group)
        dist.recv(self.version, 0, group=self.group)
        dist.recv(self.flat, 0, group=self.group)

    def latest(self) -> int:
        return int(self.version[0])

    def params(self, out: torch.Tensor, version: Optional[int] = None) -> int:
        out.copy_(self.flat)
        return int(self.version[0])


def remote_bridge(
    actor: int, peer: int, group, args: RunArgs, buffers: dict, store: ParameterStore, free_q, full_q, control: dict
) -> None:
    """Rank 0's stand-in for the remote actor on rank `peer`: send it parameters, receive each of
    its blocks into a free shared buffer and queue it like a local actor's, answer with the
    parameters for its next block (or stop)."""
    flat = torch.zeros_like(store.slots[0])
    version = torch.zeros(1, dtype=torch.long)
    scratch = None
    schedule = Schedule(args)

    def stopped() -> bool:
        return control.get("stop", False)

    try:
        sequence = args.start_round
        while True:
            wanted = schedule.version_for(sequence)
            version[0] = -1 if stopped() else store.read(flat, wanted, give_up=stopped)
            dist.send(version, peer, group=group)
            dist.send(flat, peer, group=group)
            if version[0] < 0:
                return
            index = None
            while index is None and not stopped():
                try:
                    index = free_q.get(timeout=0.2)
                except queue.Empty:
                    pass
            # Stopping: take the block the actor is sending into a scratch copy, then answer "stop".
            scratch = scratch or {key: value[0].clone() for key, value in buffers.items()}
            target = scratch if index is None else {key: value[index] for key, value in buffers.items()}
            for key in sorted(target):
                dist.recv(target[key], peer, group=group)
            if index is not None:
                full_q.put(index)
            sequence += 1
    except Exception as e:  # noqa: BLE001 - any failure of the link ends the job
        control.setdefault("error", f"remote actor {actor} (rank {peer}): {e!r}")


def finish_distributed(args: RunArgs, exit_code: int, bridges: list) -> None:
    if args.world_size == 1:
        return
    if exit_code:
        # torchrun stops the remote actors
        os._exit(exit_code)
    for bridge in bridges:
        bridge.join(timeout=30)
    dist.barrier()
    dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------- command line
def parse_args() -> RunArgs:
    """The command line, after the words of a preset's values when it names one (`--preset atari`): tyro takes a
    flag's last value, so every flag given still applies beside a preset. An Atari --env-id without a preset gets a
    warning."""
    argv = sys.argv[1:]
    preset = preset_named(argv)
    args = tyro.cli(RunArgs, args=preset_words(PRESETS.get(preset, {})) + argv)
    family = envpool.registration.registry.specs.get(args.env_id, ("",))[0]
    if family == "envpool.atari" and args.preset is None and os.environ.get("RANK", "0") == "0":
        print(
            f"warning: {args.env_id} with the CartPole defaults; --preset atari sets the tested Atari values",
            file=sys.stderr,
        )
    return args


def preset_words(values: dict) -> list:
    """A preset's values as command-line words: `--batch-size 8`, `--no-anneal-lr`."""
    words = []
    for name, value in values.items():
        flag = name.replace("_", "-")
        if isinstance(value, bool):
            words.append(f"--{flag}" if value else f"--no-{flag}")
        else:
            words += [f"--{flag}", str(value)]
    return words


def preset_named(argv: list) -> Optional[str]:
    """The value of --preset on the command line (None without one), read before tyro parses the rest; the last
    one where it is given twice, as tyro reads it."""
    preset = None
    for i, word in enumerate(argv):
        if word == "--preset" and i + 1 < len(argv):
            preset = argv[i + 1]
        elif word.startswith("--preset="):
            preset = word.split("=", 1)[1]
    return preset


if __name__ == "__main__":
    sys.exit(main(parse_args()))

# docs: docs/impala.md | paper: https://arxiv.org/abs/1802.01561
"""IMPALA: Importance Weighted Actor-Learner Architecture (Espeholt et al., 2018).

Actor processes step their own envpool batches with a local CPU copy of the policy and write unrolls
into preallocated shared-memory buffers, handed over through bounded free/full index queues. The
learner trains on batches of unrolls with the V-trace off-policy correction (actors lag behind the
learner) and publishes new parameters that the actors pick up. Under torchrun every rank is a
learner with its own actors; learners all-reduce gradients.

  python algos/impala.py                                            # 1 learner + one actor per core, CartPole-v1
  torchrun --standalone --nproc_per_node=2 algos/impala.py          # 2 learners, each with its own actors

The file reads top to bottom down to main(); below the "infrastructure" line are the flags, checks, the
determinism schedule, the actors' health checks, checkpoints, signals, torchrun plumbing and logging that
keep a run alive, none of it IMPALA.
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
    total_timesteps: int = 800_000  # total environment steps consumed by the learners, over all ranks
    # --- algorithm ---
    # torso: 64-64 tanh MLP, Nature-CNN, or the paper's deep ResNet (auto: MLP for vectors, Nature-CNN for images)
    network: Literal["auto", "mlp", "nature", "resnet"] = "auto"
    use_lstm: bool = False  # an LSTM core between torso and heads (state kept per env, reset at episode starts)
    optimizer: Literal["rmsprop", "adam"] = "adam"  # RMSProp (the paper's optimizer) or Adam
    learning_rate: float = 2e-3  # the optimizer's learning rate
    anneal_lr: bool = True  # anneal the learning rate linearly to zero (as in the paper)
    rmsprop_alpha: float = 0.99  # RMSProp's decay of the squared-gradient average (paper: 0.99)
    rmsprop_eps: float = 0.01  # RMSProp's epsilon (paper: 0.01)
    adam_eps: float = 1e-5  # Adam's epsilon
    num_envs: int = 8  # environments stepped by each actor
    unroll_length: int = 20  # steps per unroll (paper: 20)
    batch_size: int = 32  # trajectories (one env's unroll each) per learner update (paper: 32); a multiple of num_envs
    gamma: float = 0.995  # discount factor (0.995 rather than 0.99: see docs/impala.md, Deviations)
    rho_bar: float = 1.0  # V-trace's truncation of the importance weights rho (paper: 1)
    c_bar: float = 1.0  # V-trace's truncation of the trace coefficients c (paper: 1)
    vtrace_lambda: float = 1.0  # lambda scaling the trace coefficients, c_i = lambda min(c_bar, pi/mu) (paper: 1)
    ent_coef: float = 0.02  # entropy bonus coefficient (0.02 rather than 0.01: see docs/impala.md, Deviations)
    vf_coef: float = 0.5  # baseline (value) loss coefficient
    norm_reward: tyro.conf.DisallowNone[Optional[bool]] = None
    """divide rewards by the running std of the discounted return (default: on for vector
    observations; off for images, whose rewards are clipped to [-1, 1] as in the paper; see
    docs/impala.md, Deviations)"""
    clip_reward: float = 10.0  # scaled rewards are clipped to [-clip_reward, clip_reward]
    max_grad_norm: float = 0.5  # global grad-norm clip after the all-reduce (paper: 40 for summed losses; see docs)
    bf16: bool = False  # the learner's network under bfloat16 autocast: faster where the CPU or GPU has bf16 units
    compile: bool = False  # the learner's loss (network and V-trace) under torch.compile: fewer launches on a GPU
    # --- distributed ---
    num_actors: int = 0
    """actor processes per learner (0: one per CPU this rank may use; with --deterministic, the
    largest count up to that which divides the unrolls of a batch)"""
    num_buffers: int = 0  # unroll buffers (0: max(2 x unrolls per batch, unrolls per batch + 2 x actors))
    # --- computed at run time ---
    world_size: int = field(default=1, init=False)
    rank: int = field(default=0, init=False)
    local_rank: int = field(default=0, init=False)
    unrolls_per_batch: int = field(default=0, init=False)
    num_updates: int = field(default=0, init=False)
    run_name: str = field(default="", init=False)


# `--preset atari`: the values of the page's Pong-v5 runs (docs/impala.md, Results); flags given beside it still apply
PRESETS = {
    "atari": dict(
        env_id="Pong-v5",
        total_timesteps=10_000_000,
        batch_size=8,
        learning_rate=3e-4,
        gamma=0.99,
        ent_coef=0.00025,
        max_grad_norm=40.0,
    ),
}


# ----------------------------------------------------------------------------------------------- environment
def make_env(env_id: str, num_envs: int, seed: int, num_threads: int = 1, **kwargs):
    """An envpool batch. Env i of the batch is seeded with seed + i. Atari gets DeepMind
    preprocessing."""
    extra = {}
    # Atari: 84x84 grey, 4 stacked, skip 4
    if len(envpool.make_spec(env_id).observation_space.shape) == 3:
        extra = dict(episodic_life=True, reward_clip=True, noop_max=30, repeat_action_probability=0.0)
    extra.update(kwargs)
    return envpool.make(
        env_id,
        env_type="gymnasium",
        num_envs=num_envs,
        seed=seed,
        num_threads=num_threads,
        thread_affinity_offset=-1,
        **extra,
    )


def open_video(video_dir: str):
    """An MP4 writer for evaluation episode 0: envpool renders the frames and imageio-ffmpeg's own binary
    encodes them as they come, so no episode is held in memory."""
    os.makedirs(video_dir, exist_ok=True)
    return imageio.get_writer(os.path.join(video_dir, "eval_episode0.mp4"), fps=30, macro_block_size=1)


def env_seed(args: Args, actor: int, update: int) -> int:
    """Seed of env 0 of `actor` on this rank when actors start at `update`: distinct for every env,
    actor, rank and restart point."""
    return args.seed + ((update * args.world_size + args.rank) * args.num_actors + actor) * args.num_envs


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


def mlp(n_in: int, n_out: int, out_std: float) -> nn.Module:
    return nn.Sequential(
        layer_init(nn.Linear(n_in, 64)),
        nn.Tanh(),
        layer_init(nn.Linear(64, 64)),
        nn.Tanh(),
        layer_init(nn.Linear(64, n_out), out_std),
    )


class ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


def resnet_torso(in_channels: int) -> nn.Module:
    """The paper's deep network (Figure 3, right): three sections of conv 3x3, max-pool 3x3 stride 2
    and two residual blocks, with 16, 32, 32 channels; then ReLU and a 256-unit fully connected
    layer."""
    layers = []
    channels = in_channels
    for out in (16, 32, 32):
        layers += [
            nn.Conv2d(channels, out, 3, padding=1),
            nn.MaxPool2d(3, stride=2, padding=1),
            ResidualBlock(out),
            ResidualBlock(out),
        ]
        channels = out
    return nn.Sequential(*layers, nn.ReLU(), nn.Flatten(), nn.Linear(32 * 11 * 11, 256), nn.ReLU())


class RunningMeanStd(nn.Module):
    """Mean, population variance and count (float64) of all data merged so far: buffers, so
    state_dict has them."""

    def __init__(self, shape=()):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape).double())
        self.register_buffer("var", torch.ones(shape).double())
        self.register_buffer("count", torch.zeros(()).double())

    def load(self, mean, var, count) -> None:
        self.mean.copy_(mean)
        self.var.copy_(var)
        self.count.copy_(count)


class Agent(nn.Module):
    """Torso, optional LSTM core, policy-logit and baseline heads. Images: a shared Nature-CNN or
    residual torso with linear heads (the paper's layout). Vectors: two 64-64 tanh MLPs as heads,
    policy and baseline apart (docs/conventions.md). `forward` takes a time axis, [T, N, ...], so
    actors (T = 1) and the learner (T = unroll + 1) share it. With norm_reward, `return_rms` holds
    the reward scaler's statistics (learner only)."""

    def __init__(
        self, obs_shape, num_actions: int, network: str = "auto", use_lstm: bool = False, norm_reward: bool = False
    ):
        super().__init__()
        self.image = len(obs_shape) == 3
        if network == "auto":
            network = "nature" if self.image else "mlp"
        if network == "mlp":
            self.torso = nn.Identity()
            width = int(np.prod(obs_shape))
        elif network == "nature":
            self.torso = nn.Sequential(
                layer_init(nn.Conv2d(obs_shape[0], 32, 8, stride=4)),
                nn.ReLU(),
                layer_init(nn.Conv2d(32, 64, 4, stride=2)),
                nn.ReLU(),
                layer_init(nn.Conv2d(64, 64, 3, stride=1)),
                nn.ReLU(),
                nn.Flatten(),
                layer_init(nn.Linear(64 * 7 * 7, 512)),
                nn.ReLU(),
            )
            width = 512
        else:
            self.torso = resnet_torso(obs_shape[0])
            width = 256
        self.core = nn.LSTMCell(width, 64 if network == "mlp" else 256) if use_lstm else None
        width = self.core.hidden_size if use_lstm else width
        if network == "mlp":
            self.policy = mlp(width, num_actions, 0.01)
            self.baseline = mlp(width, 1, 1.0)
        else:
            self.policy = layer_init(nn.Linear(width, num_actions), 0.01)
            self.baseline = layer_init(nn.Linear(width, 1), 1.0)
        self.return_rms = RunningMeanStd() if norm_reward else None

    def initial_state(self, n: int, device=None):
        """Zero LSTM state (h, c) stacked as [2, n, width]; an empty tensor without LSTM."""
        return torch.zeros(2, n, self.core.hidden_size if self.core is not None else 0, device=device)

    def forward(self, obs: torch.Tensor, valid: torch.Tensor, state: torch.Tensor):
        """obs [T, N, ...], valid [T, N] (0 on envpool's reset steps), state [2, N, H] -> logits [T,
        N, A], values [T, N], state after the last step. The LSTM state is zeroed after a reset
        step, so every episode starts from the zero state."""
        T, N = obs.shape[:2]
        x = obs.reshape((T * N,) + obs.shape[2:]).float()
        h = self.torso(scale_frames(x) if self.image else x)
        if self.core is not None:
            h = h.view(T, N, -1)
            outs = []
            hx, cx = state
            for t in range(T):
                hx, cx = self.core(h[t], (hx, cx))
                outs.append(hx)
                keep = valid[t].unsqueeze(-1)
                hx = hx * keep
                cx = cx * keep
            h = torch.stack(outs).view(T * N, -1)
            state = torch.stack([hx, cx])
        return self.policy(h).view(T, N, -1), self.baseline(h).view(T, N), state


# ----------------------------------------------------------------------------------------------- algorithm
@torch.no_grad()
def vtrace(
    behaviour_logp,
    target_logp,
    rewards,
    values,
    bootstrap_value,
    terms,
    dones,
    valid,
    gamma: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    lam: float = 1.0,
):
    """V-trace targets v_s and policy-gradient advantages over a [T, B] batch (paper, Section 4.1):

      rho_t = min(rho_bar, pi/mu),  c_t = lam * min(c_bar, pi/mu)
      delta_t = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t))            gamma_t = gamma (1 - terminated_t)
      v_s - V(x_s) = delta_s + gamma c_s (v_{s+1} - V(x_{s+1}))      (the trace is cut where an episode ends)
      A_s = rho_s (r_s + gamma_s v_{s+1} - V(x_s))

    V(x_T) is bootstrap_value. A truncated step bootstraps from the value of the final observation,
    which envpool returns as x_{t+1}. Steps with valid = 0 (envpool's reset step after an episode
    end) have v_s = V(x_s)."""
    ratio = (target_logp - behaviour_logp).exp()
    rho = ratio.clamp(max=rho_bar)
    c = lam * ratio.clamp(max=c_bar)
    discounts = gamma * (1.0 - terms)
    next_values = torch.cat([values[1:], bootstrap_value.unsqueeze(0)])
    deltas = valid * rho * (rewards + discounts * next_values - values)
    traces = gamma * (1.0 - dones) * c
    corrections = torch.zeros_like(values)
    acc = torch.zeros_like(bootstrap_value)
    for t in reversed(range(values.shape[0])):
        acc = valid[t] * (deltas[t] + traces[t] * acc)
        corrections[t] = acc
    vs = values + corrections
    next_vs = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)])
    return vs, rho * (rewards + discounts * next_vs - values)


def impala_loss(agent: Agent, batch: dict, args: Args):
    """Policy gradient weighted by the V-trace advantages, baseline loss towards v_s, entropy bonus;
    means over the valid steps of the batch. batch: obs [T+1, B, ...], the rest [T, B] (logits [T,
    B, A], state [2, B, H])."""
    T = batch["actions"].shape[0]
    valid_all = torch.cat([batch["valid"], torch.ones_like(batch["valid"][:1])])
    # with --bf16 the network runs in bfloat16 (weights, losses and V-trace stay float32)
    precision = torch.autocast(batch["obs"].device.type, torch.bfloat16) if args.bf16 else contextlib.nullcontext()
    with precision:
        logits, values, _ = agent(batch["obs"], valid_all, batch["state"])
    logits = logits.float()
    values = values.float()
    logp_all = torch.log_softmax(logits[:T], dim=-1)
    actions = batch["actions"].unsqueeze(-1)
    target_logp = logp_all.gather(-1, actions).squeeze(-1)
    behaviour_logp = torch.log_softmax(batch["logits"], dim=-1).gather(-1, actions).squeeze(-1)
    vs, pg_adv = vtrace(
        behaviour_logp,
        target_logp.detach(),
        batch["rewards"],
        values[:T].detach(),
        values[T].detach(),
        batch["terms"],
        batch["dones"],
        batch["valid"],
        args.gamma,
        args.rho_bar,
        args.c_bar,
        args.vtrace_lambda,
    )
    valid = batch["valid"]
    n = valid.sum().clamp(min=1.0)
    pg_loss = -(pg_adv * target_logp * valid).sum() / n
    baseline_loss = 0.5 * (((vs - values[:T]) ** 2) * valid).sum() / n
    entropy = (-(logp_all.exp() * logp_all).sum(-1) * valid).sum() / n
    loss = pg_loss + args.vf_coef * baseline_loss - args.ent_coef * entropy
    return loss, torch.stack([pg_loss, baseline_loss, entropy]).detach()


def rms_moments(x, weight, shift):
    """[sum w, sum w (x - shift), sum w (x - shift)^2] (per feature, flat, float64) of the rows of x
    [B, ...] with weights w [B]. Moments of disjoint batches add up, so one all-reduce gives those
    of the union over ranks."""
    x = x.reshape(weight.shape[0], -1).double() - shift.reshape(1, -1)
    w = weight.double().unsqueeze(-1)
    return torch.cat([w.sum().reshape(1), (w * x).sum(0), (w * x * x).sum(0)])


def rms_merge(mean, var, count, moments):
    """(mean, var, count) after merging a batch given by its moments around `mean`: Chan et al.'s
    parallel variance update, written with f = n / (count + n) so that count 0 or an empty batch
    need no special case."""
    d = mean.numel()
    n = moments[0]
    # batch mean - running mean
    delta = moments[1 : 1 + d].view_as(mean) / n.clamp(min=1e-12)
    batch_var = (moments[1 + d :].view_as(mean) / n.clamp(min=1e-12) - delta**2).clamp(min=0.0)
    f = n / (count + n).clamp(min=1e-12)
    return mean + f * delta, var + f * (batch_var - var) + f * (1 - f) * delta**2, count + n


def scale_rewards(rewards, return_rms: RunningMeanStd, clip: float):
    """The reward scaler: rewards divided by the running std of the discounted return (the actors'
    `returns`), clipped. The value targets then stay of order one whatever the discount, which an
    MLP baseline can track."""
    return (rewards / torch.sqrt(return_rms.var + 1e-8)).clamp(-clip, clip)


def flatten_parameters(agent: nn.Module) -> torch.Tensor:
    """Make every parameter a view of one flat vector and every gradient a view of `flat.grad`
    (backward adds into them in place), so that the all-reduce, the clip and the optimizer each act
    on one tensor. Call it after moving the agent to its device. Returns the flat vector."""
    params = list(agent.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    flat.grad = torch.zeros_like(flat)
    offset = 0
    for p in params:
        p.data = flat[offset : offset + p.numel()].view_as(p)
        p.grad = flat.grad[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    return flat


def make_optimizer(args: Args, flat: torch.Tensor) -> torch.optim.Optimizer:
    """RMSProp (the paper's, momentum 0) or Adam, on the flat parameter vector. On CUDA, Adam is fused: its
    elementwise operations in one kernel."""
    if args.optimizer == "rmsprop":
        return torch.optim.RMSprop([flat], lr=args.learning_rate, alpha=args.rmsprop_alpha, eps=args.rmsprop_eps)
    return torch.optim.Adam([flat], lr=args.learning_rate, eps=args.adam_eps, fused=flat.is_cuda)


# ----------------------------------------------------------------------------------------------- roles
def unroll_buffers(args: Args, spec, num_buffers: int, state_width: int) -> dict:
    """Preallocated unroll buffers in shared memory, [K, ...] for K buffers: observations x_0..x_T,
    and per step t the action, behaviour logits, reward, terminated, done (terminated or truncated),
    valid, the discounted return so far (the reward scaler's statistic), the return and length of an
    episode that ended at t (NaN elsewhere); the LSTM state before x_0; who produced it (version of
    its parameters, actor, sequence number)."""
    unroll_length = args.unroll_length
    num_envs = args.num_envs
    obs_shape = spec.observation_space.shape
    obs_dtype = torch.uint8 if len(obs_shape) == 3 else torch.float32
    buffers = {
        "obs": torch.zeros((num_buffers, unroll_length + 1, num_envs) + obs_shape, dtype=obs_dtype),
        "actions": torch.zeros((num_buffers, unroll_length, num_envs), dtype=torch.long),
        "logits": torch.zeros((num_buffers, unroll_length, num_envs, spec.action_space.n)),
        "state": torch.zeros((num_buffers, 2, num_envs, state_width)),
        "meta": torch.zeros((num_buffers, 3), dtype=torch.long),
    }
    for key in ["rewards", "terms", "dones", "valid", "returns", "ep_return", "ep_length"]:
        buffers[key] = torch.zeros((num_buffers, unroll_length, num_envs))
    return {key: buffer.share_memory_() for key, buffer in buffers.items()}


class ParameterStore:
    """The learner's latest parameters in shared memory, double-buffered: version v lives in slot v
    % 2. A sequence counter per slot (odd while it is written) lets actors copy without a lock, so
    an actor killed in the middle of a copy cannot block anyone.

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

    def read(self, out: torch.Tensor, version: Optional[int] = None, while_waiting=lambda: None) -> int:
        """Copy version `version` (None: the latest) into out; waits until it is published, calling
        while_waiting() meanwhile. Returns the version."""
        while True:
            wanted = int(self.version[0]) if version is None else version
            if wanted < 0 or int(self.version[0]) < wanted:
                while_waiting()
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


def flat_params(agent: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in agent.parameters()]).cpu()


def load_flat(agent: nn.Module, flat: torch.Tensor) -> None:
    torch.nn.utils.vector_to_parameters(flat, agent.parameters())


def actor_loop(
    actor: int,
    args: Args,
    buffers: dict,
    store: ParameterStore,
    free_q,
    full_q,
    schedule: "Schedule",
    heartbeats: "Heartbeats",
):
    """One actor: step an envpool batch with a local copy of the policy; fill a free buffer with an
    unroll, pass its index to the learner through the full queue, repeat. It acts with the latest
    parameters before every unroll (with --deterministic, those of exactly one update ago: the schedule,
    below the fold)."""
    # die with the learner, whatever kills it; signals are the learner's to handle
    tie_to_learner()
    torch.set_num_threads(1)
    num_envs = args.num_envs
    spec = envpool.make_spec(args.env_id)
    agent = Agent(spec.observation_space.shape, spec.action_space.n, args.network, args.use_lstm)
    flat = flat_params(agent)
    loaded = -1
    sequence = 0
    envs = None
    while True:
        # A start, or a restart point: envs, sampling and episodes begin afresh. (Restart points: with
        # --deterministic, every --restart-every updates, so that a checkpoint there resumes bitwise.)
        if schedule.starts_afresh(sequence):
            if envs is not None:
                envs.close()
            seed = env_seed(args, actor, schedule.segment_start)
            envs = make_env(args.env_id, num_envs, seed, args.env_threads or 1)
            generator = torch.Generator().manual_seed(seed)
            obs = torch.as_tensor(envs.reset()[0])
            valid = torch.ones(num_envs)
            state = agent.initial_state(num_envs)
            episode_return = np.zeros(num_envs)
            episode_length = np.zeros(num_envs)
            previous_done = np.zeros(num_envs, dtype=bool)
            # discounted return along each env, R_t = gamma R_{t-1} + r_t, reset after an episode end
            discounted_return = np.zeros(num_envs)
        # The parameters to act with. --deterministic: the version of exactly one update ago (the schedule's,
        # waited for if need be), then a free buffer. Default (`wanted` None): a free buffer, then the latest
        # parameters, so that an actor held up by backpressure does not start its unroll with parameters from
        # before the wait (the paper fetches the latest before each trajectory).
        wanted = schedule.version(sequence)
        if wanted is not None and wanted != loaded:
            loaded = store.read(flat, wanted, while_waiting=lambda: heartbeats.beat(actor))
            load_flat(agent, flat)
        k = get_beating(free_q, heartbeats, actor)
        if wanted is None and int(store.version[0]) != loaded:
            loaded = store.read(flat)
            load_flat(agent, flat)
        buffers["state"][k] = state
        for t in range(args.unroll_length):
            heartbeats.beat(actor)
            buffers["obs"][k, t] = obs
            with torch.no_grad():
                logits, _, state = agent(obs.unsqueeze(0), valid.unsqueeze(0), state)
            logits = logits[0]
            action = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).squeeze(-1)
            buffers["logits"][k, t] = logits
            buffers["actions"][k, t] = action
            buffers["valid"][k, t] = valid
            next_obs, reward, terminated, truncated, info = envs.step(action.numpy())
            done = terminated | truncated
            # Episode statistics (Atari: raw rewards and real game over); the reset step after an end adds nothing.
            episode_return += info.get("reward", reward) * ~previous_done
            episode_length += ~previous_done
            ended = (info["terminated"].astype(bool) | truncated) if "terminated" in info else done
            buffers["ep_return"][k, t] = torch.as_tensor(np.where(ended, episode_return, np.nan))
            buffers["ep_length"][k, t] = torch.as_tensor(episode_length)
            episode_return[ended] = 0.0
            episode_length[ended] = 0
            previous_done = done
            buffers["rewards"][k, t] = torch.as_tensor(reward)
            discounted_return = discounted_return * args.gamma + reward
            buffers["returns"][k, t] = torch.as_tensor(discounted_return)
            discounted_return[done] = 0.0
            buffers["terms"][k, t] = torch.as_tensor(terminated)
            buffers["dones"][k, t] = torch.as_tensor(done)
            obs = torch.as_tensor(next_obs)
            valid = torch.as_tensor(~done, dtype=torch.float32)
        # x_T bootstraps this unroll and is also x_0 of this actor's next one
        buffers["obs"][k, args.unroll_length] = obs
        buffers["meta"][k] = torch.tensor([loaded, actor, sequence])
        full_q.put(k)
        sequence += 1


def start_actors(
    args: Args, buffers: dict, store: ParameterStore, num_buffers: int, schedule: "Schedule", heartbeats: "Heartbeats"
):
    """Fork the actor processes (before the learner computes anything) around bounded free/full
    index queues, every buffer free. Returns (actors, free_q, full_q)."""
    context = mp.get_context("fork")
    free_q = context.Queue(maxsize=num_buffers)
    full_q = context.Queue(maxsize=num_buffers)
    for k in range(num_buffers):
        free_q.put(k)
    actors = []
    for actor in range(args.num_actors):
        actor_args = (actor, args, buffers, store, free_q, full_q, schedule, heartbeats)
        actors.append(context.Process(target=actor_loop, args=actor_args, daemon=True))
    # a failed fork or a second Ctrl-C here: the actors already started must not outlive it
    try:
        for process in actors:
            process.start()
    except BaseException:
        stop_actors([process for process in actors if process.pid is not None])
        raise
    return actors, free_q, full_q


def stop_actors(actors: list) -> None:
    """Kill and reap every actor, with Ctrl-C ignored meanwhile: raised here, it would leave an actor running, and
    the interpreter's exit would wait for it for ever (actors ignore the SIGTERM that exit sends them)."""
    previous_handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    for process in actors:
        process.kill()
    for process in actors:
        process.join()
    signal.signal(signal.SIGINT, previous_handler)


def next_batch(
    args: Args, buffers: dict, full_q, actors: list, heartbeats: "Heartbeats", schedule: "Schedule", update: int
) -> list:
    """Indices of the unrolls for `update`, waiting on the full queue while watching the actors. Default
    mode: the first unrolls_per_batch to arrive. --deterministic: round `update`'s unrolls in a fixed
    order (the schedule's)."""
    chosen = []
    while True:
        if args.deterministic:
            ready = schedule.batch(update)
            if ready is not None:
                return ready
        elif len(chosen) == args.unrolls_per_batch:
            return chosen
        try:
            k = full_q.get(timeout=0.5)
        except queue.Empty:
            k = None
        # checked at every unroll, the other actors may keep the queue busy: dead, or silent for --actor-timeout
        check_actors(actors, heartbeats, args.actor_timeout)
        if k is None:
            continue
        if args.deterministic:
            schedule.arrived(k, buffers["meta"])
        else:
            chosen.append(k)


# the batch's tensors for the learner; the rest is bookkeeping, read on the CPU
LEARNER_KEYS = ["obs", "actions", "logits", "state", "rewards", "terms", "dones", "valid"]


def take_batch(buffers: dict, indices: list, free_q, device):
    """Copy the unrolls out and hand their buffers straight back to the actors. The learner's part
    goes to the device in one copy and is laid out there ([K, T, N] -> [T, K*N]). Returns the batch (on the
    device), the discounted returns (the reward scaler's statistic), the versions of the parameters that produced
    the unrolls, and the (return, length) of the episodes that ended in them."""
    index = torch.tensor(indices)
    unrolls = gather_to_device({key: buffers[key] for key in LEARNER_KEYS}, index, device)
    returns = buffers["returns"][index].transpose(0, 1).flatten(1, 2)
    episode_return = buffers["ep_return"][index].transpose(0, 1).flatten(1, 2)
    episode_length = buffers["ep_length"][index].transpose(0, 1).flatten(1, 2)
    versions = buffers["meta"][index][:, 0]
    for k in indices:
        free_q.put(k)
    batch = {key: value.transpose(0, 1).flatten(1, 2) for key, value in unrolls.items()}
    ended = ~torch.isnan(episode_return)
    finished = list(zip(episode_return[ended].tolist(), episode_length[ended].tolist(), strict=True))
    return batch, returns, versions, finished


def learner_step(args: Args, agent: Agent, optimizer, flat, batch, returns, read_counters, loss_function=impala_loss):
    """One update: rewards scaled by the statistics before this batch, the V-trace loss and its
    gradient; one all-reduce carries the gradients (averaged over ranks), the bookkeeping's counters
    (`read_counters()`, read after the backward pass: this update's steps and whether this rank was asked
    to stop) and the moments of this batch's discounted returns (summed), so that the reward scaler is the
    same on every rank; then the clip and the optimizer's step. `loss_function` is impala_loss, compiled with
    --compile. Returns the losses and the summed counters."""
    return_rms = agent.return_rms
    if return_rms is not None:
        batch["rewards"] = scale_rewards(batch["rewards"], return_rms, args.clip_reward)
    loss, losses = loss_function(agent, batch, args)
    # zeroed in place: the parameters' gradients are views of flat.grad
    optimizer.zero_grad(set_to_none=False)
    loss.backward()
    counters = read_counters()
    moments = counters[:0]
    if return_rms is not None:
        moments = rms_moments(returns.to(flat.device), batch["valid"].reshape(-1), return_rms.mean)
    if args.world_size > 1:
        n = flat.numel()
        width = counters.numel()
        reduced = torch.cat([flat.grad, counters, moments.to(flat.dtype)])
        dist.all_reduce(reduced)
        flat.grad.copy_(reduced[:n] / args.world_size)
        counters = reduced[n : n + width]
        moments = reduced[n + width :].to(moments.dtype)
    if return_rms is not None:
        return_rms.load(*rms_merge(return_rms.mean, return_rms.var, return_rms.count, moments))
    torch.nn.utils.clip_grad_norm_([flat], args.max_grad_norm)
    optimizer.step()
    return losses, counters


def learning_rate(args: Args, update: int) -> float:
    """Annealed linearly to zero over the run (as in the paper), or constant."""
    if args.anneal_lr:
        return args.learning_rate * (1.0 - update / args.num_updates)
    return args.learning_rate


def evaluate(agent: Agent, env_id: str, episodes: int, seed: int, device, video_dir: Optional[str] = None):
    """Returns of `episodes` episodes of the greedy policy, one env per episode (no bias to short
    episodes). With video_dir, episode 0 is also written there as an MP4."""
    options = dict(episodic_life=False, reward_clip=False) if agent.image else {}
    render_mode = "rgb_array" if video_dir is not None else None
    envs = make_env(env_id, episodes, seed, render_mode=render_mode, **options)
    video = open_video(video_dir) if video_dir is not None else None
    obs, _ = envs.reset()
    returns = np.zeros(episodes)
    done = np.zeros(episodes, dtype=bool)
    state = agent.initial_state(episodes, device)
    valid = torch.ones(1, episodes, device=device)
    while not done.all():
        if video is not None and not done[0]:
            video.append_data(envs.render()[0])
        with torch.no_grad():
            logits, _, state = agent(torch.as_tensor(obs, device=device).unsqueeze(0), valid, state)
        obs, reward, terminated, truncated, info = envs.step(logits[0].argmax(-1).cpu().numpy())
        returns += info.get("reward", reward) * ~done
        done |= (info["terminated"].astype(bool) if "terminated" in info else terminated) | truncated
        valid = torch.as_tensor(~(terminated | truncated), dtype=torch.float32, device=device).unsqueeze(0)
    if video is not None:
        video.close()
    envs.close()
    return returns


# ----------------------------------------------------------------------------------------------- main
def main(args: Args) -> int:
    # stop signals, flag checks, torchrun's process group, seeds and threads: all below the fold
    run = Run(args)
    device = run.device
    args.num_actors = default_num_actors(args)
    args.unrolls_per_batch = args.batch_size // args.num_envs
    num_buffers = args.num_buffers or max(2 * args.unrolls_per_batch, args.unrolls_per_batch + 2 * args.num_actors)
    args.num_updates = max(1, args.total_timesteps // (args.world_size * args.batch_size * args.unroll_length))
    spec = envpool.make_spec(args.env_id)
    if args.norm_reward is None:
        args.norm_reward = len(spec.observation_space.shape) != 3
    agent = Agent(spec.observation_space.shape, spec.action_space.n, args.network, args.use_lstm, args.norm_reward)
    agent = agent.to(device)
    flat = flatten_parameters(agent)
    optimizer = make_optimizer(args, flat)
    # --compile: the loss compiled on its first call (docs/impala.md, Details)
    loss_function = torch.compile(impala_loss) if args.compile else impala_loss
    # fresh progress, or a checkpoint's with --resume (weights and optimizer state loaded in place); rank 0's
    # weights go to every rank, so that all learners start identical
    progress = run.restore(agent, optimizer)
    start_update = progress["update"]

    # Shared memory and actors first (fork before the learner computes anything), then logging.
    buffers = unroll_buffers(args, spec, num_buffers, agent.initial_state(1).shape[-1])
    store = ParameterStore(flat.numel())
    store.publish(flat, start_update)
    # which parameters each unroll acts with and in what order the learner takes them (--deterministic: a fixed
    # schedule), and the actors' heartbeats: below the fold
    schedule = Schedule(args, start_update)
    heartbeats = Heartbeats(args.num_actors)
    actors, free_q, full_q = start_actors(args, buffers, store, num_buffers, schedule, heartbeats)
    # whatever ends the loop (an exception too), no actor outlives it; a dead or silent actor ends the run
    with run.actors_running(actors):
        run.start_training()
        for update in range(start_update, args.num_updates):
            # COLLECT: a batch of unrolls (--deterministic: round `update`'s, in a fixed order)
            indices = next_batch(args, buffers, full_q, actors, heartbeats, schedule, update)
            run.lap("wait")
            batch, returns, versions, finished = take_batch(buffers, indices, free_q, device)
            # LEARN: V-trace on the batch, gradients averaged over ranks (run.update_counters: the bookkeeping's
            # steps and stop request, summed over ranks in the same all-reduce)
            optimizer.param_groups[0]["lr"] = learning_rate(args, update)
            losses, counters = learner_step(
                args, agent, optimizer, flat, batch, returns, run.update_counters, loss_function
            )
            # PUBLISH: the new parameters for the actors
            store.publish(flat, update + 1)
            run.lap("learn")
            # BOOKKEEPING: clocks, policy lag (learner version minus the batch's), episodes, logs, checkpoints; a
            # stop signal on some rank ends the loop after a checkpoint
            if run.end_update(counters, losses, versions, finished, full_q):
                break
    # the final evaluation and summary.json (unless a signal or an actor stopped the run), the writer, the group
    return run.finish()


# ==== infrastructure: flags, schedule, actors' health, checkpoints, torchrun, logging; nothing below is IMPALA ====
@dataclass
class Infra:
    """The flags that keep a run alive, watched, reproducible and resumable, not what it learns."""

    exp_name: str = "impala"  # the name of this experiment (part of the run name)
    preset: Optional[Literal[tuple(PRESETS)]] = None  # start from a preset's values (PRESETS, above the fold)
    torch_deterministic: bool = True  # deterministic CUDA kernels (the CPU kernels used here are anyway)
    cuda: bool = True  # run the learner on CUDA when it is available (actors always run on the CPU)
    track: bool = False  # log to Weights & Biases as well as TensorBoard
    wandb_project_name: str = "distrl"  # the wandb project name
    wandb_entity: Optional[str] = None  # the wandb entity (team)
    capture_video: bool = False  # write the first evaluation episode as runs/<run_name>/videos/eval_episode0.mp4
    save_model: bool = False  # write the final weights (state_dict) to runs/<run_name>/model.pt
    eval_episodes: int = 10  # episodes of the final, greedy policy to evaluate at the end
    torch_threads: int = 0  # learner's torch threads (0: 1; actors always use 1)
    env_threads: int = 0  # envpool threads per actor (0: 1)
    deterministic: bool = False
    """actors act with the parameters of exactly one update ago and unrolls are consumed in a fixed
    order: bitwise reproducible on CPU, at the price of actors waiting for the learner"""
    restart_every: int = 0
    """with --deterministic: every this many updates the actors start afresh (a restart point), so that
    a checkpoint written there resumes bitwise as the uninterrupted run (0: only at the start)"""
    checkpoint_every: int = 0  # write runs/<run_name>/checkpoint.pt every this many updates (0: on signals only)
    resume: bool = False  # continue from runs/<run_name>/checkpoint.pt when it exists
    collective_timeout: float = 600.0  # seconds a rank waits for another before it fails (torch's default: 1800)
    actor_timeout: float = 60.0  # seconds a local actor may fall silent (stopped, hung; 5x that to start): the job ends


# every flag of the command line, the algorithm's first (in --help too)
@dataclass
class RunArgs(Infra, Args):
    pass


# a checkpoint of another format version ends the run with exit 2 (read_checkpoint)
CHECKPOINT_VERSION = 1


class Run:
    """The infrastructure of one run, as main() uses it: set-up, restore, the actors' end, clocks, the
    bookkeeping of each update (the counters summed in the learner's all-reduce, policy lag, episodes,
    TensorBoard, progress lines, checkpoints, stop signals) and the end (the final evaluation, summary.json,
    closing the writer and the process group)."""

    def __init__(self, args: RunArgs):
        # first of all: a signal during start-up ends in a checkpoint (forked processes keep the handlers)
        self.stop = install_stop_handlers()
        # envpool's spaces warn about it
        warnings.filterwarnings("ignore", message=".*precision lowered by casting.*")
        validate(args)
        self.device = setup_distributed(args)
        args.run_name = f"{args.env_id}__{args.exp_name}__{args.seed}"
        self.run_dir = os.path.join("runs", args.run_name)
        self.checkpoint_path = os.path.join(self.run_dir, "checkpoint.pt")
        seed_everything(args, self.device)
        keep_freed_memory()
        self.args = args
        self.threshold = envpool.make_spec(args.env_id).reward_threshold
        self.writer = None
        self.stopped = False
        self.exit_code = 0

    def restore(self, agent, optimizer) -> dict:
        """Fresh progress, or the checkpoint's with --resume (the weights and optimizer state loaded in place).
        The run keeps agent and optimizer for its checkpoints and summary."""
        self.agent = agent
        self.optimizer = optimizer
        self.progress = restore(self.args, agent, optimizer, self.device, self.checkpoint_path)
        return self.progress

    @contextlib.contextmanager
    def actors_running(self, actors: list):
        """Around the training loop: a dead or silent actor (ActorDied) ends the run with one line and exit code
        1; whatever ends it, every actor is killed and reaped (they ignore the SIGTERM of exit)."""
        try:
            yield
            # training time ends with the loop (the final evaluation counts in wall time only)
            self.clock = advance_clock(self.progress, self.clock)
        except ActorDied as error:
            program = os.path.basename(sys.argv[0])
            print(f"{program}: error: rank {self.args.rank}: {error}; stopping", file=sys.stderr, flush=True)
            self.exit_code = 1
        finally:
            stop_actors(actors)

    def start_training(self) -> None:
        """Rank 0's writer (after the fork: its thread must not be copied into the actors), then training time
        counts from here (start-up is reported on its own)."""
        if self.args.rank == 0:
            self.writer = open_writer(self.args, self.run_dir, self.progress)
        self.stats = new_stats()
        self.last_print = 0.0
        self.clock = start_clock(self.progress)
        self.lap_start = time.time()
        self.lap_times = {}

    def lap(self, name: str) -> None:
        """The time since the previous lap (or the start of the update) as this update's `name` time."""
        now = time.time()
        self.lap_times[name] = now - self.lap_start
        self.lap_start = now

    def update_counters(self) -> torch.Tensor:
        """The bookkeeping's counters that travel in the learner's gradient all-reduce, summed over ranks: the
        environment steps of this update, and whether this rank was asked to stop (a signal)."""
        steps = float(self.args.batch_size * self.args.unroll_length)
        return torch.tensor([steps, float(self.stop["signal"] != 0)], device=self.device)

    def end_update(self, counters: torch.Tensor, losses: torch.Tensor, versions, finished: list, full_q) -> bool:
        """One update's bookkeeping: the counters summed over ranks, the clocks, the policy lag (the learner's
        version minus the batch's mean), the episodes that ended in the batch, rank 0's log and progress line,
        a checkpoint when due or asked for. Returns True when a stop signal reached some rank (checkpoint
        written: the loop ends)."""
        args = self.args
        progress = self.progress
        stats = self.stats
        update = progress["update"]
        progress["update"] = update + 1
        progress["global_step"] += int(counters[0])
        self.clock = advance_clock(progress, self.clock)
        record_lag(progress, stats, update - versions.double().mean().item())
        stats["wait_s"] = self.lap_times["wait"]
        stats["learn_s"] = self.lap_times["learn"]
        stats["losses"] = losses
        record_returns(progress, [episode_return for episode_return, _ in finished], self.threshold)
        if args.rank == 0:
            log_update(self.writer, progress, finished, learner_scalars(progress, stats, self.optimizer, full_q))
            self.last_print = print_progress(progress, args.num_updates, self.last_print)
        # SIGTERM/SIGUSR1 on some rank (SLURM preemption): save, then exit cleanly
        self.stopped = bool(counters[1] > 0)
        due = args.checkpoint_every and progress["update"] % args.checkpoint_every == 0
        if args.rank == 0 and (self.stopped or due):
            checkpoint = {**progress, "model": self.agent.state_dict(), "optimizer": self.optimizer.state_dict()}
            save_checkpoint(self.checkpoint_path, checkpoint)
        if self.stopped and args.rank == 0:
            print(
                f"signal received: checkpoint of update {progress['update']} written to {self.checkpoint_path}; "
                "rerun with --resume to continue",
                flush=True,
            )
        self.lap_start = time.time()
        return self.stopped

    def finish(self) -> int:
        """The final evaluation and summary (also after resuming a checkpoint of the last update; not after a
        stop signal or a dead actor), then the writer, wandb and the process group. Returns the exit code."""
        args = self.args
        if self.exit_code == 0 and not self.stopped and args.rank == 0:
            write_summary(args, self.agent, self.writer, self.progress, self.clock, self.device, self.run_dir)
        if self.writer is not None:
            self.writer.close()
            if args.track:
                import wandb

                wandb.finish()
        finish_distributed(args, self.exit_code)
        return self.exit_code


class Schedule:
    """Which parameters each unroll acts with, and (with --deterministic) in which order the learner takes
    the unrolls. By default: the latest parameters. With --deterministic, the unrolls of round r
    (those that update r consumes) act with the parameters of version r - 1, exactly one update old (the
    first round after a start or a restart point: the current ones), and the learner takes round r's in
    (sequence, actor) order; unrolls of a later round that arrive early wait. Every --restart-every-th
    update is a restart point: the actors start afresh (new envs seeded for it, sampling reseeded, the
    parameters of that very update) in every run alike, so that a run resumed from a checkpoint there goes
    on bitwise as the uninterrupted one. Each actor and the learner use their own (forked) copy."""

    def __init__(self, args: RunArgs, start_update: int):
        self.deterministic = args.deterministic
        self.restart_every = args.restart_every
        self.start_update = start_update
        self.unrolls_per_batch = args.unrolls_per_batch
        # --deterministic: each actor's share of a batch (validate makes the actors divide it); the default mode may
        # have more actors than a batch has unrolls, and does not use it
        self.unrolls_per_round = max(1, args.unrolls_per_batch // args.num_actors)
        # an actor's side: the round of its last start
        self.segment_start = start_update
        # the learner's side: the unrolls that arrived, by round
        self.pending = {}

    def round_of(self, sequence: int) -> int:
        """--deterministic: the update whose batch an actor's unroll `sequence` joins."""
        return self.start_update + sequence // self.unrolls_per_round

    def starts_afresh(self, sequence: int) -> bool:
        """Whether an actor begins unroll `sequence` with new envs and sampling: its first, or the first of a
        restart point's round."""
        round_ = self.round_of(sequence)
        restart_point = self.deterministic and self.restart_every > 0 and round_ % self.restart_every == 0
        if sequence == 0 or (sequence % self.unrolls_per_round == 0 and restart_point):
            self.segment_start = round_
            return True
        return False

    def version(self, sequence: int) -> Optional[int]:
        """The parameter version an actor's unroll `sequence` acts with: None (the latest) by default."""
        if not self.deterministic:
            return None
        return max(self.round_of(sequence) - 1, self.segment_start)

    def arrived(self, k: int, meta: torch.Tensor) -> None:
        """The learner's side: unroll buffer k is full (meta: who produced each buffer)."""
        _, actor, sequence = meta[k].tolist()
        self.pending.setdefault(self.round_of(sequence), []).append((sequence, actor, k))

    def batch(self, update: int) -> Optional[list]:
        """The learner's side: the buffers of round `update` in (sequence, actor) order once they have all
        arrived (else None)."""
        ready = self.pending.setdefault(update, [])
        if len(ready) < self.unrolls_per_batch:
            return None
        del self.pending[update]
        return [k for _, _, k in sorted(ready)]


# ----------------------------------------------------------------------------------------------- actors' health
class ActorDied(RuntimeError):
    """An actor (or, in SEED, the link to it) is gone: the job ends non-zero."""


def tie_to_learner() -> None:
    """An actor process dies with its learner, whatever kills the learner (PR_SET_PDEATHSIG); the stop
    signals are the learner's to handle."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    for signal_number in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(signal_number, signal.SIG_IGN)


class Heartbeats:
    """One shared clock reading per actor, written as it steps its envs and while it waits for a free
    buffer: a stopped or hung actor falls silent while its process lives on, which its exit code
    cannot show."""

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


def get_beating(free_q, heartbeats: Heartbeats, actor: int) -> int:
    """free_q.get(), beating every second while it waits (an actor held up by backpressure is alive)."""
    while True:
        heartbeats.beat(actor)
        try:
            return free_q.get(timeout=1.0)
        except queue.Empty:
            pass


def check_actors(actors: list, heartbeats: Heartbeats, timeout: float) -> None:
    """The learner's look at its actors while it waits: ActorDied when one has exited, or has been silent
    for over `timeout` seconds (a stopped or hung actor, whose process lives on)."""
    for actor, process in enumerate(actors):
        if process.exitcode is not None:
            raise ActorDied(f"actor {actor} (pid {process.pid}) exited with code {process.exitcode}")
    silent = heartbeats.silent_actor(timeout)
    if silent is not None:
        actor, how_long = silent
        raise ActorDied(f"actor {actor} (pid {actors[actor].pid}) {how_long} (stopped or hung)")


# ----------------------------------------------------------------------------------------------- checks
def fail(arg: str, message: str) -> None:
    """Bad argument: one line naming it on stderr, exit code 2 (as argparse does)."""
    print(f"{os.path.basename(sys.argv[0])}: error: --{arg.replace('_', '-')}: {message}", file=sys.stderr)
    sys.exit(2)


def validate(args: RunArgs) -> None:
    # env seeds add offsets to the seed and must stay 32-bit
    if not 0 <= args.seed < 2**30:
        fail("seed", f"must be in [0, 2**30), got {args.seed}")
    positive = ["total_timesteps", "num_envs", "unroll_length", "batch_size", "eval_episodes", "learning_rate"]
    positive += ["rho_bar", "c_bar", "rmsprop_eps", "adam_eps", "clip_reward", "collective_timeout"]
    # max_grad_norm 0 would clip every gradient to zero: refused, not taken as "off"
    positive += ["max_grad_norm"]
    for name in positive:
        if getattr(args, name) <= 0:
            fail(name, f"must be positive, got {getattr(args, name)}")
    # a pause of the learner's own over half the timeout (the whole job suspended) restarts the silence count, and
    # it looks at its actors between updates (every 0.5 s while it waits): a shorter timeout might never fire
    if args.actor_timeout < 2:
        fail("actor_timeout", f"must be at least 2 s, got {args.actor_timeout}")
    not_negative = ["torch_threads", "env_threads", "num_actors", "num_buffers", "checkpoint_every", "ent_coef"]
    not_negative += ["vf_coef", "restart_every"]
    for name in not_negative:
        if getattr(args, name) < 0:
            fail(name, f"must not be negative, got {getattr(args, name)}")
    if args.restart_every and not args.deterministic:
        fail("restart_every", "needs --deterministic (its restart points make resumes bitwise)")
    for name in ["gamma", "vtrace_lambda", "rmsprop_alpha"]:
        if not 0.0 < getattr(args, name) <= 1.0:
            fail(name, f"must be in (0, 1], got {getattr(args, name)}")
    if args.batch_size % args.num_envs:
        fail("batch_size", f"{args.batch_size} is not a multiple of --num-envs {args.num_envs}")
    unrolls = args.batch_size // args.num_envs
    actors = default_num_actors(args)
    if args.deterministic and unrolls % actors:
        fail(
            "num_actors", f"{actors} actors do not divide the {unrolls} unrolls of a batch (needed by --deterministic)"
        )
    if args.num_buffers and args.num_buffers < (2 * unrolls if args.deterministic else unrolls):
        needs = " (--deterministic needs two batches)" if args.deterministic else ""
        fail("num_buffers", f"{args.num_buffers} is too few for {unrolls} unrolls per batch{needs}")
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
        fail("env_id", f"'{args.env_id}' has observation space {obs_space}; IMPALA here needs a flat or image Box")
    if not isinstance(act_space, gym.spaces.Discrete):
        fail("env_id", f"'{args.env_id}' has action space {act_space}; IMPALA here needs Discrete actions")
    if args.network in ("nature", "resnet") and len(obs_space.shape) != 3:
        fail("network", f"'{args.network}' needs image observations; '{args.env_id}' has {obs_space.shape}")
    if args.network == "mlp" and len(obs_space.shape) != 1:
        fail("network", f"'mlp' needs flat observations; '{args.env_id}' has {obs_space.shape}")


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
    (docs/conventions.md §1a)."""
    return {
        "update": 0,
        "global_step": 0,
        "startup_s": 0.0,
        "train_time_s": 0.0,
        "wall_time_s": 0.0,
        "time_to_threshold_s": None,
        "threshold_step": None,
        "recent_returns": deque(maxlen=20),
        # the policy lag summed over the updates counted: its whole-run mean in summary.json
        "policy_lag_sum": 0.0,
        "policy_lag_count": 0,
        "config": config,
    }


def new_stats() -> dict:
    """The last update's learner figures: its policy lag, its wait for its batch, its compute and its
    losses."""
    return {"lag": 0.0, "wait_s": 0.0, "learn_s": 0.0, "losses": torch.zeros(3)}


def record_lag(progress: dict, stats: dict, lag: float) -> None:
    """The policy lag of an update (learner version minus the batch's mean version): the last one for
    the logs, the whole-run sum for the summary."""
    stats["lag"] = lag
    progress["policy_lag_sum"] += lag
    progress["policy_lag_count"] += 1


def start_clock(progress: dict) -> float:
    """Training starts now: add this segment's start-up (process start to now) to the whole-run
    times."""
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
    """TensorBoard points of one iteration: its finished episodes, then the named scalars."""
    step = progress["global_step"]
    for episode_return, episode_length in finished:
        writer.add_scalar("charts/episodic_return", episode_return, step)
        writer.add_scalar("charts/episodic_length", episode_length, step)
    for key, value in scalars.items():
        writer.add_scalar(key, value, step)


def learner_scalars(progress: dict, stats: dict, optimizer, full_q) -> dict:
    """TensorBoard scalars of the last update."""
    scalars = {
        "charts/learning_rate": optimizer.param_groups[0]["lr"],
        "charts/SPS": progress["global_step"] / progress["train_time_s"],
        "charts/policy_lag": stats["lag"],
        "stats/learner_wait_s": stats["wait_s"],
        "stats/learn_time_s": stats["learn_s"],
        "stats/full_queue": full_q.qsize(),
    }
    losses = stats["losses"].tolist()
    scalars.update(zip(["losses/policy_loss", "losses/value_loss", "losses/entropy"], losses, strict=True))
    return scalars


def print_progress(progress: dict, num_updates: int, last_print: float) -> float:
    """A progress line at most every 2 s (and after the last update); returns when one was last
    printed."""
    now = time.time()
    if now - last_print < 2.0 and progress["update"] < num_updates:
        return last_print
    recent = progress["recent_returns"]
    mean_return = f"{np.mean(recent):.1f}" if recent else "n/a"
    sps = progress["global_step"] / max(progress["train_time_s"], 1e-9)
    print(
        f"update {progress['update']}/{num_updates} global_step={progress['global_step']} SPS={sps:.0f} "
        f"return(last {len(recent)})={mean_return}",
        flush=True,
    )
    return now


# ----------------------------------------------------------------------------------------------- checkpoints
def save_checkpoint(path: str, payload: dict) -> None:
    """Atomic: write a temporary file beside the target, then rename it over the target."""
    payload = {**payload, "algo": "impala", "version": CHECKPOINT_VERSION}
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
    if written_by not in (None, "impala"):
        fail("resume", f"{checkpoint_path} was written by {written_by}.py, not impala.py; use another --exp-name")
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
            f"{checkpoint_path} lacks {', '.join(missing)}: not a checkpoint of impala.py; use another --exp-name",
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
    (`Args`) but the budget, which may grow, how the work is spread over actors and buffers, and whether the
    loss is compiled; none of `Infra`'s (how the run is kept alive, watched or saved). Values derived from the
    flags (init=False) follow from them."""
    may_change = {"total_timesteps", "num_actors", "num_buffers", "compile"}
    config = {flag.name: getattr(args, flag.name) for flag in fields(Args) if flag.init and flag.name not in may_change}
    # torchrun's process count is no flag, but it defines the run: the ranks' batches make one update's, and the
    # number of updates follows from it
    config["world_size"] = args.world_size
    return config


def load_optimizer(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """A checkpoint's optimizer state under this run's implementation of Adam (fused on CUDA), not the one that
    wrote it: a run resumed on another device keeps its device's, and Adam's step counter goes where that needs."""
    for saved, group in zip(state["param_groups"], optimizer.param_groups, strict=True):
        if "fused" in group:
            saved["fused"] = group["fused"]
    optimizer.load_state_dict(state)


def restore(args: RunArgs, model, optimizer, device, checkpoint_path: str) -> dict:
    """A fresh progress dict, or with --resume and a checkpoint, the checkpoint's, with the model
    and the optimizer loaded in place. Rank 0 reads the checkpoint and sends it to the other ranks
    (as DD-PPO), so nodes need no shared disk; without one it sends its initial weights, since nodes
    with other math libraries could initialize other bits."""
    progress = new_progress(run_config(args))
    checkpoint = None
    if args.resume and args.rank == 0 and os.path.exists(checkpoint_path):
        checkpoint = read_checkpoint(checkpoint_path, progress)
    if args.world_size > 1:
        received = [checkpoint]
        dist.broadcast_object_list(received, 0, device=device if device.type == "cuda" else None)
        checkpoint = received[0]
        if checkpoint is None:
            for tensor in model.state_dict().values():
                dist.broadcast(tensor, 0)
    if checkpoint is None:
        return progress
    try:
        model.load_state_dict(checkpoint.pop("model"))
        load_optimizer(optimizer, checkpoint.pop("optimizer"))
    except (KeyError, RuntimeError, ValueError, TypeError, AttributeError) as error:
        refuse_checkpoint(checkpoint_path, error)
    recent_returns = checkpoint.pop("recent_returns")
    progress.update(checkpoint)
    progress["recent_returns"].extend(recent_returns)
    return progress


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
    writer = SummaryWriter(run_dir, purge_step=progress["global_step"] if progress["update"] else None)
    table = "\n".join(f"|{key}|{value}|" for key, value in asdict(args).items())
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + table)
    return writer


def write_summary(args: RunArgs, agent: Agent, writer, progress: dict, clock: float, device, run_dir: str):
    """The final evaluation, runs/<run_name>/summary.json (whole-run figures) and, with
    --save-model, the weights."""
    video_dir = os.path.join(run_dir, "videos") if args.capture_video else None
    eval_returns = evaluate(agent, args.env_id, args.eval_episodes, args.seed + 10**6, device, video_dir)
    for episode, episode_return in enumerate(eval_returns):
        writer.add_scalar("eval/episodic_return", episode_return, episode)
    # the evaluation counts in wall time only
    advance_clock(progress, clock, training=False)
    recent = progress["recent_returns"]
    lag_sum = progress["policy_lag_sum"]
    summary = {
        "algo": "impala",
        "env_id": args.env_id,
        "seed": args.seed,
        "world_size": args.world_size,
        "num_actors": args.num_actors,
        "deterministic": args.deterministic,
        "global_step": progress["global_step"],
        "wall_time_s": progress["wall_time_s"],
        "startup_s": progress["startup_s"],
        "train_time_s": progress["train_time_s"],
        "sps": progress["global_step"] / progress["train_time_s"],
        "eval_return_mean": float(np.mean(eval_returns)),
        "eval_return_std": float(np.std(eval_returns)),
        "reward_threshold": envpool.make_spec(args.env_id).reward_threshold,
        "train_return_last20": float(np.mean(recent)) if recent else None,
        "time_to_threshold_s": progress["time_to_threshold_s"],
        "threshold_step": progress["threshold_step"],
        "policy_lag_mean": lag_sum / progress["policy_lag_count"] if progress["policy_lag_count"] else None,
        "params_sha256": hashlib.sha256(flat_params(agent).numpy().tobytes()).hexdigest(),
    }
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    if args.save_model:
        torch.save({key: value.cpu() for key, value in agent.state_dict().items()}, os.path.join(run_dir, "model.pt"))
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
    the machine's core count), shared among the ranks on this node (torchrun's LOCAL_WORLD_SIZE).
    Linux, as /proc."""
    return max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def default_num_actors(args: RunArgs) -> int:
    """--num-actors 0: one actor per available CPU. Deterministic mode needs every actor to fill the
    same share of each batch, so there it takes the largest count up to that which divides the
    unrolls per batch."""
    if args.num_actors:
        return args.num_actors
    cpus = available_cpus()
    if not args.deterministic:
        return cpus
    unrolls = max(1, args.batch_size // args.num_envs)
    return max(d for d in range(1, min(cpus, unrolls) + 1) if unrolls % d == 0)


def setup_distributed(args: RunArgs):
    """torchrun sets RANK/LOCAL_RANK/WORLD_SIZE: join the group (gloo on CPU, NCCL on GPU). Alone:
    world size 1."""
    args.world_size = int(os.environ.get("WORLD_SIZE", "1"))
    args.rank = int(os.environ.get("RANK", "0"))
    args.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = args.cuda and torch.cuda.is_available()
    device = torch.device(f"cuda:{args.local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if args.world_size > 1:
        # torch.optim imports torch._dynamo on first use; imported once the group exists, it keeps references to
        # the group, destroy_process_group then leaves gloo's threads running, and a rank can abort as it exits
        importlib.import_module("torch._dynamo")
        # a stop signal during the rendezvous breaks the store's sockets (a NetworkError, exit 1): hold the
        # stop signals until the group exists, then their handlers run (a checkpoint after the first update)
        stop_signals = {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
        dist.init_process_group(
            "nccl" if use_cuda else "gloo", init_method="env://", timeout=timedelta(seconds=args.collective_timeout)
        )
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stop_signals)
    return device


def seed_everything(args: RunArgs, device) -> None:
    """Threads and seeds (the same on every rank: identical initial weights); deterministic kernels
    on CUDA (the CPU ones used here are deterministic already)."""
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


def finish_distributed(args: RunArgs, exit_code: int) -> None:
    """Leave the process group: together at a barrier, or at once after an error (a barrier would
    wait forever for this rank's peers; torchrun stops them)."""
    if args.world_size == 1:
        return
    if exit_code:
        os._exit(exit_code)
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

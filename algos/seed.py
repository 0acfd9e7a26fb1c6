# docs: docs/seed.md | paper: https://arxiv.org/abs/1910.06591
"""SEED-style central inference (Espeholt et al., 2019), trained with IMPALA's V-trace.

Actors hold no model: they step their envpool batches and exchange observations for actions with the
learner process, where one inference thread batches the pending requests of all actors (run when
every actor waits or after a short timeout), keeps the LSTM state of every env, and assembles the
unrolls that the training thread consumes. Local actors talk through shared memory and pipes; under
torchrun, rank 0 is the learner and every other rank is one remote actor that talks to it through
torch.distributed send/recv.

  python algos/seed.py                                              # learner + one actor per core, CartPole-v1
  torchrun --standalone --nproc_per_node=3 algos/seed.py            # learner (+ local actors) and 2 remote actors

The file reads top to bottom down to main(); below the "infrastructure" line are the flags, checks, the
actors' health checks, checkpoints, signals, torchrun plumbing (the remote actors' links) and logging that
keep a run alive, none of it SEED.
"""

import contextlib
import ctypes
import hashlib
import importlib
import json
import math
import multiprocessing.connection
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
    """The algorithm's and the environment's flags; the infrastructure's (checkpoints, timeouts, logging) are in
    `Infra`, below the fold, and the command line takes both."""

    # --- experiment and environment ---
    seed: int = 1  # seed of the experiment
    env_id: str = "CartPole-v1"  # the envpool environment id
    total_timesteps: int = 400_000  # total environment steps consumed by the learner
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
    batch_size: int = 8  # trajectories (one env's unroll each) per learner update (paper: 32); a multiple of num_envs
    gamma: float = 0.995  # discount factor (0.995 rather than 0.99: see docs/seed.md, Deviations)
    rho_bar: float = 1.0  # V-trace's truncation of the importance weights rho (paper: 1)
    c_bar: float = 1.0  # V-trace's truncation of the trace coefficients c (paper: 1)
    vtrace_lambda: float = 1.0  # lambda scaling the trace coefficients, c_i = lambda min(c_bar, pi/mu) (paper: 1)
    ent_coef: float = 0.02  # entropy bonus coefficient (0.02 rather than 0.01: see docs/seed.md, Deviations)
    vf_coef: float = 0.5  # baseline (value) loss coefficient
    norm_reward: tyro.conf.DisallowNone[Optional[bool]] = None
    """divide rewards by the running std of the discounted return (default: on for vector
    observations; off for images, whose rewards are clipped to [-1, 1] as in the paper; see
    docs/seed.md, Deviations)"""
    clip_reward: float = 10.0  # scaled rewards are clipped to [-clip_reward, clip_reward]
    max_grad_norm: float = 0.5  # global grad-norm clip (paper: 40 for summed losses; see docs)
    bf16: bool = False  # the learner's network under bfloat16 autocast: faster where the CPU or GPU has bf16 units
    compile: bool = False  # the learner's loss (network and V-trace) under torch.compile: fewer launches on a GPU
    # --- distributed ---
    num_actors: int = 0  # actors beside the learner on rank 0 (0: one per CPU); other ranks are one more each
    num_buffers: int = 0  # unroll buffers (0: max(2 x unrolls per batch, unrolls per batch + 2 x actors))
    # dynamic batching: run inference when every actor waits, or this long after the first request
    inference_timeout_ms: float = 1.0
    # --- computed at run time ---
    world_size: int = field(default=1, init=False)
    rank: int = field(default=0, init=False)
    local_rank: int = field(default=0, init=False)
    unrolls_per_batch: int = field(default=0, init=False)
    total_actors: int = field(default=0, init=False)
    num_updates: int = field(default=0, init=False)
    run_name: str = field(default="", init=False)


# `--preset atari`: the values of the page's Pong-v5 runs (docs/seed.md, Results); flags given beside it still apply
PRESETS = {
    "atari": dict(
        env_id="Pong-v5",
        total_timesteps=10_000_000,
        batch_size=8,
        learning_rate=3e-4,
        gamma=0.99,
        ent_coef=0.0006,
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
    """Seed of env 0 of `actor` (local actors first, then remote ranks) when actors start at
    `update`: distinct for every env, actor and restart point."""
    return args.seed + (update * args.total_actors + actor) * args.num_envs


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
    the reward scaler's statistics."""

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
    """Unroll buffers [K, ...] for K buffers, filled by the inference thread and read by the
    training thread (one process: no shared memory): observations x_0..x_T, and per step t the
    action, behaviour logits, reward, terminated, done (terminated or truncated), valid, the
    discounted return so far (the reward scaler's statistic), the return and length of an episode
    that ended at t (NaN elsewhere); the LSTM state before x_0; who produced it (version of the
    parameters at x_0, actor, sequence number)."""
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
    return buffers


class UnrollQueue:
    """The unrolls between the inference thread, which fills them, and the training thread, which
    consumes them: the buffers and bounded queues of the free and the full buffers' indices, every
    buffer free at first."""

    def __init__(self, args: Args, spec, num_buffers: int, state_width: int):
        self.buffers = unroll_buffers(args, spec, num_buffers, state_width)
        self.free_q = queue.Queue(maxsize=num_buffers)
        self.full_q = queue.Queue(maxsize=num_buffers)
        for k in range(num_buffers):
            self.free_q.put(k)


def actor_slots(args: Args, spec, num_actors: int) -> dict:
    """One request/response slot per actor in shared memory: the observation, what the last step
    gave (reward, terminated, done, discounted return so far, return and length of an episode that
    ended, NaN otherwise; the actor's last wait), and the action the learner answers with (-1:
    stop)."""
    obs_shape = spec.observation_space.shape
    obs_dtype = torch.uint8 if len(obs_shape) == 3 else torch.float32
    return {
        "obs": torch.zeros((num_actors, args.num_envs) + obs_shape, dtype=obs_dtype).share_memory_(),
        "step": torch.zeros((num_actors, args.num_envs, 7)).share_memory_(),
        "actions": torch.zeros((num_actors, args.num_envs), dtype=torch.long).share_memory_(),
    }


def flat_params(agent: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in agent.parameters()]).cpu()


def actor_loop(actor: int, args: Args, slots: dict, conn, group=None, start_update: int = 0) -> None:
    """One actor, no model: write the observation (and what the last step gave) into its slot, ask
    the learner for actions, step the envs. Local actors signal through a pipe (`conn`); a remote
    actor (rank > 0) sends its slot to rank 0 and receives the actions through torch.distributed
    (`group`, a pair group with rank 0)."""
    # a local actor dies with the learner; local or remote, it leaves the stop signals to the learner
    tie_to_learner(die_with_parent=group is None)
    torch.set_num_threads(1)
    num_envs = args.num_envs
    envs = make_env(args.env_id, num_envs, env_seed(args, actor, start_update), args.env_threads or 1)
    obs = envs.reset()[0]
    episode_return = np.zeros(num_envs)
    episode_length = np.zeros(num_envs)
    previous_done = np.zeros(num_envs, dtype=bool)
    # discounted return along each env, R_t = gamma R_{t-1} + r_t, reset after an episode end
    discounted_return = np.zeros(num_envs)
    # what the last step gave, as actor_slots lays it out: nothing yet
    step = np.tile(np.array([0, 0, 0, 0, np.nan, 0, 0], dtype=np.float32), (num_envs, 1))
    while True:
        slots["obs"][actor] = torch.as_tensor(obs)
        slots["step"][actor] = torch.as_tensor(step)
        request_start = time.time()
        if group is None:
            conn.send_bytes(b"")
            conn.recv_bytes()
        else:
            dist.send(slots["obs"][actor], 0, group=group)
            dist.send(slots["step"][actor], 0, group=group)
            dist.recv(slots["actions"][actor], 0, group=group)
        action = slots["actions"][actor].numpy()
        if action[0] < 0:
            envs.close()
            return
        obs, reward, terminated, truncated, info = envs.step(action)
        done = terminated | truncated
        # Episode statistics (Atari: raw rewards and real game over); the reset step after an end adds nothing.
        episode_return += info.get("reward", reward) * ~previous_done
        episode_length += ~previous_done
        ended = (info["terminated"].astype(bool) | truncated) if "terminated" in info else done
        discounted_return = discounted_return * args.gamma + reward
        finished_return = np.where(ended, episode_return, np.nan)
        wait = np.full(num_envs, time.time() - request_start)
        step[:] = np.stack([reward, terminated, done, discounted_return, finished_return, episode_length, wait], axis=1)
        episode_return[ended] = 0.0
        episode_length[ended] = 0
        discounted_return[done] = 0.0
        previous_done = done


def inference_loop(
    agent: Agent, lock, args: Args, slots: dict, conns: list, unroll_queue, control: dict, generator
) -> None:
    """The learner's inference thread. Dynamic batching: wait for requests; run one batched forward
    pass when every actor waits or inference_timeout_ms after the first request. The LSTM state of
    every env lives here. Each answered request also extends that actor's unroll (extend_unroll); a
    finished unroll goes to the training thread. An actor that was answered and has not asked again
    within actor_timeout (stopped or hung, while its process lives on) ends the job, as does one that
    has not asked at all within a start-up grace (the watch, below the fold)."""
    device = next(agent.parameters()).device
    num_actors = len(conns)
    num_envs = args.num_envs
    state = agent.initial_state(num_actors * num_envs, device).view(2, num_actors, num_envs, -1)
    # per actor: the buffer its unroll fills, the step t within it, the unroll's sequence number
    free = [unroll_queue.free_q.get() for _ in range(num_actors)]
    unrolls = {"buffer": free, "t": [0] * num_actors, "sequence": [0] * num_actors}
    # read but not answered yet: the learner answers these with "stop" at the end
    waiting = []
    control["waiting"] = waiting
    first_request = 0.0
    timeout = args.inference_timeout_ms / 1000
    # when each actor was last answered and whether it has asked at all: a silent actor ends the job
    watch = ActorWatch(num_actors, args.actor_timeout)
    while not control.get("stop"):
        # an empty `idle` means that every actor waits: run now
        idle = [conn for actor, conn in enumerate(conns) if actor not in waiting]
        limit = min(0.2, max(0.0, first_request + timeout - time.time())) if waiting else 0.2
        ready = multiprocessing.connection.wait(idle, timeout=limit) if idle else []
        for conn in ready:
            actor = conns.index(conn)
            try:
                conn.recv_bytes()
            except (EOFError, OSError):
                control.setdefault("error", (actor, "closed its connection (died)"))
                return
            if not waiting:
                first_request = time.time()
            waiting.append(actor)
        silent = watch.silent_actor(waiting)
        if silent is not None:
            control.setdefault("error", silent)
            return
        if not waiting or (len(waiting) < num_actors and time.time() < first_request + timeout):
            continue
        inference_start = time.time()
        requesters = sorted(waiting)
        index = torch.tensor(requesters)
        obs = slots["obs"][index]
        step = slots["step"][index]
        # the step after an episode end is envpool's reset step
        valid = 1.0 - step[..., 2]
        state_before = state[:, index].flatten(1, 2)
        with lock, torch.no_grad():
            obs_in = obs.flatten(0, 1).unsqueeze(0).to(device)
            logits, _, state_after = agent(obs_in, valid.view(1, -1).to(device), state_before)
            version = control["version"]
        probs = torch.softmax(logits[0], -1)
        action = torch.multinomial(probs, 1, generator=generator).view(len(requesters), num_envs).cpu()
        state[:, index] = state_after.view(2, len(requesters), num_envs, -1)
        logits = logits[0].view(len(requesters), num_envs, -1).cpu()
        state_before = state_before.view(2, len(requesters), num_envs, -1).cpu()
        slots["actions"][index] = action
        # answer first, then do the bookkeeping while the actors step
        for actor in requesters:
            conns[actor].send_bytes(b"")
            watch.answered(actor)
        for i, actor in enumerate(requesters):
            answered = {"obs": obs[i], "step": step[i], "logits": logits[i], "actions": action[i], "valid": valid[i]}
            answered.update(state=state_before[:, i], version=version)
            if not extend_unroll(args, unroll_queue, unrolls, actor, answered, control):
                waiting.clear()
                return
        control["stats"]["inference_batch_mean"].append(len(requesters) * num_envs)
        control["stats"]["inference_latency_ms"].append(1000 * (time.time() - inference_start))
        control["stats"]["actor_wait_ms"].append(1000 * step[..., 6].mean().item())
        waiting.clear()


def extend_unroll(args: Args, unroll_queue, unrolls: dict, actor: int, answered: dict, control: dict):
    """Add one answered request of `actor` to its unroll: what its previous action gave, then this
    step (x_t, the behaviour logits, the action, valid). A complete unroll goes to the training
    thread (its x_T is also x_0 of the next one), which takes a free buffer, waiting for one:
    backpressure on every actor. Returns False when the learner stopped meanwhile."""
    buffers = unroll_queue.buffers
    k = unrolls["buffer"][actor]
    t = unrolls["t"][actor]
    if t > 0:
        for j, key in enumerate(["rewards", "terms", "dones", "returns", "ep_return", "ep_length"]):
            buffers[key][k, t - 1] = answered["step"][:, j]
    if t == args.unroll_length:
        buffers["obs"][k, t] = answered["obs"]
        unroll_queue.full_q.put(k)
        while True:
            try:
                k = unroll_queue.free_q.get(timeout=0.5)
                break
            except queue.Empty:
                if control.get("stop"):
                    return False
        unrolls["buffer"][actor] = k
        unrolls["sequence"][actor] += 1
        t = 0
    if t == 0:
        buffers["state"][k] = answered["state"]
        buffers["meta"][k] = torch.tensor([answered["version"], actor, unrolls["sequence"][actor]])
    for key in ["obs", "logits", "actions", "valid"]:
        buffers[key][k, t] = answered[key]
    unrolls["t"][actor] = t + 1
    return True


def start_actors(args: Args, slots: dict, start_update: int):
    """Fork the local actor processes (before the learner computes anything), each with a pipe to
    the inference thread; the pipes of the remote actors end in their bridges. Returns (actors,
    pipes)."""
    context = mp.get_context("fork")
    # (learner end, actor end)
    pipes = [context.Pipe() for _ in range(args.total_actors)]
    actors = []
    for actor in range(args.num_actors):
        actor_args = (actor, args, slots, pipes[actor][1], None, start_update)
        actors.append(context.Process(target=actor_loop, args=actor_args, daemon=True))
    # a failed fork or a second Ctrl-C here: the actors already started must not outlive it
    try:
        for process in actors:
            process.start()
    except BaseException:
        stop_actors([process for process in actors if process.pid is not None])
        raise
    return actors, pipes


def stop_actors(actors: list) -> None:
    """Kill and reap every actor, with Ctrl-C ignored meanwhile: raised here, it would leave an actor running, and
    the interpreter's exit would wait for it for ever (actors ignore the SIGTERM that exit sends them)."""
    previous_handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    for process in actors:
        process.kill()
    for process in actors:
        process.join()
    signal.signal(signal.SIGINT, previous_handler)


def start_inference(
    args: Args, agent: Agent, lock, slots: dict, pipes: list, unroll_queue, control: dict, start_update
):
    """The inference thread, between the actors' pipes and the unroll queue of the training thread; it
    draws actions from a generator seeded as one more actor would be. Returns the thread."""
    device = next(agent.parameters()).device
    generator = torch.Generator(device=device).manual_seed(env_seed(args, args.total_actors, start_update))
    conns = [learner_end for learner_end, _ in pipes]
    inference_args = (agent, lock, args, slots, conns, unroll_queue, control, generator)
    inference = threading.Thread(target=inference_loop, args=inference_args, daemon=True)
    inference.start()
    return inference


def next_batch(args: Args, full_q, actors: list, inference, control: dict) -> list:
    """Indices of the first unrolls_per_batch unrolls that the inference thread completed, waiting
    on the full queue while watching the actors, their links and the inference thread."""
    chosen = []
    while len(chosen) < args.unrolls_per_batch:
        try:
            chosen.append(full_q.get(timeout=0.5))
        except queue.Empty:
            pass
        # checked at every unroll, the other actors may keep the queue busy: dead, silent, a lost link
        check_actors(args, actors, inference, control)
    return chosen


# the batch's tensors for the learner; the rest is bookkeeping, read on the CPU
LEARNER_KEYS = ["obs", "actions", "logits", "state", "rewards", "terms", "dones", "valid"]


def take_batch(buffers: dict, indices: list, free_q, device):
    """Copy the unrolls out and hand their buffers straight back to the inference thread. The learner's part
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


def learner_step(args: Args, agent: Agent, optimizer, flat, batch, returns, loss_function=impala_loss):
    """One update up to the optimizer's step: rewards scaled by the statistics before this batch, the
    V-trace loss and its gradient, then this batch's discounted returns merged into the reward scaler;
    the clip. The optimizer's step comes next, in step_and_publish. `loss_function` is impala_loss, compiled
    with --compile. Returns the losses."""
    return_rms = agent.return_rms
    if return_rms is not None:
        batch["rewards"] = scale_rewards(batch["rewards"], return_rms, args.clip_reward)
    loss, losses = loss_function(agent, batch, args)
    # zeroed in place: the parameters' gradients are views of flat.grad
    optimizer.zero_grad(set_to_none=False)
    loss.backward()
    if return_rms is not None:
        moments = rms_moments(returns.to(flat.device), batch["valid"].reshape(-1), return_rms.mean)
        return_rms.load(*rms_merge(return_rms.mean, return_rms.var, return_rms.count, moments))
    torch.nn.utils.clip_grad_norm_([flat], args.max_grad_norm)
    return losses


def step_and_publish(optimizer, lock, control: dict, version: int) -> None:
    """The optimizer's step under the lock that the inference thread holds for its forward pass, so
    that it never acts with half-updated parameters and knows them as `version`."""
    with lock:
        optimizer.step()
        control["version"] = version


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
    # stop signals, flag checks, torchrun's process group (rank 0 the learner, every other rank one remote actor),
    # seeds and threads: all below the fold
    run = Run(args)
    device = run.device
    args.num_actors = default_num_actors(args)
    args.total_actors = args.num_actors + args.world_size - 1
    args.unrolls_per_batch = args.batch_size // args.num_envs
    num_buffers = args.num_buffers or max(2 * args.unrolls_per_batch, args.unrolls_per_batch + 2 * args.total_actors)
    args.num_updates = max(1, args.total_timesteps // (args.batch_size * args.unroll_length))
    spec = envpool.make_spec(args.env_id)
    if args.rank > 0:
        return run_remote_actor(args, spec, run.groups)
    if args.norm_reward is None:
        args.norm_reward = len(spec.observation_space.shape) != 3
    agent = Agent(spec.observation_space.shape, spec.action_space.n, args.network, args.use_lstm, args.norm_reward)
    agent = agent.to(device)
    flat = flatten_parameters(agent)
    optimizer = make_optimizer(args, flat)
    # --compile: the loss compiled on its first call (docs/seed.md, Details)
    loss_function = torch.compile(impala_loss) if args.compile else impala_loss
    # fresh progress, or a checkpoint's with --resume (weights and optimizer state loaded in place; its update
    # goes to the remote actors, whose env seeds depend on it)
    progress = run.restore(agent, optimizer)
    start_update = progress["update"]

    # Actor processes first (fork before the learner computes anything), then the bridges and the inference thread.
    slots = actor_slots(args, spec, args.total_actors)
    inference_stats = {"inference_batch_mean": [], "inference_latency_ms": [], "actor_wait_ms": []}
    control = {"version": start_update, "stats": inference_stats}
    actors, pipes = start_actors(args, slots, start_update)
    # whatever ends the loop (an exception too), no actor outlives it; a dead or silent actor ends the run
    with run.actors_running(actors, control):
        bridges = start_bridges(args, run.groups, slots, pipes, control)
        unroll_queue = UnrollQueue(args, spec, num_buffers, agent.initial_state(1).shape[-1])
        lock = threading.Lock()
        inference = start_inference(args, agent, lock, slots, pipes, unroll_queue, control, start_update)
        run.start_training()
        for update in range(start_update, args.num_updates):
            # COLLECT: the first unrolls that the inference thread completed
            indices = next_batch(args, unroll_queue.full_q, actors, inference, control)
            run.lap("wait")
            batch, returns, versions, finished = take_batch(unroll_queue.buffers, indices, unroll_queue.free_q, device)
            # LEARN: V-trace on the batch
            optimizer.param_groups[0]["lr"] = learning_rate(args, update)
            losses = learner_step(args, agent, optimizer, flat, batch, returns, loss_function)
            # PUBLISH: the optimizer's step, under the inference thread's lock, as version update + 1
            step_and_publish(optimizer, lock, control, update + 1)
            run.lap("learn")
            # BOOKKEEPING: clocks, policy lag (learner version minus the batch's), the inference thread's figures,
            # episodes, logs, checkpoints; a stop signal ends the loop after a checkpoint
            if run.end_update(losses, versions, finished, unroll_queue.full_q, control):
                break
    # the inference thread's end, the final evaluation and summary.json (unless a signal or an actor stopped the
    # run), the writer; then "stop" for every remote actor, and the process group
    return run.finish(inference, slots, pipes, bridges, control)


# ==== infrastructure: flags, actors' health, checkpoints, signals, torchrun, logging; nothing below is SEED ====
@dataclass
class Infra:
    """The flags that keep a run alive, watched, reproducible and resumable, not what it learns."""

    exp_name: str = "seed"  # the name of this experiment (part of the run name)
    preset: Optional[Literal[tuple(PRESETS)]] = None  # start from a preset's values (PRESETS, above the fold)
    torch_deterministic: bool = True  # deterministic CUDA kernels (the CPU kernels used here are anyway)
    cuda: bool = True  # run the learner's inference and training on CUDA when it is available (actors have no model)
    track: bool = False  # log to Weights & Biases as well as TensorBoard
    wandb_project_name: str = "distrl"  # the wandb project name
    wandb_entity: Optional[str] = None  # the wandb entity (team)
    capture_video: bool = False  # write the first evaluation episode as runs/<run_name>/videos/eval_episode0.mp4
    save_model: bool = False  # write the final weights (state_dict) to runs/<run_name>/model.pt
    eval_episodes: int = 10  # episodes of the final, greedy policy to evaluate at the end
    torch_threads: int = 0  # learner's torch threads, shared by its inference and training threads (0: 1)
    env_threads: int = 0  # envpool threads per actor (0: 1)
    checkpoint_every: int = 0  # write runs/<run_name>/checkpoint.pt every this many updates (0: on signals only)
    resume: bool = False  # continue from runs/<run_name>/checkpoint.pt when it exists
    collective_timeout: float = 600.0  # seconds a rank waits for another before it fails (torch's default: 1800)
    actor_timeout: float = 60.0  # seconds an actor may stay silent (stopped, hung; 5x that to start): the job ends


# every flag of the command line, the algorithm's first (in --help too)
@dataclass
class RunArgs(Infra, Args):
    pass


# a checkpoint of another format version ends the run with exit 2 (read_checkpoint)
CHECKPOINT_VERSION = 1


class Run:
    """The infrastructure of one run, as main() uses it: set-up, restore, the actors' end, clocks, the
    bookkeeping of each update (policy lag, the inference thread's figures, episodes, TensorBoard, progress
    lines, checkpoints, stop signals) and the end (the final evaluation, summary.json, the remote actors'
    stop, closing the writer and the process group)."""

    def __init__(self, args: RunArgs):
        # first of all: a signal during start-up ends in a checkpoint (forked processes keep the handlers)
        self.stop = install_stop_handlers()
        # envpool's spaces warn about it
        warnings.filterwarnings("ignore", message=".*precision lowered by casting.*")
        validate(args)
        self.device, self.groups = setup_distributed(args)
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
        """Fresh progress, or the checkpoint's with --resume (the weights and optimizer state loaded in place),
        whose update (the restart point) goes to the remote actors. The run keeps agent and optimizer for its
        checkpoints and summary."""
        self.agent = agent
        self.optimizer = optimizer
        self.progress = restore(self.args, agent, optimizer, self.device, self.checkpoint_path)
        # rank 0 sends its update; the remote actors receive it (agree_on_start in run_remote_actor)
        agree_on_start(self.args, self.progress["update"])
        return self.progress

    @contextlib.contextmanager
    def actors_running(self, actors: list, control: dict):
        """Around the training loop: a dead or silent actor, a lost link or a stopped inference thread
        (ActorDied) ends the run with one line and exit code 1; whatever ends it, the inference thread is told
        to stop and every local actor is killed and reaped (they ignore the SIGTERM of exit)."""
        try:
            yield
            # training time ends with the loop (the final evaluation counts in wall time only)
            self.clock = advance_clock(self.progress, self.clock)
        except ActorDied as error:
            print(f"{os.path.basename(sys.argv[0])}: error: {error}; stopping", file=sys.stderr, flush=True)
            self.exit_code = 1
        finally:
            control["stop"] = True
            stop_actors(actors)

    def start_training(self) -> None:
        """The writer (after the fork: its thread must not be copied into the actors), then training time
        counts from here (start-up is reported on its own)."""
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

    def end_update(self, losses: torch.Tensor, versions, finished: list, full_q, control: dict) -> bool:
        """One update's bookkeeping: the counters, the clocks, the policy lag (the learner's version minus the
        batch's mean), the inference thread's figures since the last update, the episodes that ended in the
        batch, the log and progress line, a checkpoint when due or asked for. Returns True when a stop signal
        came (checkpoint written: the loop ends)."""
        args = self.args
        progress = self.progress
        stats = self.stats
        update = progress["update"]
        progress["update"] = update + 1
        progress["global_step"] += args.batch_size * args.unroll_length
        self.clock = advance_clock(progress, self.clock)
        record_lag(progress, stats, update - versions.double().mean().item())
        stats["wait_s"] = self.lap_times["wait"]
        stats["learn_s"] = self.lap_times["learn"]
        stats["losses"] = losses
        take_inference_stats(control, stats, progress)
        record_returns(progress, [episode_return for episode_return, _ in finished], self.threshold)
        log_update(self.writer, progress, finished, learner_scalars(progress, stats, self.optimizer, full_q))
        self.last_print = print_progress(progress, args.num_updates, self.last_print)
        # SIGTERM/SIGUSR1 (SLURM preemption): save, then exit cleanly
        self.stopped = self.stop["signal"] != 0
        due = args.checkpoint_every and progress["update"] % args.checkpoint_every == 0
        if self.stopped or due:
            checkpoint = {**progress, "model": self.agent.state_dict(), "optimizer": self.optimizer.state_dict()}
            save_checkpoint(self.checkpoint_path, checkpoint)
        if self.stopped:
            announce_stop(progress, self.checkpoint_path)
        self.lap_start = time.time()
        return self.stopped

    def finish(self, inference, slots: dict, pipes: list, bridges: list, control: dict) -> int:
        """The inference thread's end; the final evaluation and summary (also after resuming a checkpoint of the
        last update; not after a stop signal or a dead actor), the writer and wandb; "stop" for every remote
        actor, and the process group. Returns the exit code."""
        args = self.args
        inference.join(timeout=10)
        if self.exit_code == 0 and not self.stopped:
            write_summary(args, self.agent, self.writer, self.progress, self.clock, self.device, self.run_dir)
        close_writer(args, self.writer)
        if not self.exit_code:
            stop_remote_actors(args, slots, pipes, bridges, control)
        finish_distributed(args, self.exit_code)
        return self.exit_code


# ----------------------------------------------------------------------------------------------- actors' health
class ActorDied(RuntimeError):
    """An actor (or, in SEED, the link to it) is gone: the job ends non-zero."""


def tie_to_learner(die_with_parent: bool = True) -> None:
    """An actor: it dies with its learner, whatever kills the learner (PR_SET_PDEATHSIG; a remote actor is a
    rank of its own, which torchrun stops), and it ignores the stop signals: torchrun sends SIGTERM to every
    rank and Ctrl-C reaches every process, the learner turns the signal into a checkpoint and then answers
    every actor with "stop", so an actor must not die of it first."""
    if die_with_parent:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    for signal_number in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(signal_number, signal.SIG_IGN)


class ActorWatch:
    """The inference thread's look at its actors: an actor that was answered and has not asked again within
    the timeout (stopped or hung, while its process lives on) is silent, as is one that has not asked at
    all within STARTUP_GRACE times it. When the loop itself was away for over half of the timeout
    (backpressure, the whole job suspended), silence counts from its return."""

    # before its first request an actor builds its envs, which may take this many times the timeout (a machine
    # with many more actors than cores starts them slowly)
    STARTUP_GRACE = 5

    def __init__(self, num_actors: int, timeout: float):
        self.timeout = timeout
        self.answered_at = [time.monotonic()] * num_actors
        # the actors that have asked once
        self.asked = set()
        # when the loop last looked
        self.looked = time.monotonic()

    def answered(self, actor: int) -> None:
        self.answered_at[actor] = time.monotonic()

    def silent_actor(self, waiting: list) -> Optional[tuple]:
        """The first silent actor and why, or None; `waiting`: the actors whose requests were read and not
        answered yet."""
        self.asked.update(waiting)
        now = time.monotonic()
        if now - self.looked > self.timeout / 2:
            self.answered_at = [now] * len(self.answered_at)
        self.looked = now
        asking = set(waiting)
        grace = self.STARTUP_GRACE * self.timeout
        for actor, answered_at in enumerate(self.answered_at):
            if actor in self.asked and actor not in asking and now - answered_at > self.timeout:
                return actor, f"silent for {self.timeout:g} s (stopped or hung)"
            if actor not in self.asked and now - answered_at > grace:
                return actor, f"not started after {grace:g} s, {self.STARTUP_GRACE} x --actor-timeout (stopped or hung)"
        return None


def actor_name(args: RunArgs, actors: list, actor: int) -> str:
    """An actor as an error names it: a local one by its process, a remote one by its rank."""
    if actor < args.num_actors:
        return f"actor {actor} (pid {actors[actor].pid})"
    return f"remote actor {actor} (rank {actor - args.num_actors + 1})"


def check_actors(args: RunArgs, actors: list, inference, control: dict) -> None:
    """The learner's look at its actors while it waits: ActorDied when a local actor has exited, the
    inference thread found an actor silent or a bridge lost its link (control's "error"), or the inference
    thread itself stopped."""
    for actor, process in enumerate(actors):
        if process.exitcode is not None:
            raise ActorDied(f"actor {actor} (pid {process.pid}) exited with code {process.exitcode}")
    if "error" in control:
        actor, why = control["error"]
        raise ActorDied(f"{actor_name(args, actors, actor)} {why}")
    if not inference.is_alive():
        raise ActorDied("the inference thread stopped")


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
    # a pause of the inference thread's own over half the timeout (the whole job suspended) restarts the silence
    # count, and it looks at its actors between forward passes (every 0.2 s while it waits): a shorter timeout
    # might never fire
    if args.actor_timeout < 2:
        fail("actor_timeout", f"must be at least 2 s, got {args.actor_timeout}")
    not_negative = ["torch_threads", "env_threads", "num_actors", "num_buffers", "checkpoint_every", "ent_coef"]
    not_negative += ["vf_coef", "inference_timeout_ms"]
    for name in not_negative:
        if getattr(args, name) < 0:
            fail(name, f"must not be negative, got {getattr(args, name)}")
    for name in ["gamma", "vtrace_lambda", "rmsprop_alpha"]:
        if not 0.0 < getattr(args, name) <= 1.0:
            fail(name, f"must be in (0, 1], got {getattr(args, name)}")
    if args.batch_size % args.num_envs:
        fail("batch_size", f"{args.batch_size} is not a multiple of --num-envs {args.num_envs}")
    # Every actor always holds the buffer it is filling, and the single inference thread waits for a free one
    # when an actor's unroll completes: with fewer than actors + unrolls - 1 buffers the learner can never gather
    # a batch while every actor waits (a deadlock), so such a count is refused.
    unrolls = args.batch_size // args.num_envs
    actors = default_num_actors(args) + int(os.environ.get("WORLD_SIZE", "1")) - 1
    if args.num_buffers and args.num_buffers < actors + unrolls - 1:
        needs = f"{actors} actors and {unrolls} unrolls per batch need at least {actors + unrolls - 1}"
        fail("num_buffers", f"{args.num_buffers} is too few: {needs}")
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
        fail("env_id", f"'{args.env_id}' has observation space {obs_space}; SEED here needs a flat or image Box")
    if not isinstance(act_space, gym.spaces.Discrete):
        fail("env_id", f"'{args.env_id}' has action space {act_space}; SEED here needs Discrete actions")
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
        # the inference thread's per-update means summed over the updates that ran a batch, and their count
        "inference_sums": {key: 0.0 for key in ["inference_batch_mean", "inference_latency_ms", "actor_wait_ms"]},
        "inference_count": 0,
        "config": config,
    }


def new_stats() -> dict:
    """The last update's learner figures: its policy lag, its wait for its batch, its compute, its
    losses and the means of the inference thread's figures since the update before (empty when it
    ran no batch)."""
    return {
        "lag": 0.0,
        "wait_s": 0.0,
        "learn_s": 0.0,
        "losses": torch.zeros(3),
        "inference": {},
    }


def take_inference_stats(control: dict, stats: dict, progress: dict) -> None:
    """The inference thread's figures since the last update (batch size, latency, the actors'
    waits), as means, added to the whole-run sums."""
    since = control["stats"]
    control["stats"] = {key: [] for key in since}
    stats["inference"] = {key: float(np.mean(values)) for key, values in since.items() if values}
    if stats["inference"]:
        progress["inference_count"] += 1
        for key, value in stats["inference"].items():
            progress["inference_sums"][key] += value


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
        **{f"stats/{key}": value for key, value in stats["inference"].items()},
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
    payload = {**payload, "algo": "seed", "version": CHECKPOINT_VERSION}
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
    if written_by not in (None, "seed"):
        fail("resume", f"{checkpoint_path} was written by {written_by}.py, not seed.py; use another --exp-name")
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
            f"{checkpoint_path} lacks {', '.join(missing)}: not a checkpoint of seed.py; use another --exp-name",
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
    (`Args`) but the budget, which may grow, how the work is spread over actors, buffers and inference
    batches, and whether the loss is compiled; none of `Infra`'s (how the run is kept alive, watched or saved).
    Values derived from the flags (init=False) follow from them."""
    may_change = {"total_timesteps", "num_actors", "num_buffers", "inference_timeout_ms", "compile"}
    return {flag.name: getattr(args, flag.name) for flag in fields(Args) if flag.init and flag.name not in may_change}


def load_optimizer(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """A checkpoint's optimizer state under this run's implementation of Adam (fused on CUDA), not the one that
    wrote it: a run resumed on another device keeps its device's, and Adam's step counter goes where that needs."""
    for saved, group in zip(state["param_groups"], optimizer.param_groups, strict=True):
        if "fused" in group:
            saved["fused"] = group["fused"]
    optimizer.load_state_dict(state)


def restore(args: RunArgs, model, optimizer, device, checkpoint_path: str) -> dict:
    """A fresh progress dict, or with --resume and a checkpoint, the checkpoint's, with the model
    and the optimizer loaded in place. (Rank 0 only: the remote actors hold no model; agree_on_start
    gives them the restart point.)"""
    progress = new_progress(run_config(args))
    if not (args.resume and os.path.exists(checkpoint_path)):
        return progress
    checkpoint = read_checkpoint(checkpoint_path, progress)
    try:
        model.load_state_dict(checkpoint.pop("model"))
        load_optimizer(optimizer, checkpoint.pop("optimizer"))
    except (KeyError, RuntimeError, ValueError, TypeError, AttributeError) as error:
        refuse_checkpoint(checkpoint_path, error)
    recent_returns = checkpoint.pop("recent_returns")
    progress.update(checkpoint)
    progress["recent_returns"].extend(recent_returns)
    return progress


def announce_stop(progress: dict, checkpoint_path: str) -> None:
    """SIGTERM/SIGUSR1 (SLURM preemption) ended the loop after a checkpoint: say where it is."""
    print(
        f"signal received: checkpoint of update {progress['update']} written to {checkpoint_path}; "
        "rerun with --resume to continue",
        flush=True,
    )


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


def close_writer(args: RunArgs, writer: SummaryWriter) -> None:
    writer.close()
    if args.track:
        import wandb

        wandb.finish()


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
    count = progress["inference_count"]
    summary = {
        "algo": "seed",
        "env_id": args.env_id,
        "seed": args.seed,
        "world_size": args.world_size,
        "num_actors": args.total_actors,
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
        **{key: total / count if count else None for key, total in progress["inference_sums"].items()},
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
    """--num-actors 0: one local actor per available CPU (remote ranks add one actor each)."""
    return args.num_actors or available_cpus()


def setup_distributed(args: RunArgs):
    """torchrun sets RANK/LOCAL_RANK/WORLD_SIZE. Rank 0 is the learner; rank r > 0 is a remote actor
    linked to it by a gloo pair group (CPU tensors; inference may still run on the learner's GPU).
    Alone: world size 1."""
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


def agree_on_start(args: RunArgs, update: int) -> int:
    """The learner's restart point (`update` on rank 0), sent to the remote actors, whose env seeds
    depend on it."""
    start = torch.tensor([update])
    if args.resume and args.world_size > 1:
        dist.broadcast(start, 0)
    return int(start)


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


def stop_remote_actors(args: RunArgs, slots: dict, pipes: list, bridges: list, control: dict) -> None:
    """Answer each remote actor's next request with "stop" and wait (30 s at most) until its bridge
    has sent it."""
    slots["actions"][args.num_actors :] = -1
    for actor, bridge in enumerate(bridges, start=args.num_actors):
        conn = pipes[actor][0]
        deadline = time.time() + 30
        # read by the inference thread, not answered
        if actor in control["waiting"]:
            conn.send_bytes(b"")
        # a bridge returns once it has sent "stop"
        while bridge.is_alive() and time.time() < deadline:
            if conn.poll(0.1):
                conn.recv_bytes()
                conn.send_bytes(b"")
        if bridge.is_alive():
            print(
                f"{os.path.basename(sys.argv[0])}: error: remote actor {actor} did not take its stop in 30 s",
                file=sys.stderr,
                flush=True,
            )
            # torchrun stops the remote actors
            os._exit(1)


def finish_distributed(args: RunArgs, exit_code: int) -> None:
    """Leave the process group: together at a barrier, or at once after an error (a barrier would
    wait forever for this rank's peers; torchrun stops them)."""
    if args.world_size == 1:
        return
    if exit_code:
        os._exit(exit_code)
    dist.barrier()
    dist.destroy_process_group()


def run_remote_actor(args: RunArgs, spec, groups: dict) -> int:
    """Rank r > 0: one remote actor, whose actor index follows the learner's local actors."""
    slots = actor_slots(args, spec, args.total_actors)
    actor_loop(args.num_actors + args.rank - 1, args, slots, None, groups[args.rank], agree_on_start(args, 0))
    finish_distributed(args, 0)
    return 0


def remote_bridge(actor: int, peer: int, group, slots: dict, conn, control: dict) -> None:
    """Rank 0's stand-in for the remote actor on rank `peer`: receive its request into the actor's
    slot, pass it to the inference thread like a local actor would, send the actions back."""
    try:
        while True:
            dist.recv(slots["obs"][actor], peer, group=group)
            dist.recv(slots["step"][actor], peer, group=group)
            conn.send_bytes(b"")
            conn.recv_bytes()
            # what was sent decides: the learner may write "stop" meanwhile
            actions = slots["actions"][actor].clone()
            dist.send(actions, peer, group=group)
            if actions[0] < 0:
                return
    # any failure of the link ends the job
    except Exception as error:  # noqa: BLE001
        control.setdefault("error", (actor, f"lost its link: {error!r}"))


def start_bridges(args: RunArgs, groups: dict, slots: dict, pipes: list, control: dict) -> list:
    """Rank 0's threads standing in for the remote actors, one per rank > 0 (actor indices after the
    local ones)."""
    bridges = []
    for rank in range(1, args.world_size):
        actor = args.num_actors + rank - 1
        bridge_args = (actor, rank, groups[rank], slots, pipes[actor][1], control)
        bridges.append(threading.Thread(target=remote_bridge, args=bridge_args, daemon=True))
    for bridge in bridges:
        bridge.start()
    return bridges


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

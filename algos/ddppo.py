# docs: docs/ddppo.md | paper: https://arxiv.org/abs/1911.00357
"""DD-PPO: Decentralized Distributed PPO (Wijmans et al., 2020).

Every rank steps its own envpool batch, keeps its own copy of the policy and optimizer, and trains
PPO on its own rollout; gradients are averaged with one all-reduce per minibatch, so all replicas
stay identical and there is no parameter server. Ranks that fall behind are preempted once a
fraction `sync_frac` of the ranks has finished its rollout, so stragglers do not hold the others up.

  python algos/ddppo.py                                             # world size 1, CartPole-v1
  torchrun --standalone --nproc_per_node=2 algos/ddppo.py           # 2 ranks on one machine

The file reads top to bottom down to main(); below the "infrastructure" line are the flags, checks,
checkpoints, signals, torchrun plumbing and logging that keep a run alive, none of it DD-PPO.
"""

import ctypes
import importlib
import json
import math
import os
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
import torch.nn as nn
import tyro
from torch.utils.tensorboard import SummaryWriter


@dataclass
class Args:
    """The algorithm's and the environment's flags; the infrastructure's (checkpoints, threads, logging) are
    in `Infra`, below the fold, and the command line takes both."""

    # --- experiment and environment ---
    seed: int = 1  # seed of the experiment
    env_id: str = "CartPole-v1"  # the envpool environment id
    total_timesteps: int = 100_000  # total environment steps over all ranks
    # --- algorithm ---
    learning_rate: float = 2.5e-3  # Adam's learning rate
    anneal_lr: bool = True  # anneal the learning rate linearly to zero
    local_num_envs: int = 16  # environments stepped by each rank
    num_steps: int = 16  # rollout length per environment and update
    gamma: float = 0.98  # discount factor
    gae_lambda: float = 0.8  # lambda of generalized advantage estimation
    num_minibatches: int = 1  # minibatches per epoch; a fixed count, so all ranks all-reduce equally often
    update_epochs: int = 10  # epochs over each rollout
    norm_adv: bool = True  # normalize advantages once per update over all ranks (as habitat-lab)
    clip_coef: float = 0.2  # PPO's surrogate clipping coefficient
    clip_vloss: bool = False  # clip the value loss as in PPO2
    ent_coef: float = 0.0  # entropy bonus coefficient
    vf_coef: float = 0.5  # value loss coefficient
    max_grad_norm: float = 0.5  # global gradient-norm clip, applied after the all-reduce
    # normalize observations by their running mean/std over all ranks (default: on for Box actions)
    norm_obs: tyro.conf.DisallowNone[Optional[bool]] = None
    # divide rewards by the running std of the discounted return (default: on for Box actions)
    norm_reward: tyro.conf.DisallowNone[Optional[bool]] = None
    clip_obs: float = 10.0  # normalized observations are clipped to [-clip_obs, clip_obs]
    clip_reward: float = 10.0  # scaled rewards are clipped to [-clip_reward, clip_reward]
    # --- distributed: DD-PPO's preemption of stragglers ---
    preempt: bool = True  # preempt stragglers once sync_frac of the ranks finished their rollout
    sync_frac: float = 0.6  # fraction of ranks that must finish before the rest are preempted (paper: 0.6)
    min_rollout_frac: float = 0.25  # a preempted rank keeps at least this fraction of num_steps (paper: 0.25)
    # --- computed at run time ---
    world_size: int = field(default=1, init=False)
    rank: int = field(default=0, init=False)
    local_rank: int = field(default=0, init=False)
    batch_size: int = field(default=0, init=False)
    num_updates: int = field(default=0, init=False)
    run_name: str = field(default="", init=False)


# `--preset atari`: CleanRL's Atari PPO values, those of the page's Pong-v5 runs (docs/ddppo.md, Results);
# flags given beside it still apply
PRESETS = {
    "atari": dict(
        env_id="Pong-v5",
        total_timesteps=10_000_000,
        local_num_envs=8,
        num_steps=128,
        num_minibatches=4,
        update_epochs=4,
        learning_rate=2.5e-4,
        gamma=0.99,
        gae_lambda=0.95,
        clip_coef=0.1,
        clip_vloss=True,
        ent_coef=0.01,
    ),
}


# ----------------------------------------------------------------------------------------------- environment
def make_env(env_id: str, num_envs: int, seed: int, num_threads: int = 1, **kwargs):
    """An envpool batch. Env i of the batch is seeded with seed + i. Atari gets DeepMind
    preprocessing."""
    options = {}
    # Atari: 84x84 grey frames, 4 stacked, frame skip 4 (envpool's defaults), plus these
    if len(envpool.make_spec(env_id).observation_space.shape) == 3:
        options = dict(episodic_life=True, reward_clip=True, noop_max=30, repeat_action_probability=0.0)
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


def env_seed(args: Args, rank: int, update: int) -> int:
    """Seed of env 0 on `rank` from `update` on: distinct for every env of every rank and every
    restart point."""
    return args.seed + (update * args.world_size + rank) * args.local_num_envs


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


class RunningMeanStd(nn.Module):
    """Mean, population variance and count (float64) of all data merged so far: buffers, so
    state_dict has them."""

    def __init__(self, shape=()):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    def load(self, mean, var, count) -> None:
        self.mean.copy_(mean)
        self.var.copy_(var)
        self.count.copy_(count)


class Agent(nn.Module):
    """Actor-critic: two 64-64 tanh MLPs for vector observations, a shared Nature-CNN for images; a
    categorical head for Discrete actions, a diagonal Gaussian with state-independent log-std for
    Box. With norm_obs, observations are normalized by `obs_rms` (frozen here; main merges each
    rollout into it); `return_rms` holds the reward scaler's statistics. Neither exists when off."""

    def __init__(
        self, obs_shape, action_space, norm_obs: bool = False, norm_reward: bool = False, clip_obs: float = 10.0
    ):
        super().__init__()
        self.continuous = isinstance(action_space, gym.spaces.Box)
        self.image = len(obs_shape) == 3
        n_out = int(np.prod(action_space.shape)) if self.continuous else int(action_space.n)
        if self.image:
            self.trunk = nn.Sequential(
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
            self.actor = layer_init(nn.Linear(512, n_out), 0.01)
            self.critic = layer_init(nn.Linear(512, 1), 1.0)
        else:
            obs_dim = int(np.prod(obs_shape))
            self.trunk = nn.Identity()
            self.actor = mlp(obs_dim, n_out, 0.01)
            self.critic = mlp(obs_dim, 1, 1.0)
        if self.continuous:
            self.actor_logstd = nn.Parameter(torch.zeros(n_out))
        self.obs_rms = RunningMeanStd(obs_shape) if norm_obs else None
        self.return_rms = RunningMeanStd() if norm_reward else None
        self.clip_obs = clip_obs

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        if self.image:
            return self.trunk(scale_frames(obs))
        if self.obs_rms is None:
            return obs.float()
        x = (obs.float() - self.obs_rms.mean) / torch.sqrt(self.obs_rms.var + 1e-8)
        return x.clamp(-self.clip_obs, self.clip_obs).float()

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self.features(obs)).squeeze(-1)

    def get_action_and_value(self, obs, action=None, generator=None, greedy: bool = False):
        """Log-prob and entropy of `action` under the current policy (or of an action sampled here,
        the mode when greedy), and the value. Returns action, log-prob, entropy, value."""
        hidden = self.features(obs)
        out = self.actor(hidden)
        if self.continuous:
            std = self.actor_logstd.exp()
            if action is None and greedy:
                action = out
            elif action is None:
                action = out + std * torch.randn(out.shape, generator=generator, device=out.device)
            logprob = (-0.5 * ((action - out) / std) ** 2 - std.log() - 0.5 * math.log(2 * math.pi)).sum(-1)
            entropy = (0.5 + 0.5 * math.log(2 * math.pi) + self.actor_logstd).sum().expand(out.shape[0])
        else:
            logp_all = torch.log_softmax(out, dim=-1)
            if action is None and greedy:
                action = out.argmax(-1)
            elif action is None:
                action = torch.multinomial(logp_all.exp(), 1, generator=generator).squeeze(-1)
            logprob = logp_all.gather(-1, action.unsqueeze(-1)).squeeze(-1)
            entropy = -(logp_all.exp() * logp_all).sum(-1)
        return action, logprob, entropy, self.critic(hidden).squeeze(-1)


# ----------------------------------------------------------------------------------------------- algorithm
def compute_gae(rewards, values, next_value, terminations, dones, gamma: float, gae_lambda: float):
    """Generalized advantage estimation (Schulman et al. 2016) over a [T, N] rollout.

    values[t + 1] (next_value after the last step) bootstraps step t unless the episode *terminated*
    there; the recursion is cut wherever an episode ended (terminated or truncated). With envpool's
    next-step autoreset, the observation after a truncation is the final one, so a truncated step
    bootstraps from it.
    """
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[0])):
        v_next = next_value if t == rewards.shape[0] - 1 else values[t + 1]
        delta = rewards[t] + gamma * v_next * (1.0 - terminations[t]) - values[t]
        last = delta + gamma * gae_lambda * (1.0 - dones[t]) * last
        advantages[t] = last
    return advantages, advantages + values


def discounted_returns(rewards, dones, acc, gamma: float):
    """The reward scaler's return along each env, R_t = gamma R_{t-1} + r_t, reset to 0 after an
    episode ends; acc carries R over from the previous rollout. Returns R [T, N] and the accumulator
    after the last step."""
    out = torch.zeros_like(rewards)
    for t in range(rewards.shape[0]):
        acc = acc * gamma + rewards[t]
        out[t] = acc
        acc = acc * (1.0 - dones[t])
    return out, acc


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
    # delta: the batch mean minus the running mean
    delta = moments[1 : 1 + d].view_as(mean) / n.clamp(min=1e-12)
    batch_var = (moments[1 + d :].view_as(mean) / n.clamp(min=1e-12) - delta**2).clamp(min=0.0)
    f = n / (count + n).clamp(min=1e-12)
    return mean + f * delta, var + f * (batch_var - var) + f * (1 - f) * delta**2, count + n


def normalized_advantages(adv: torch.Tensor, world_size: int) -> torch.Tensor:
    """Advantages minus their mean, over their std, both over every rank's batch (one all-reduce of
    three numbers), so all ranks use the same statistics however preemption split the data."""
    x = adv.double()
    moments = torch.stack([x.new_tensor(float(x.numel())), x.sum(), (x * x).sum()])
    if world_size > 1:
        dist.all_reduce(moments)
    n, total, squares = moments
    mean = total / n.clamp(min=1)
    # unbiased, as torch.std
    std = torch.sqrt((squares - n * mean**2).clamp(min=0) / (n - 1).clamp(min=1))
    return ((adv - mean) / (std + 1e-8)).float()


def ppo_loss(agent: Agent, minibatch: dict, args: Args, with_stats: bool = True):
    """PPO's clipped surrogate, (clipped) value loss and entropy bonus for one minibatch;
    with_stats: also the diagnostics (losses, approximate KL, clip fraction)."""
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(minibatch["obs"], minibatch["actions"])
    logratio = newlogprob - minibatch["logprobs"]
    ratio = logratio.exp()
    adv = minibatch["advantages"]
    pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)).mean()
    returns = minibatch["returns"]
    if args.clip_vloss:
        v_clipped = minibatch["values"] + (newvalue - minibatch["values"]).clamp(-args.clip_coef, args.clip_coef)
        v_loss = 0.5 * torch.max((newvalue - returns) ** 2, (v_clipped - returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((newvalue - returns) ** 2).mean()
    entropy_mean = entropy.mean()
    loss = pg_loss - args.ent_coef * entropy_mean + args.vf_coef * v_loss
    if not with_stats:
        return loss, None
    with torch.no_grad():
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()
        stats = torch.stack([pg_loss, v_loss, entropy_mean, approx_kl, clipfrac])
    return loss, stats


def flatten_parameters(agent: nn.Module) -> torch.Tensor:
    """One flat vector whose views are the agent's parameters, with a flat gradient whose views are
    their .grad (backward adds into them in place), so that the all-reduce, the clip and Adam each
    act on one tensor. Call it after moving the agent to its device; the optimizer then works on
    [flat]."""
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
    """Adam on the flat parameter vector (eps 1e-5, as CleanRL's PPO). On CUDA it is fused: its elementwise
    operations in one kernel."""
    return torch.optim.Adam([flat], lr=args.learning_rate, eps=1e-5, fused=flat.is_cuda)


def average_gradient(flat: torch.Tensor, world_size: int) -> None:
    """The flat gradient averaged over ranks with one all-reduce, in place (the only collective of
    the inner loop). Every rank gets the same vector, so the replicas stay equal."""
    if world_size > 1:
        dist.all_reduce(flat.grad)
        flat.grad /= world_size


def ppo_update(agent, optimizer, batch: dict, args: Args, generator, world_size: int) -> torch.Tensor:
    """update_epochs x num_minibatches Adam steps on the flat parameter vector (flatten_parameters),
    each on the gradient averaged over ranks and then clipped to a global norm. Minibatch sizes
    follow this rank's (possibly preempted) batch, but their number is fixed, so every rank enters
    the all-reduce equally often (an empty minibatch contributes a zero gradient). Returns the
    diagnostics of the last epoch."""
    flat = optimizer.param_groups[0]["params"][0]
    n = batch["advantages"].shape[0]
    if args.norm_adv:
        batch = dict(batch, advantages=normalized_advantages(batch["advantages"], world_size))
    stats = torch.zeros(5, device=flat.device)
    for epoch in range(args.update_epochs):
        last_epoch = epoch == args.update_epochs - 1
        for indices in torch.randperm(n, generator=generator, device=flat.device).tensor_split(args.num_minibatches):
            flat.grad.zero_()
            if len(indices):
                minibatch = {key: value[indices] for key, value in batch.items()}
                loss, minibatch_stats = ppo_loss(agent, minibatch, args, with_stats=last_epoch)
                loss.backward()
                if last_epoch:
                    stats += minibatch_stats
            average_gradient(flat, world_size)
            torch.nn.utils.clip_grad_norm_([flat], args.max_grad_norm)
            optimizer.step()
    return stats / args.num_minibatches


# ----------------------------------------------------------------------------------------------- roles
def learning_rate(args: Args, update: int) -> float:
    """Annealed linearly to zero over the run, or constant."""
    if args.anneal_lr:
        return args.learning_rate * (1.0 - update / args.num_updates)
    return args.learning_rate


def rollout_buffers(args: Args, agent: Agent, obs_shape: tuple, action_shape: tuple, device) -> dict:
    """One rollout of num_steps x local_num_envs on `device`: observations, actions, and the
    per-step numbers."""
    size = (args.num_steps, args.local_num_envs)
    obs_dtype = torch.uint8 if len(obs_shape) == 3 else torch.float32
    action_dtype = torch.float32 if agent.continuous else torch.long
    buffers = {
        "obs": torch.zeros(size + obs_shape, dtype=obs_dtype, device=device),
        "actions": torch.zeros(size + action_shape, dtype=action_dtype, device=device),
    }
    for key in ["logprobs", "values", "rewards", "terms", "dones", "valid"]:
        buffers[key] = torch.zeros(size, device=device)
    return buffers


def rollout_state(envs, num_envs: int, device) -> dict:
    """What carries over from one rollout to the next: the current observations, which envs are
    resetting, the running episodes' returns and lengths, the episodes finished since the last
    update, the reward scaler's discounted returns."""
    obs, _ = envs.reset()
    return {
        "obs": torch.as_tensor(obs, device=device),
        "valid": torch.ones(num_envs, device=device),
        "prev_done": np.zeros(num_envs, dtype=bool),
        "ep_return": np.zeros(num_envs),
        "ep_length": np.zeros(num_envs),
        "finished": [],
        "ret_acc": torch.zeros(num_envs, device=device),
    }


def track_episodes(state: dict, reward, terminated, truncated, info) -> None:
    """Episode statistics: returns and lengths of the episodes that ended at this step go to
    state["finished"]. The step after an episode end only resets the env (reward 0): it is not
    counted (and learning masks it out through `valid`). Atari: raw rewards and the real game over,
    not the clipped, per-life ones."""
    live = ~state["prev_done"]
    state["ep_return"] += info.get("reward", reward) * live
    state["ep_length"] += live
    if "terminated" in info:
        ended = info["terminated"].astype(bool) | truncated
    else:
        ended = terminated | truncated
    if ended.any():
        state["finished"].extend(
            zip(state["ep_return"][ended].tolist(), state["ep_length"][ended].tolist(), strict=True)
        )
        state["ep_return"][ended] = 0.0
        state["ep_length"][ended] = 0


def collect_rollout(agent, envs, state: dict, buffers: dict, args: Args, generator, store, update: int):
    """Step the envs for up to num_steps into `buffers` (on the learner's device); stop early once
    enough ranks have finished (DD-PPO preemption). Returns the number of steps collected."""
    device = buffers["obs"].device
    min_steps = max(1, math.ceil(args.min_rollout_frac * args.num_steps))
    quorum = math.ceil(args.sync_frac * args.world_size)
    key = f"ddppo/finished/{update}"
    # every rank is past the previous update's rollout (the all-reduces since have seen them all): drop its counter
    if store is not None and args.rank == 0 and update > 0:
        store.delete_key(f"ddppo/finished/{update - 1}")
    steps = args.num_steps
    for t in range(args.num_steps):
        if store is not None and t >= min_steps and int(store.add(key, 0)) >= quorum:
            steps = t
            break
        obs = state["obs"]
        buffers["obs"][t] = obs
        buffers["valid"][t] = state["valid"]
        with torch.no_grad():
            action, logprob, _, value = agent.get_action_and_value(obs, generator=generator)
        buffers["actions"][t] = action
        buffers["logprobs"][t] = logprob
        buffers["values"][t] = value
        env_action = action.cpu().numpy()
        if agent.continuous:
            env_action = np.clip(env_action, envs.action_space.low, envs.action_space.high)
        next_obs, reward, terminated, truncated, info = envs.step(env_action)
        state["obs"] = torch.as_tensor(next_obs, device=device)
        buffers["rewards"][t] = torch.as_tensor(reward, dtype=torch.float32, device=device)
        # terms: the episode really ended, so step t does not bootstrap; dones: it ended or was truncated, so the
        # GAE recursion stops there. They differ at a truncation, which bootstraps from the final observation.
        buffers["terms"][t] = torch.as_tensor(terminated, dtype=torch.float32, device=device)
        done = terminated | truncated
        buffers["dones"][t] = torch.as_tensor(done, dtype=torch.float32, device=device)
        track_episodes(state, reward, terminated, truncated, info)
        state["prev_done"] = done
        state["valid"] = torch.as_tensor(~done, dtype=torch.float32, device=device)
    if store is not None and steps == args.num_steps:
        store.add(key, 1)
    return steps


def update_normalizers(agent, buffers: dict, steps: int, state: dict, args: Args, world_size: int):
    """Statistics identical on every rank: the moments of this rollout's valid observations and
    discounted returns are summed over ranks (one all-reduce) and merged. Returns the rewards
    divided by the new return std, clipped, and the new observation statistics, to load after the
    PPO update (which must see the rollout's normalization)."""
    valid = buffers["valid"][:steps].reshape(-1)
    rewards = buffers["rewards"][:steps]
    statistics = {}
    data = {}
    if agent.obs_rms is not None:
        statistics["obs"] = agent.obs_rms
        data["obs"] = buffers["obs"][:steps]
    if agent.return_rms is not None:
        statistics["ret"] = agent.return_rms
        dones = buffers["dones"][:steps]
        data["ret"], state["ret_acc"] = discounted_returns(rewards, dones, state["ret_acc"], args.gamma)
    if not statistics:
        return rewards, None
    parts = [rms_moments(data[key], valid, rms.mean) for key, rms in statistics.items()]
    moments = torch.cat(parts)
    if world_size > 1:
        dist.all_reduce(moments)
    merged = {
        key: rms_merge(rms.mean, rms.var, rms.count, part)
        for (key, rms), part in zip(statistics.items(), moments.split([p.numel() for p in parts]), strict=True)
    }
    if "ret" in merged:
        agent.return_rms.load(*merged["ret"])
        rewards = (rewards / torch.sqrt(agent.return_rms.var + 1e-8)).clamp(-args.clip_reward, args.clip_reward)
    return rewards, merged.get("obs")


def learning_batch(agent, buffers: dict, rewards, steps: int, state: dict, args: Args) -> dict:
    """GAE over this rank's rollout (bootstrapped from the value of the current observations),
    flattened to one sample per valid step: the steps that only reset an env are left out."""
    with torch.no_grad():
        next_value = agent.get_value(state["obs"])
        values = buffers["values"][:steps]
        terms = buffers["terms"][:steps]
        dones = buffers["dones"][:steps]
        advantages, returns = compute_gae(rewards, values, next_value, terms, dones, args.gamma, args.gae_lambda)
    keep = buffers["valid"][:steps].reshape(-1).bool()
    obs_shape = buffers["obs"].shape[2:]
    action_shape = buffers["actions"].shape[2:]
    return {
        "obs": buffers["obs"][:steps].reshape((-1,) + obs_shape)[keep],
        "actions": buffers["actions"][:steps].reshape((-1,) + action_shape)[keep],
        "logprobs": buffers["logprobs"][:steps].reshape(-1)[keep],
        "values": values.reshape(-1)[keep],
        "advantages": advantages.reshape(-1)[keep],
        "returns": returns.reshape(-1)[keep],
    }


def evaluate(agent, env_id: str, episodes: int, seed: int, device, video_dir: Optional[str] = None):
    """Returns of `episodes` episodes of the greedy policy, one env per episode (no bias to short
    episodes). With video_dir, episode 0 is also written there as an MP4."""
    options = dict(episodic_life=False, reward_clip=False) if agent.image else {}
    render_mode = "rgb_array" if video_dir is not None else None
    envs = make_env(env_id, episodes, seed, render_mode=render_mode, **options)
    video = open_video(video_dir) if video_dir is not None else None
    obs, _ = envs.reset()
    returns = np.zeros(episodes)
    done = np.zeros(episodes, dtype=bool)
    while not done.all():
        if video is not None and not done[0]:
            video.append_data(envs.render()[0])
        with torch.no_grad():
            action, _, _, _ = agent.get_action_and_value(torch.as_tensor(obs, device=device), greedy=True)
        action = action.cpu().numpy()
        if agent.continuous:
            action = np.clip(action, envs.action_space.low, envs.action_space.high)
        obs, reward, terminated, truncated, info = envs.step(action)
        returns += info.get("reward", reward) * ~done
        done |= (info["terminated"].astype(bool) if "terminated" in info else terminated) | truncated
    if video is not None:
        video.close()
    envs.close()
    return returns


# ----------------------------------------------------------------------------------------------- main
def main(args: Args) -> int:
    # stop signals, flag checks, torchrun's process group, seeds and threads: all below the fold
    run = Run(args)
    device = run.device
    args.batch_size = args.world_size * args.local_num_envs * args.num_steps
    args.num_updates = max(1, args.total_timesteps // args.batch_size)
    spec = envpool.make_spec(args.env_id)
    # auto (None): normalize for Box actions only
    continuous = isinstance(spec.action_space, gym.spaces.Box)
    args.norm_obs = continuous if args.norm_obs is None else args.norm_obs
    args.norm_reward = continuous if args.norm_reward is None else args.norm_reward
    obs_shape = spec.observation_space.shape
    agent = Agent(obs_shape, spec.action_space, args.norm_obs, args.norm_reward, args.clip_obs).to(device)
    flat = flatten_parameters(agent)
    optimizer = make_optimizer(args, flat)
    # fresh progress, or a checkpoint's with --resume (weights and optimizer state loaded in place); rank 0's
    # weights go to every rank, so that all replicas start identical
    progress = run.restore(agent, optimizer)

    # Envs and the sampling generator start once, from a seed tied to (seed, rank, restart update); checkpoints
    # leave them alone (a checkpoint must not change training). A resumed run restarts its episodes there.
    seed = env_seed(args, args.rank, progress["update"])
    envs = make_env(args.env_id, args.local_num_envs, seed, run.env_threads)
    generator = torch.Generator(device=device).manual_seed(seed)
    buffers = rollout_buffers(args, agent, obs_shape, spec.action_space.shape, device)
    state = rollout_state(envs, args.local_num_envs, device)
    run.start_training()
    for update in range(progress["update"], args.num_updates):
        # COLLECT: up to num_steps steps of every env; cut short once sync_frac of the ranks have finished theirs
        # (run.store: the process group's key-value store, which counts the finished rollouts)
        steps = collect_rollout(agent, envs, state, buffers, args, generator, run.store, update)
        run.lap("rollout")
        # LEARN: normalizer statistics over all ranks, GAE, PPO epochs with one gradient all-reduce per minibatch
        with torch.no_grad():
            rewards, obs_stats = update_normalizers(agent, buffers, steps, state, args, args.world_size)
        batch = learning_batch(agent, buffers, rewards, steps, state, args)
        optimizer.param_groups[0]["lr"] = learning_rate(args, update)
        losses = ppo_update(agent, optimizer, batch, args, generator, args.world_size)
        if obs_stats is not None:
            agent.obs_rms.load(*obs_stats)
        run.lap("learn")
        # PUBLISH: nothing to send: every replica applied the same averaged gradient
        # BOOKKEEPING: counters over ranks (one all-reduce, the stop request in it), episodes, logs, checkpoints;
        # a stop signal on some rank ends the loop after a checkpoint
        if run.end_update(steps, state, losses):
            break
    envs.close()
    # the final evaluation and summary.json (unless a signal stopped the run), then the writer and process group
    run.finish()
    return 0


# ==== infrastructure: flags, checks, checkpoints, signals, torchrun, logging; nothing below is DD-PPO ====
@dataclass
class Infra:
    """The flags that keep a run alive, watched, reproducible and resumable, not what it learns."""

    exp_name: str = "ddppo"  # the name of this experiment (part of the run name)
    preset: Optional[Literal[tuple(PRESETS)]] = None  # start from a preset's values (PRESETS, above the fold)
    torch_deterministic: bool = True  # deterministic CUDA kernels (the CPU kernels used here are anyway)
    cuda: bool = True  # use CUDA when it is available
    track: bool = False  # log to Weights & Biases as well as TensorBoard
    wandb_project_name: str = "distrl"  # the wandb project name
    wandb_entity: Optional[str] = None  # the wandb entity (team)
    capture_video: bool = False  # write the first evaluation episode as runs/<run_name>/videos/eval_episode0.mp4
    save_model: bool = False  # write the final weights (state_dict) to runs/<run_name>/model.pt
    eval_episodes: int = 10  # episodes of the final, greedy policy to evaluate at the end
    torch_threads: int = 0  # torch threads per rank (0: 1, safe beside other processes; docs/ddppo.md: when more pay)
    env_threads: int = 0  # envpool worker threads per rank (0: 1)
    checkpoint_every: int = 0  # write runs/<run_name>/checkpoint.pt every this many updates (0: on signals only)
    resume: bool = False  # continue from runs/<run_name>/checkpoint.pt when it exists
    collective_timeout: float = 600.0  # seconds a rank waits for another before it fails (torch's default: 1800)


# every flag of the command line, the algorithm's first (in --help too)
@dataclass
class RunArgs(Infra, Args):
    pass


# a checkpoint of another format version ends the run with exit 2 (read_checkpoint)
CHECKPOINT_VERSION = 1


class Run:
    """The infrastructure of one run, as main() uses it: set-up, restore, clocks, the bookkeeping of each
    update (counters over ranks, episodes, TensorBoard, progress lines, checkpoints, stop signals) and the
    end (the final evaluation, summary.json, closing the writer and the process group)."""

    def __init__(self, args: RunArgs):
        # first of all: a signal during start-up ends in a checkpoint, not in exit 143
        self.stop = install_stop_handlers()
        # envpool's spaces warn about it
        warnings.filterwarnings("ignore", message=".*precision lowered by casting.*")
        validate(args)
        self.device, self.store = setup_distributed(args)
        args.run_name = f"{args.env_id}__{args.exp_name}__{args.seed}"
        self.run_dir = os.path.join("runs", args.run_name)
        self.checkpoint_path = os.path.join(self.run_dir, "checkpoint.pt")
        seed_everything(args, self.device)
        keep_freed_memory()
        self.args = args
        self.env_threads = args.env_threads or 1
        self.threshold = envpool.make_spec(args.env_id).reward_threshold
        self.stopped = False

    def restore(self, agent, optimizer) -> dict:
        """Fresh progress, or the checkpoint's with --resume (the weights and optimizer state loaded in place);
        opens rank 0's writer. The run keeps agent and optimizer for its checkpoints and summary."""
        self.agent = agent
        self.optimizer = optimizer
        self.progress = restore(self.args, agent, optimizer, self.device, self.checkpoint_path)
        self.writer = open_writer(self.args, self.run_dir, self.progress) if self.args.rank == 0 else None
        return self.progress

    def start_training(self) -> None:
        """Training time counts from here (start-up is reported on its own)."""
        self.clock = start_clock(self.progress)
        self.lap_start = self.clock
        self.lap_times = {}
        self.last_print = 0.0

    def lap(self, name: str) -> None:
        """The time since the previous lap (or the start of the update) as this update's `name` time."""
        now = time.time()
        self.lap_times[name] = now - self.lap_start
        self.lap_start = now

    def end_update(self, steps: int, state: dict, losses: torch.Tensor) -> bool:
        """One update's bookkeeping: counters summed over ranks (the one small all-reduce), the clocks, the
        episodes finished since the last update (taken out of `state`), rank 0's log and progress line, a
        checkpoint when due or asked for. Returns True when a stop signal reached some rank (checkpoint
        written: the loop ends)."""
        args = self.args
        progress = self.progress
        totals = update_totals(args, steps, self.stop, self.lap_times["rollout"], self.lap_times["learn"], self.device)
        finished = state["finished"]
        state["finished"] = []
        progress["update"] += 1
        progress["global_step"] += int(totals["steps"])
        self.clock = advance_clock(progress, self.clock)
        record_returns(progress, [episode_return for episode_return, _ in finished], self.threshold)
        if args.rank == 0:
            scalars = update_scalars(progress, self.optimizer, losses, totals, args.world_size)
            log_update(self.writer, progress, finished, scalars)
            self.last_print = print_progress(progress, args.num_updates, self.last_print)
        # SIGTERM/SIGUSR1 on some rank (SLURM preemption): save, then exit cleanly
        self.stopped = totals["stop"] > 0
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

    def finish(self) -> None:
        """The final evaluation and summary (also after resuming a checkpoint of the last update; not after a
        stop signal), then the writer, wandb and the process group."""
        if self.args.rank == 0 and not self.stopped:
            write_summary(self.args, self.agent, self.writer, self.progress, self.clock, self.device, self.run_dir)
        if self.writer is not None:
            self.writer.close()
            if self.args.track:
                import wandb

                wandb.finish()
        finish_distributed(self.args)


# ----------------------------------------------------------------------------------------------- checks
def fail(arg: str, message: str) -> None:
    """Bad argument: one line naming it on stderr, exit code 2 (as argparse does)."""
    print(f"{os.path.basename(sys.argv[0])}: error: --{arg.replace('_', '-')}: {message}", file=sys.stderr)
    sys.exit(2)


def validate(args: RunArgs) -> None:
    # env seeds add offsets to the seed and must stay 32-bit
    if not 0 <= args.seed < 2**30:
        fail("seed", f"must be in [0, 2**30), got {args.seed}")
    positive = ["total_timesteps", "local_num_envs", "num_steps", "num_minibatches", "update_epochs", "eval_episodes"]
    # max_grad_norm 0 would clip every gradient to zero: refused, not taken as "off"
    for name in positive + ["learning_rate", "clip_obs", "clip_reward", "collective_timeout", "max_grad_norm"]:
        if getattr(args, name) <= 0:
            fail(name, f"must be positive, got {getattr(args, name)}")
    for name in ["torch_threads", "env_threads", "checkpoint_every", "ent_coef", "vf_coef"]:
        if getattr(args, name) < 0:
            fail(name, f"must not be negative, got {getattr(args, name)}")
    for name in ["sync_frac", "min_rollout_frac", "gamma", "gae_lambda"]:
        if not 0.0 < getattr(args, name) <= 1.0:
            fail(name, f"must be in (0, 1], got {getattr(args, name)}")
    rollout_size = args.local_num_envs * args.num_steps
    if rollout_size % args.num_minibatches:
        fail("num_minibatches", f"{args.num_minibatches} does not divide local-num-envs * num-steps = {rollout_size}")
    if args.env_id not in envpool.list_all_envs():
        fail("env_id", f"'{args.env_id}' is not an envpool environment")
    env_family = envpool.registration.registry.specs[args.env_id][0]
    if args.capture_video and env_family not in ("envpool.atari", "envpool.classic_control"):
        # envpool renders MuJoCo through a GPU context: without one, its render() ends the process
        fail("capture_video", f"'{args.env_id}' is not Atari or classic control, the envs recorded here")
    spec = envpool.make_spec(args.env_id)
    obs_space = spec.observation_space
    action_space = spec.action_space
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) not in (1, 3):
        fail("env_id", f"'{args.env_id}' has observation space {obs_space}; DD-PPO here needs a flat or image Box")
    if not isinstance(action_space, (gym.spaces.Discrete, gym.spaces.Box)) or len(action_space.shape) > 1:
        fail("env_id", f"'{args.env_id}' has action space {action_space}; DD-PPO here needs Discrete or 1-D Box")
    if args.norm_obs and len(obs_space.shape) == 3:
        fail("norm_obs", "observation normalization is for vector observations, not images")


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
        "config": config,
    }


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


def update_scalars(progress: dict, optimizer, losses: torch.Tensor, totals: dict, world_size: int) -> dict:
    """TensorBoard scalars of one update: learning rate, SPS, the losses (rank 0's), per-rank means
    of the totals."""
    policy_loss, value_loss, entropy, approx_kl, clipfrac = losses.tolist()
    return {
        "charts/learning_rate": optimizer.param_groups[0]["lr"],
        "charts/SPS": progress["global_step"] / progress["train_time_s"],
        "losses/policy_loss": policy_loss,
        "losses/value_loss": value_loss,
        "losses/entropy": entropy,
        "losses/approx_kl": approx_kl,
        "losses/clipfrac": clipfrac,
        "stats/preempted_ranks_frac": totals["preempted"] / world_size,
        "stats/rollout_frac": totals["rollout_frac"] / world_size,
        "stats/rollout_time_s": totals["rollout_time"] / world_size,
        "stats/learn_time_s": totals["learn_time"] / world_size,
    }


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
    payload = {**payload, "algo": "ddppo", "version": CHECKPOINT_VERSION}
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
    if written_by not in (None, "ddppo"):
        fail("resume", f"{checkpoint_path} was written by {written_by}.py, not ddppo.py; use another --exp-name")
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
            f"{checkpoint_path} lacks {', '.join(missing)}: not a checkpoint of ddppo.py; use another --exp-name",
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
    (`Args`) but the budget, which may grow; none of `Infra`'s (how the run is kept alive, watched or
    saved). Values derived from the flags (init=False) follow from them."""
    may_change = {"total_timesteps"}
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
    and the optimizer loaded in place. Rank 0 reads the checkpoint and sends it to the other ranks,
    so nodes need no shared disk; without one it sends its initial weights, since nodes with other
    math libraries could initialize other bits."""
    progress = new_progress(run_config(args))
    checkpoint = None
    if args.resume and args.rank == 0 and os.path.exists(checkpoint_path):
        checkpoint = read_checkpoint(checkpoint_path, progress)
    if args.world_size > 1:
        received = [checkpoint]
        dist.broadcast_object_list(received, 0, device=device if device.type == "cuda" else None)
        checkpoint = received[0]
        if checkpoint is None:
            flat = optimizer.param_groups[0]["params"][0]
            dist.broadcast(flat, 0)
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


def write_summary(args: RunArgs, agent: Agent, writer, progress: dict, clock: float, device, run_dir: str) -> None:
    """The final evaluation, runs/<run_name>/summary.json (whole-run figures) and, with
    --save-model, the weights."""
    video_dir = os.path.join(run_dir, "videos") if args.capture_video else None
    eval_returns = evaluate(agent, args.env_id, args.eval_episodes, args.seed + 10**6, device, video_dir)
    for episode, episode_return in enumerate(eval_returns):
        writer.add_scalar("eval/episodic_return", episode_return, episode)
    # the evaluation counts in wall time only
    advance_clock(progress, clock, training=False)
    recent = progress["recent_returns"]
    summary = {
        "algo": "ddppo",
        "env_id": args.env_id,
        "seed": args.seed,
        "world_size": args.world_size,
        "global_step": progress["global_step"],
        "wall_time_s": progress["wall_time_s"],
        "startup_s": progress["startup_s"],
        "train_time_s": progress["train_time_s"],
        "sps": progress["global_step"] / progress["train_time_s"],
        "eval_return_mean": float(np.mean(eval_returns)),
        "eval_return_std": float(np.std(eval_returns)),
        "train_return_last20": float(np.mean(recent)) if recent else None,
        "time_to_threshold_s": progress["time_to_threshold_s"],
        "threshold_step": progress["threshold_step"],
        "reward_threshold": envpool.make_spec(args.env_id).reward_threshold,
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
def global_sum(values: list, device, world_size: int) -> torch.Tensor:
    """Per-rank numbers summed over all ranks: one all-reduce of a float64 tensor on `device` (NCCL:
    the GPU)."""
    total = torch.tensor(values, dtype=torch.float64, device=device)
    if world_size > 1:
        dist.all_reduce(total)
    return total


def update_totals(args: RunArgs, steps: int, stop: dict, rollout_time: float, learn_time: float, device) -> dict:
    """One update's counters summed over ranks (one small all-reduce): env steps, preempted ranks,
    the fraction of the rollout collected, ranks that received a stop signal, and the rollout and
    learning times."""
    values = [
        steps * args.local_num_envs,
        float(steps < args.num_steps),
        steps / args.num_steps,
        float(stop["signal"] != 0),
        rollout_time,
        learn_time,
    ]
    totals = global_sum(values, device, args.world_size).tolist()
    return dict(zip(["steps", "preempted", "rollout_frac", "stop", "rollout_time", "learn_time"], totals, strict=True))


def setup_distributed(args: RunArgs):
    """torchrun sets RANK/LOCAL_RANK/WORLD_SIZE: join the group (gloo on CPU, NCCL on GPU). Alone:
    world size 1. Returns the device and, with preemption on several ranks, the group's TCPStore (it
    counts finished rollouts)."""
    args.world_size = int(os.environ.get("WORLD_SIZE", "1"))
    args.rank = int(os.environ.get("RANK", "0"))
    args.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = args.cuda and torch.cuda.is_available()
    device = torch.device(f"cuda:{args.local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    store = None
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
        if args.preempt:
            store = dist.distributed_c10d._get_default_store()
    return device, store


def seed_everything(args: RunArgs, device) -> None:
    """Threads and seeds (the same on every rank: identical initial weights); deterministic kernels
    on CUDA (the CPU ones used here are deterministic already)."""
    torch.set_num_threads(args.torch_threads or 1)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    if device.type == "cuda":
        if args.torch_deterministic:
            # cuBLAS refuses deterministic mode without it (CUDA >= 10.2)
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


def finish_distributed(args: RunArgs) -> None:
    """Leave the process group together, at a barrier."""
    if args.world_size > 1:
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

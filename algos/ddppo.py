# docs: docs/ddppo.md | paper: https://arxiv.org/abs/1911.00357
"""DD-PPO: Decentralized Distributed PPO (Wijmans et al., 2020).

Every rank steps its own envpool batch, keeps its own copy of the policy and optimizer, and trains PPO on
its own rollout; gradients are averaged with one all-reduce per minibatch, so all replicas stay identical
and there is no parameter server. Ranks that fall behind are preempted once a fraction `sync_frac` of the
ranks has finished its rollout, so stragglers do not hold the others up.

  python algos/ddppo.py                                             # world size 1, CartPole-v1
  torchrun --standalone --nproc_per_node=2 algos/ddppo.py           # 2 ranks on one machine
"""
import json
import math
import os
import random
import signal
import sys
import time
import types
import warnings
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Optional


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
import torch.nn as nn  # noqa: E402
import tyro  # noqa: E402


@dataclass
class Args:
    # --- common to every distrl file ---
    exp_name: str = "ddppo"  # the name of this experiment (part of the run name)
    seed: int = 1  # seed of the experiment
    torch_deterministic: bool = True  # deterministic CUDA kernels (the CPU kernels used here are anyway)
    cuda: bool = True  # use CUDA when it is available
    track: bool = False  # log to Weights & Biases as well as TensorBoard
    wandb_project_name: str = "distrl"  # the wandb project name
    wandb_entity: Optional[str] = None  # the wandb entity (team)
    capture_video: bool = False  # save the first evaluation episode's frames (Atari) to runs/<run_name>/videos/
    save_model: bool = False  # write the final weights (state_dict) to runs/<run_name>/model.pt
    env_id: str = "CartPole-v1"  # the envpool environment id
    total_timesteps: int = 100_000  # total environment steps over all ranks
    eval_episodes: int = 10  # episodes of the final, greedy policy to evaluate at the end
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
    torch_threads: int = 0  # torch threads per rank (0: this process's CPUs divided among the node's ranks)
    env_threads: int = 0  # envpool worker threads per rank (0: 1)
    # --- distributed ---
    preempt: bool = True  # preempt stragglers once sync_frac of the ranks finished their rollout
    sync_frac: float = 0.6  # fraction of ranks that must finish before the rest are preempted (paper: 0.6)
    min_rollout_frac: float = 0.25  # a preempted rank keeps at least this fraction of num_steps (paper: 0.25)
    checkpoint_every: int = 0  # write runs/<run_name>/checkpoint.pt every this many updates (0: on signals only)
    resume: bool = False  # continue from runs/<run_name>/checkpoint.pt when it exists
    # --- computed at run time ---
    world_size: int = field(default=1, init=False)
    rank: int = field(default=0, init=False)
    local_rank: int = field(default=0, init=False)
    batch_size: int = field(default=0, init=False)
    num_updates: int = field(default=0, init=False)
    run_name: str = field(default="", init=False)


def fail(arg: str, message: str) -> None:
    """Bad argument: one line naming it on stderr, exit code 2 (as argparse does)."""
    print(f"{os.path.basename(sys.argv[0])}: error: --{arg.replace('_', '-')}: {message}", file=sys.stderr)
    sys.exit(2)


def validate(args: Args) -> None:
    if not 0 <= args.seed < 2**30:  # env seeds add offsets to it and must stay 32-bit
        fail("seed", f"must be in [0, 2**30), got {args.seed}")
    positive = ["total_timesteps", "local_num_envs", "num_steps", "num_minibatches", "update_epochs", "eval_episodes"]
    for name in positive + ["learning_rate", "clip_obs", "clip_reward"]:
        if getattr(args, name) <= 0:
            fail(name, f"must be positive, got {getattr(args, name)}")
    for name in ["torch_threads", "env_threads", "checkpoint_every", "ent_coef", "vf_coef", "max_grad_norm"]:
        if getattr(args, name) < 0:
            fail(name, f"must not be negative, got {getattr(args, name)}")
    for name in ["sync_frac", "min_rollout_frac", "gamma", "gae_lambda"]:
        if not 0.0 < getattr(args, name) <= 1.0:
            fail(name, f"must be in (0, 1], got {getattr(args, name)}")
    if (args.local_num_envs * args.num_steps) % args.num_minibatches:
        fail("num_minibatches", f"{args.num_minibatches} does not divide local-num-envs * num-steps "
             f"= {args.local_num_envs * args.num_steps}")
    if args.env_id not in envpool.list_all_envs():
        fail("env_id", f"'{args.env_id}' is not an envpool environment")
    spec = envpool.make_spec(args.env_id)
    obs_space, act_space = spec.observation_space, spec.action_space
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) not in (1, 3):
        fail("env_id", f"'{args.env_id}' has observation space {obs_space}; DD-PPO here needs a flat or image Box")
    if not isinstance(act_space, (gym.spaces.Discrete, gym.spaces.Box)) or len(act_space.shape) > 1:
        fail("env_id", f"'{args.env_id}' has action space {act_space}; DD-PPO here needs Discrete or 1-D Box")
    if args.norm_obs and len(obs_space.shape) == 3:
        fail("norm_obs", "observation normalization is for vector observations, not images")
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


def env_seed(args: Args, rank: int, update: int) -> int:
    """Seed of env 0 on `rank` from `update` on: distinct for every env of every rank and every restart point."""
    return args.seed + (update * args.world_size + rank) * args.local_num_envs


# ----------------------------------------------------------------------------------------------- networks
def layer_init(layer: nn.Module, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Module:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(n_in: int, n_out: int, out_std: float) -> nn.Module:
    return nn.Sequential(layer_init(nn.Linear(n_in, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh(),
                         layer_init(nn.Linear(64, n_out), out_std))


class RunningMeanStd(nn.Module):
    """Mean, population variance and count (float64) of all data merged so far: buffers, so state_dict has them."""

    def __init__(self, shape=()):
        super().__init__()
        for name, value in (("mean", torch.zeros(shape)), ("var", torch.ones(shape)), ("count", torch.zeros(()))):
            self.register_buffer(name, value.double())

    def load(self, mean, var, count) -> None:
        for buffer, value in zip((self.mean, self.var, self.count), (mean, var, count)):
            buffer.copy_(value)


class Agent(nn.Module):
    """Actor-critic: two 64-64 tanh MLPs for vector observations, a shared Nature-CNN for images;
    a categorical head for Discrete actions, a diagonal Gaussian with state-independent log-std for Box.
    With norm_obs, observations are normalized by `obs_rms` (frozen here; main merges each rollout into it);
    `return_rms` holds the reward scaler's statistics. Neither exists when off."""

    def __init__(self, obs_shape, action_space, norm_obs: bool = False, norm_reward: bool = False,
                 clip_obs: float = 10.0):
        super().__init__()
        self.continuous = isinstance(action_space, gym.spaces.Box)
        n_out = int(np.prod(action_space.shape)) if self.continuous else int(action_space.n)
        if len(obs_shape) == 3:
            self.trunk = nn.Sequential(
                layer_init(nn.Conv2d(obs_shape[0], 32, 8, stride=4)), nn.ReLU(),
                layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
                layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(), nn.Flatten(),
                layer_init(nn.Linear(64 * 7 * 7, 512)), nn.ReLU())
            self.actor, self.critic = layer_init(nn.Linear(512, n_out), 0.01), layer_init(nn.Linear(512, 1), 1.0)
        else:
            d = int(np.prod(obs_shape))
            self.trunk, self.actor, self.critic = nn.Identity(), mlp(d, n_out, 0.01), mlp(d, 1, 1.0)
        self.image = len(obs_shape) == 3
        if self.continuous:
            self.actor_logstd = nn.Parameter(torch.zeros(n_out))
        self.obs_rms = RunningMeanStd(obs_shape) if norm_obs else None
        self.return_rms = RunningMeanStd() if norm_reward else None
        self.clip_obs = clip_obs

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        if self.image:
            return self.trunk(obs.float() / 255.0)
        if self.obs_rms is None:
            return obs.float()
        x = (obs.float() - self.obs_rms.mean) / torch.sqrt(self.obs_rms.var + 1e-8)
        return x.clamp(-self.clip_obs, self.clip_obs).float()

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self.features(obs)).squeeze(-1)

    def get_action_and_value(self, obs, action=None, generator=None, greedy: bool = False):
        """Log-prob and entropy of `action` under the current policy (or of an action sampled here, the mode when
        greedy), and the value. Returns action, log-prob, entropy, value."""
        h = self.features(obs)
        out = self.actor(h)
        if self.continuous:
            std = self.actor_logstd.exp()
            if action is None:
                action = out if greedy else out + std * torch.randn(out.shape, generator=generator, device=out.device)
            logprob = (-0.5 * ((action - out) / std) ** 2 - std.log() - 0.5 * math.log(2 * math.pi)).sum(-1)
            entropy = (0.5 + 0.5 * math.log(2 * math.pi) + self.actor_logstd).sum().expand(out.shape[0])
        else:
            logp_all = torch.log_softmax(out, dim=-1)
            if action is None:
                action = out.argmax(-1) if greedy else torch.multinomial(logp_all.exp(), 1, generator=generator).squeeze(-1)
            logprob = logp_all.gather(-1, action.unsqueeze(-1)).squeeze(-1)
            entropy = -(logp_all.exp() * logp_all).sum(-1)
        return action, logprob, entropy, self.critic(h).squeeze(-1)


# ----------------------------------------------------------------------------------------------- algorithm
def compute_gae(rewards, values, next_value, terminations, dones, gamma: float, gae_lambda: float):
    """Generalized advantage estimation (Schulman et al. 2016) over a [T, N] rollout.

    values[t + 1] (next_value after the last step) bootstraps step t unless the episode *terminated* there;
    the recursion is cut wherever an episode ended (terminated or truncated). With envpool's next-step
    autoreset, the observation after a truncation is the final one, so a truncated step bootstraps from it.
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
    """The reward scaler's return along each env, R_t = gamma R_{t-1} + r_t, reset to 0 after an episode ends;
    acc carries R over from the previous rollout. Returns R [T, N] and the accumulator after the last step."""
    out = torch.zeros_like(rewards)
    for t in range(rewards.shape[0]):
        acc = acc * gamma + rewards[t]
        out[t] = acc
        acc = acc * (1.0 - dones[t])
    return out, acc


def rms_moments(x, weight, shift):
    """[sum w, sum w (x - shift), sum w (x - shift)^2] (per feature, flat, float64) of the rows of x [B, ...] with
    weights w [B]. Moments of disjoint batches add up, so one all-reduce gives those of the union over ranks."""
    x = x.reshape(weight.shape[0], -1).double() - shift.reshape(1, -1)
    w = weight.double().unsqueeze(-1)
    return torch.cat([w.sum().reshape(1), (w * x).sum(0), (w * x * x).sum(0)])


def rms_merge(mean, var, count, moments):
    """(mean, var, count) after merging a batch given by its moments around `mean`: Chan et al.'s parallel
    variance update, written with f = n / (count + n) so that count 0 or an empty batch need no special case."""
    d, n = mean.numel(), moments[0]
    delta = moments[1:1 + d].view_as(mean) / n.clamp(min=1e-12)  # batch mean - running mean
    batch_var = (moments[1 + d:].view_as(mean) / n.clamp(min=1e-12) - delta ** 2).clamp(min=0.0)
    f = n / (count + n).clamp(min=1e-12)
    return mean + f * delta, var + f * (batch_var - var) + f * (1 - f) * delta ** 2, count + n


def normalized_advantages(adv: torch.Tensor, world_size: int) -> torch.Tensor:
    """Advantages minus their mean, over their std, both over every rank's batch (one all-reduce of three numbers),
    so all ranks use the same statistics however preemption split the data."""
    x = adv.double()
    moments = torch.stack([x.new_tensor(float(x.numel())), x.sum(), (x * x).sum()])
    if world_size > 1:
        dist.all_reduce(moments)
    n, total, squares = moments
    mean = total / n.clamp(min=1)
    std = torch.sqrt((squares - n * mean ** 2).clamp(min=0) / (n - 1).clamp(min=1))  # unbiased, as torch.std
    return ((adv - mean) / (std + 1e-8)).float()


def ppo_loss(agent: Agent, mb: dict, args: Args, with_stats: bool = True):
    """PPO's clipped surrogate, (clipped) value loss and entropy bonus for one minibatch; with_stats: also the
    diagnostics (losses, approximate KL, clip fraction)."""
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(mb["obs"], mb["actions"])
    logratio = newlogprob - mb["logprobs"]
    ratio = logratio.exp()
    adv = mb["advantages"]
    pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)).mean()
    if args.clip_vloss:
        v_clipped = mb["values"] + (newvalue - mb["values"]).clamp(-args.clip_coef, args.clip_coef)
        v_loss = 0.5 * torch.max((newvalue - mb["returns"]) ** 2, (v_clipped - mb["returns"]) ** 2).mean()
    else:
        v_loss = 0.5 * ((newvalue - mb["returns"]) ** 2).mean()
    ent = entropy.mean()
    loss = pg_loss - args.ent_coef * ent + args.vf_coef * v_loss
    if not with_stats:
        return loss, None
    with torch.no_grad():
        stats = torch.stack([pg_loss, v_loss, ent, ((ratio - 1) - logratio).mean(),
                             ((ratio - 1.0).abs() > args.clip_coef).float().mean()])
    return loss, stats


def flatten_parameters(agent: nn.Module):
    """Make every parameter a view of one flat vector and every gradient a view of a second one (backward adds
    into them in place), so the all-reduce, the clip and Adam each act on one tensor, with no per-parameter
    concatenation or loop. Call it after moving the agent to its device. Returns (parameters, gradients)."""
    params = list(agent.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    grad = torch.zeros_like(flat)
    offset = 0
    for p in params:
        p.data, p.grad = flat[offset:offset + p.numel()].view_as(p), grad[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    return flat, grad


def adam_init(flat: torch.Tensor) -> dict:
    return {"step": 0, "m": torch.zeros_like(flat), "v": torch.zeros_like(flat)}


def adam_step(flat: torch.Tensor, grad: torch.Tensor, state: dict, lr: float, betas=(0.9, 0.999), eps: float = 1e-5) -> None:
    """Adam (Kingma & Ba, 2015) on the flat vector of all gradients; equals torch.optim.Adam(params, lr, betas,
    eps=1e-5).step(). Written out because constructing any torch.optim optimizer imports torch._dynamo, over a
    second of start-up."""
    b1, b2 = betas
    state["step"] += 1
    state["m"].lerp_(grad, 1 - b1)  # m <- b1 m + (1 - b1) g
    state["v"].mul_(b2).addcmul_(grad, grad, value=1 - b2)  # v <- b2 v + (1 - b2) g^2
    # lr * m_hat / (sqrt(v_hat) + eps), in torch.optim.Adam's order of operations (bitwise equal to it)
    denom = (state["v"].sqrt() / math.sqrt(1 - b2 ** state["step"])).add_(eps)
    flat.sub_((lr / (1 - b1 ** state["step"])) * state["m"] / denom)


def averaged_clipped_gradient(grad: torch.Tensor, world_size: int, max_grad_norm: float) -> torch.Tensor:
    """The flat gradient, averaged over ranks with one all-reduce (the only collective of the inner loop), then
    clipped to a global norm, in place. Every rank gets the same vector, so replicas stay equal."""
    if world_size > 1:
        dist.all_reduce(grad)
        grad /= world_size
    grad *= torch.clamp(max_grad_norm / (grad.norm() + 1e-6), max=1.0)
    return grad


def ppo_update(agent, params: tuple, adam: dict, batch: dict, args: Args, lr: float, generator, world_size: int):
    """update_epochs x num_minibatches gradient steps on params = flatten_parameters(agent). Minibatch sizes
    follow this rank's (possibly preempted) batch, but their number is fixed, so every rank enters the
    all-reduce equally often (an empty minibatch contributes a zero gradient)."""
    flat, grad = params
    n = batch["advantages"].shape[0]
    if args.norm_adv:
        batch = dict(batch, advantages=normalized_advantages(batch["advantages"], world_size))
    stats = torch.zeros(5, device=flat.device)  # diagnostics of the last epoch
    for epoch in range(args.update_epochs):
        last = epoch == args.update_epochs - 1
        for idx in torch.randperm(n, generator=generator, device=flat.device).tensor_split(args.num_minibatches):
            grad.zero_()
            if len(idx):
                loss, s = ppo_loss(agent, {k: v[idx] for k, v in batch.items()}, args, with_stats=last)
                loss.backward()
                if last:
                    stats += s
            with torch.no_grad():
                adam_step(flat, averaged_clipped_gradient(grad, world_size, args.max_grad_norm), adam, lr)
    return stats / args.num_minibatches


# ----------------------------------------------------------------------------------------------- roles
def track_episodes(state: dict, r, term, trunc, info) -> None:
    """Episode statistics: returns and lengths of the episodes that ended at this step go to state["finished"].
    The step after an episode end only resets the env (reward 0): it is not counted (and learning masks it out
    through `valid`). Atari: raw rewards and the real game over, not the clipped, per-life ones."""
    live = ~state["prev_done"]
    state["ep_return"] += info.get("reward", r) * live
    state["ep_length"] += live
    ended = (info["terminated"].astype(bool) | trunc) if "terminated" in info else (term | trunc)
    if ended.any():
        state["finished"].extend(zip(state["ep_return"][ended].tolist(), state["ep_length"][ended].tolist()))
        state["ep_return"][ended] = 0.0
        state["ep_length"][ended] = 0


def collect_rollout(agent, envs, state: dict, buf: dict, args: Args, generator, store, update: int, device):
    """Step the envs for up to num_steps; stop early once enough ranks have finished (DD-PPO preemption).
    Returns the number of steps collected."""
    min_steps = max(1, math.ceil(args.min_rollout_frac * args.num_steps))
    quorum = math.ceil(args.sync_frac * args.world_size)
    key = f"ddppo/finished/{update}"
    steps = args.num_steps
    for t in range(args.num_steps):
        if store is not None and t >= min_steps and int(store.add(key, 0)) >= quorum:
            steps = t
            break
        obs = state["obs"]
        buf["obs"][t] = obs
        buf["valid"][t] = state["valid"]
        with torch.no_grad():
            action, logprob, _, value = agent.get_action_and_value(obs, generator=generator)
        buf["actions"][t], buf["logprobs"][t], buf["values"][t] = action, logprob, value
        env_action = action.cpu().numpy()
        if agent.continuous:
            env_action = np.clip(env_action, envs.action_space.low, envs.action_space.high)
        o, r, term, trunc, info = envs.step(env_action)
        state["obs"] = torch.as_tensor(o, device=device)
        buf["rewards"][t] = torch.as_tensor(r, dtype=torch.float32, device=device)
        # terms: the episode really ended, so step t does not bootstrap; dones: it ended or was truncated, so the
        # GAE recursion stops there. They differ at a truncation, which bootstraps from the final observation.
        buf["terms"][t] = torch.as_tensor(term, dtype=torch.float32, device=device)
        done = term | trunc
        buf["dones"][t] = torch.as_tensor(done, dtype=torch.float32, device=device)
        track_episodes(state, r, term, trunc, info)
        state["prev_done"] = done
        state["valid"] = torch.as_tensor(~done, dtype=torch.float32, device=device)
    if store is not None and steps == args.num_steps:
        store.add(key, 1)
    return steps


def update_normalizers(agent, buf: dict, steps: int, state: dict, args: Args, world_size: int):
    """Statistics identical on every rank: the moments of this rollout's valid observations and discounted returns
    are summed over ranks (one all-reduce) and merged. Returns the rewards divided by the new return std, clipped, and
    the new observation statistics, to load after the PPO update (which must see the rollout's normalization)."""
    valid, rewards, rms, data = buf["valid"][:steps].reshape(-1), buf["rewards"][:steps], {}, {}
    if agent.obs_rms is not None:
        rms["obs"], data["obs"] = agent.obs_rms, buf["obs"][:steps]
    if agent.return_rms is not None:
        rms["ret"] = agent.return_rms
        data["ret"], state["ret_acc"] = discounted_returns(rewards, buf["dones"][:steps], state["ret_acc"], args.gamma)
    if not rms:
        return rewards, None
    parts = [rms_moments(data[k], valid, m.mean) for k, m in rms.items()]
    moments = torch.cat(parts)
    if world_size > 1:
        dist.all_reduce(moments)
    new = {k: rms_merge(m.mean, m.var, m.count, part)
           for (k, m), part in zip(rms.items(), moments.split([p.numel() for p in parts]))}
    if "ret" in new:
        agent.return_rms.load(*new["ret"])
        rewards = (rewards / torch.sqrt(agent.return_rms.var + 1e-8)).clamp(-args.clip_reward, args.clip_reward)
    return rewards, new.get("obs")


def evaluate(agent, env_id: str, episodes: int, seed: int, device, video_dir: Optional[str] = None):
    """Returns of `episodes` episodes of the greedy policy, one env per episode (no bias to short episodes)."""
    envs = make_env(env_id, episodes, seed, episodic_life=False, reward_clip=False) if agent.image \
        else make_env(env_id, episodes, seed)
    obs, _ = envs.reset()
    returns, done = np.zeros(episodes), np.zeros(episodes, dtype=bool)
    frames = []
    while not done.all():
        with torch.no_grad():
            action = agent.get_action_and_value(torch.as_tensor(obs, device=device), greedy=True)[0].cpu().numpy()
        if agent.continuous:
            action = np.clip(action, envs.action_space.low, envs.action_space.high)
        obs, r, term, trunc, info = envs.step(action)
        returns += info.get("reward", r) * ~done
        if video_dir is not None and not done[0]:
            frames.append(obs[0, -1])
        done |= (info["terminated"].astype(bool) if "terminated" in info else term) | trunc
    if frames:
        os.makedirs(video_dir, exist_ok=True)
        np.savez_compressed(os.path.join(video_dir, "eval_episode0.npz"), frames=np.stack(frames))
    envs.close()
    return returns


def save_checkpoint(path: str, payload: dict) -> None:
    """Atomic: write a temporary file beside the target, then rename over it."""
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save(payload, tmp)
    os.replace(tmp, path)


def available_cpus() -> int:
    """CPUs this process may use (its affinity mask, which taskset, SLURM and containers set; not the machine's
    core count), shared among the ranks on this node (torchrun's LOCAL_WORLD_SIZE)."""
    return max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))  # Linux, as /proc


def global_sum(values: list, device, world_size: int) -> torch.Tensor:
    """Per-rank numbers summed over all ranks: one all-reduce of a float64 tensor on `device` (NCCL: the GPU)."""
    total = torch.tensor(values, dtype=torch.float64, device=device)
    if world_size > 1:
        dist.all_reduce(total)
    return total


def setup_distributed(args: Args):
    """torchrun sets RANK/LOCAL_RANK/WORLD_SIZE: join the group (gloo on CPU, NCCL on GPU). Alone: world size 1."""
    args.world_size = int(os.environ.get("WORLD_SIZE", "1"))
    args.rank, args.local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = args.cuda and torch.cuda.is_available()
    device = torch.device(f"cuda:{args.local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    store = None
    if args.world_size > 1:
        dist.init_process_group("nccl" if use_cuda else "gloo", init_method="env://")
        store = dist.distributed_c10d._get_default_store() if args.preempt else None
    return device, store


def restore(args: Args, agent, params: tuple, device, ckpt_path: str) -> dict:
    """Rank 0 reads the checkpoint (with --resume) and sends it to the others, so no shared disk is needed; without
    one it sends its initial weights, since nodes with other math libraries could initialize other bits.
    Returns the run's progress: update, global_step, earlier segments' times, threshold, recent returns."""
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True) \
        if args.resume and args.rank == 0 and os.path.exists(ckpt_path) else None
    if args.world_size > 1:
        box = [ckpt]
        dist.broadcast_object_list(box, 0, device=device if device.type == "cuda" else None)
        ckpt = box[0]
        if ckpt is None:
            dist.broadcast(params[0], 0)
    progress = {"update": 0, "global_step": 0, "train_time_s": 0.0, "elapsed_s": 0.0, "time_to_threshold_s": None,
                "threshold_step": None, "recent_returns": deque(maxlen=20), "resumed": ckpt is not None}
    if ckpt is not None:
        agent.load_state_dict(ckpt["model"])
        progress["adam"] = {k: v.to(device) if torch.is_tensor(v) else v for k, v in ckpt["adam"].items()}
        # .get: checkpoints written before whole-run times named the training time wall_time_s
        ckpt.setdefault("train_time_s", ckpt.get("wall_time_s", 0.0))
        progress.update({k: ckpt.get(k, 0.0) for k in ["update", "global_step", "train_time_s", "elapsed_s",
                                                       "time_to_threshold_s", "threshold_step"]})
        progress["recent_returns"].extend(ckpt["recent_returns"])
    return progress


def log_update(writer, progress: dict, finished: list, losses, totals: dict, lr: float, sps: float, world: int):
    """Rank 0's TensorBoard points for one update: finished episodes, losses, and per-rank means of the totals."""
    step = progress["global_step"]
    for ret, length in finished:
        writer.add_scalar("charts/episodic_return", ret, step)
        writer.add_scalar("charts/episodic_length", length, step)
    scalars = {"charts/learning_rate": lr, "charts/SPS": sps}
    scalars.update(zip(["losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl",
                        "losses/clipfrac"], losses.tolist()))
    scalars.update({f"stats/{name}": totals[key] / world for name, key in [  # means over ranks
        ("preempted_ranks_frac", "preempted"), ("rollout_frac", "rollout_frac"),
        ("rollout_time_s", "rollout_time"), ("learn_time_s", "learn_time")]})
    for key, value in scalars.items():
        writer.add_scalar(key, value, step)


def write_summary(args: Args, agent, writer, progress: dict, train_time: float, threshold, device, run_dir: str):
    """Rank 0 at the end: evaluate the greedy policy, write summary.json (whole-run times) and the model."""
    video_dir = os.path.join(run_dir, "videos") if args.capture_video else None
    eval_returns = evaluate(agent, args.env_id, args.eval_episodes, args.seed + 10**6, device, video_dir)
    for i, r in enumerate(eval_returns):
        writer.add_scalar("eval/episodic_return", r, i)
    recent, step = progress["recent_returns"], progress["global_step"]
    summary = {"algo": "ddppo", "env_id": args.env_id, "seed": args.seed, "world_size": args.world_size,
               "global_step": step, "wall_time_s": progress["elapsed_s"] + time.time() - PROCESS_START,
               "sps": step / train_time, "train_time_s": train_time,
               "eval_return_mean": float(np.mean(eval_returns)), "eval_return_std": float(np.std(eval_returns)),
               "train_return_last20": float(np.mean(recent)) if recent else None,
               "time_to_threshold_s": progress["time_to_threshold_s"], "threshold_step": progress["threshold_step"],
               "reward_threshold": threshold}
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    if args.save_model:
        save_checkpoint(os.path.join(run_dir, "model.pt"), {k: v.cpu() for k, v in agent.state_dict().items()})
    print(f"eval return {summary['eval_return_mean']:.1f} +- {summary['eval_return_std']:.1f}; time to threshold: "
          f"{summary['time_to_threshold_s']}; summary in {run_dir}/summary.json", flush=True)


def main(args: Args) -> int:
    warnings.filterwarnings("ignore", message=".*precision lowered by casting.*")  # envpool's spaces
    validate(args)
    device, store = setup_distributed(args)
    rank, world = args.rank, args.world_size
    args.batch_size = world * args.local_num_envs * args.num_steps
    args.num_updates = max(1, args.total_timesteps // args.batch_size)
    args.run_name = f"{args.env_id}__{args.exp_name}__{args.seed}"
    run_dir = os.path.join("runs", args.run_name)
    ckpt_path = os.path.join(run_dir, "checkpoint.pt")
    torch.set_num_threads(args.torch_threads or available_cpus())
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)  # the same on every rank: identical initial weights
    if device.type == "cuda":  # CPU ops used here are deterministic already; this call costs ~1 s of imports
        if args.torch_deterministic:  # else cuBLAS refuses deterministic mode (CUDA >= 10.2)
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(args.torch_deterministic)
        torch.backends.cudnn.deterministic = args.torch_deterministic

    spec = envpool.make_spec(args.env_id)
    threshold = spec.reward_threshold
    continuous = isinstance(spec.action_space, gym.spaces.Box)  # auto (None): normalize for Box actions only
    args.norm_obs = continuous if args.norm_obs is None else args.norm_obs
    args.norm_reward = continuous if args.norm_reward is None else args.norm_reward
    agent = Agent(spec.observation_space.shape, spec.action_space, args.norm_obs, args.norm_reward,
                  args.clip_obs).to(device)
    params = flatten_parameters(agent)
    progress = restore(args, agent, params, device, ckpt_path)
    adam = progress.pop("adam", None) or adam_init(params[0])
    recent, start_update = progress["recent_returns"], progress["update"]

    writer = None
    if rank == 0:
        from torch.utils.tensorboard import SummaryWriter
        if args.track:
            import wandb
            wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True,
                       config=asdict(args), name=args.run_name, id=args.run_name, resume="allow")
        purge = progress["global_step"] if progress["resumed"] else None  # a resume drops the points after it
        writer = SummaryWriter(run_dir, purge_step=purge)
        writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in asdict(args).items()))

    stop = {"signal": 0}
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, lambda signum, frame: stop.update(signal=signum))

    T, N = args.num_steps, args.local_num_envs
    obs_shape, act_shape = spec.observation_space.shape, spec.action_space.shape
    obs_dtype = torch.uint8 if len(obs_shape) == 3 else torch.float32
    buf = {"obs": torch.zeros((T, N) + obs_shape, dtype=obs_dtype, device=device),
           "actions": torch.zeros((T, N) + act_shape, dtype=torch.float32 if agent.continuous else torch.long, device=device)}
    for k in ["logprobs", "values", "rewards", "terms", "dones", "valid"]:
        buf[k] = torch.zeros((T, N), device=device)
    # Envs and the sampling generator start once, from a seed tied to (seed, rank, restart update); checkpoints
    # leave them alone (a checkpoint must not change training). A resumed run restarts its episodes there.
    envs = make_env(args.env_id, N, env_seed(args, rank, start_update), args.env_threads or 1)
    generator = torch.Generator(device=device).manual_seed(env_seed(args, rank, start_update))
    state = {"obs": torch.as_tensor(envs.reset()[0], device=device), "valid": torch.ones(N, device=device),
             "prev_done": np.zeros(N, dtype=bool), "ep_return": np.zeros(N), "ep_length": np.zeros(N),
             "finished": [], "ret_acc": torch.zeros(N, device=device)}
    train_start, last_print, stopped = time.time(), 0.0, False

    def train_time() -> float:  # whole run: earlier segments plus this one
        return progress["train_time_s"] + time.time() - train_start

    def checkpoint(next_update: int) -> None:
        save_checkpoint(ckpt_path, {**progress, "model": agent.state_dict(), "adam": adam, "update": next_update,
                                    "train_time_s": train_time(), "recent_returns": list(recent),
                                    "elapsed_s": progress["elapsed_s"] + time.time() - PROCESS_START})

    for update in range(start_update, args.num_updates):
        lr = args.learning_rate * (1.0 - update / args.num_updates) if args.anneal_lr else args.learning_rate

        t0 = time.time()
        steps = collect_rollout(agent, envs, state, buf, args, generator, store, update, device)
        rollout_time = time.time() - t0
        with torch.no_grad():
            rewards, obs_stats = update_normalizers(agent, buf, steps, state, args, world)
            next_value = agent.get_value(state["obs"])
            values = buf["values"][:steps]
            advantages, returns = compute_gae(rewards, values, next_value, buf["terms"][:steps],
                                              buf["dones"][:steps], args.gamma, args.gae_lambda)
        keep = buf["valid"][:steps].reshape(-1).bool()
        batch = {"obs": buf["obs"][:steps].reshape((-1,) + obs_shape)[keep],
                 "actions": buf["actions"][:steps].reshape((-1,) + act_shape)[keep],
                 "logprobs": buf["logprobs"][:steps].reshape(-1)[keep], "values": values.reshape(-1)[keep],
                 "advantages": advantages.reshape(-1)[keep], "returns": returns.reshape(-1)[keep]}
        t1 = time.time()
        losses = ppo_update(agent, params, adam, batch, args, lr, generator, world)
        if obs_stats is not None:
            agent.obs_rms.load(*obs_stats)
        learn_time = time.time() - t1

        # Per-update bookkeeping: one small all-reduce of counters (steps, preemption, stop requests).
        finished, state["finished"] = state["finished"], []
        if store is not None and rank == 0 and update > 0:
            store.delete_key(f"ddppo/finished/{update - 1}")
        totals = dict(zip(["steps", "preempted", "rollout_frac", "stop", "rollout_time", "learn_time"], global_sum(
            [steps * N, float(steps < T), steps / T, float(stop["signal"] != 0), rollout_time, learn_time],
            device, world).tolist()))  # sums over ranks
        progress["global_step"] += int(totals["steps"])
        for ret, _ in finished:
            recent.append(ret)
            if threshold is not None and progress["time_to_threshold_s"] is None and len(recent) == 20 \
                    and np.mean(recent) >= threshold:
                progress["time_to_threshold_s"] = progress["elapsed_s"] + time.time() - PROCESS_START
                progress["threshold_step"] = progress["global_step"]
        if rank == 0:
            sps = progress["global_step"] / train_time()
            log_update(writer, progress, finished, losses, totals, lr, sps, world)
            if time.time() - last_print > 2.0 or update == args.num_updates - 1:
                last_print = time.time()
                mean = f"{np.mean(recent):.1f}" if recent else "n/a"
                print(f"update {update + 1}/{args.num_updates} global_step={progress['global_step']} SPS={sps:.0f} "
                      f"return(last {len(recent)})={mean}", flush=True)
        if totals["stop"] > 0:  # SIGTERM/SIGUSR1 on some rank (SLURM preemption): save, then exit cleanly
            if rank == 0:
                checkpoint(update + 1)
                print(f"signal received: checkpoint of update {update + 1} written to {ckpt_path}; "
                      "rerun with --resume to continue", flush=True)
            stopped = True
            break
        if args.checkpoint_every and (update + 1) % args.checkpoint_every == 0 and rank == 0:
            checkpoint(update + 1)
    if not stopped and rank == 0:  # also after resuming a checkpoint of the last update
        write_summary(args, agent, writer, progress, train_time(), threshold, device, run_dir)
    envs.close()
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

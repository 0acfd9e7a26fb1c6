# docs: docs/seed.md | paper: https://arxiv.org/abs/1910.06591
"""SEED-style central inference (Espeholt et al., 2019), trained with IMPALA's V-trace.

Actors hold no model: they step their envpool batches and exchange observations for actions with the learner
process, where one inference thread batches the pending requests of all actors (run when every actor waits or
after a short timeout), keeps the LSTM state of every env, and assembles the unrolls that the training thread
consumes. Local actors talk through shared memory and pipes; under torchrun, rank 0 is the learner and every
other rank is one remote actor that talks to it through torch.distributed send/recv.

  python algos/seed.py                                              # learner + one actor per core, CartPole-v1
  torchrun --standalone --nproc_per_node=3 algos/seed.py            # learner (+ local actors) and 2 remote actors
"""
import ctypes
import json
import multiprocessing.connection
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
    exp_name: str = "seed"  # the name of this experiment (part of the run name)
    seed: int = 1  # seed of the experiment
    torch_deterministic: bool = True  # deterministic CUDA kernels (the CPU kernels used here are anyway)
    cuda: bool = True  # run the learner's inference and training on CUDA when it is available (actors have no model)
    track: bool = False  # log to Weights & Biases as well as TensorBoard
    wandb_project_name: str = "distrl"  # the wandb project name
    wandb_entity: Optional[str] = None  # the wandb entity (team)
    capture_video: bool = False  # save the first evaluation episode's frames (Atari) to runs/<run_name>/videos/
    save_model: bool = False  # write the final weights (state_dict) to runs/<run_name>/model.pt
    env_id: str = "CartPole-v1"  # the envpool environment id
    total_timesteps: int = 400_000  # total environment steps consumed by the learner
    eval_episodes: int = 10  # episodes of the final, greedy policy to evaluate at the end
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
    gamma: float = 0.995  # discount factor (0.995 rather than 0.99: see docs/seed.md, Defaults)
    rho_bar: float = 1.0  # V-trace's truncation of the importance weights rho (paper: 1)
    c_bar: float = 1.0  # V-trace's truncation of the trace coefficients c (paper: 1)
    vtrace_lambda: float = 1.0  # lambda scaling the trace coefficients, c_i = lambda min(c_bar, pi/mu) (paper: 1)
    ent_coef: float = 0.02  # entropy bonus coefficient (0.02 rather than 0.01: see docs/seed.md, Defaults)
    vf_coef: float = 0.5  # baseline (value) loss coefficient
    norm_reward: tyro.conf.DisallowNone[Optional[bool]] = None
    """divide rewards by the running std of the discounted return (default: on for vector observations; off for
    images, whose rewards are clipped to [-1, 1] as in the paper; see docs/seed.md, Defaults)"""
    clip_reward: float = 10.0  # scaled rewards are clipped to [-clip_reward, clip_reward]
    max_grad_norm: float = 0.5  # global grad-norm clip after the all-reduce (paper: 40 for summed losses; see docs)
    torch_threads: int = 0  # learner's torch threads, shared by its inference and training threads (0: 1)
    env_threads: int = 0  # envpool threads per actor (0: 1)
    # --- distributed ---
    num_actors: int = 0  # actors beside the learner on rank 0 (0: one per CPU); other ranks are one more each
    num_buffers: int = 0  # unroll buffers (0: max(2 x unrolls per batch, unrolls per batch + 2 x actors))
    # dynamic batching: run inference when every actor waits, or this long after the first request
    inference_timeout_ms: float = 1.0
    checkpoint_every: int = 0  # write runs/<run_name>/checkpoint.pt every this many updates (0: on signals only)
    resume: bool = False  # continue from runs/<run_name>/checkpoint.pt when it exists
    # --- computed at run time ---
    world_size: int = field(default=1, init=False)
    rank: int = field(default=0, init=False)
    local_rank: int = field(default=0, init=False)
    unrolls_per_batch: int = field(default=0, init=False)
    total_actors: int = field(default=0, init=False)
    num_updates: int = field(default=0, init=False)
    run_name: str = field(default="", init=False)


def fail(arg: str, message: str) -> None:
    """Bad argument: one line naming it on stderr, exit code 2 (as argparse does)."""
    print(f"{os.path.basename(sys.argv[0])}: error: --{arg.replace('_', '-')}: {message}", file=sys.stderr)
    sys.exit(2)


def validate(args: Args) -> None:
    if not 0 <= args.seed < 2**30:  # env seeds add offsets to it and must stay 32-bit
        fail("seed", f"must be in [0, 2**30), got {args.seed}")
    for name in ["total_timesteps", "num_envs", "unroll_length", "batch_size", "eval_episodes", "learning_rate",
                 "rho_bar", "c_bar", "rmsprop_eps", "adam_eps", "clip_reward"]:
        if getattr(args, name) <= 0:
            fail(name, f"must be positive, got {getattr(args, name)}")
    for name in ["torch_threads", "env_threads", "num_actors", "num_buffers", "checkpoint_every", "ent_coef",
                 "vf_coef", "max_grad_norm", "inference_timeout_ms"]:
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
    actors = (args.num_actors or available_cpus()) + int(os.environ.get("WORLD_SIZE", "1")) - 1
    if args.num_buffers and args.num_buffers < actors + unrolls - 1:
        fail("num_buffers", f"{args.num_buffers} is too few: {actors} actors and {unrolls} unrolls per batch need at "
             f"least {actors + unrolls - 1}")
    if args.env_id not in envpool.list_all_envs():
        fail("env_id", f"'{args.env_id}' is not an envpool environment")
    spec = envpool.make_spec(args.env_id)
    obs_space, act_space = spec.observation_space, spec.action_space
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) not in (1, 3):
        fail("env_id", f"'{args.env_id}' has observation space {obs_space}; SEED here needs a flat or image Box")
    if not isinstance(act_space, gym.spaces.Discrete):
        fail("env_id", f"'{args.env_id}' has action space {act_space}; SEED here needs Discrete actions")
    if args.network in ("nature", "resnet") and len(obs_space.shape) != 3:
        fail("network", f"'{args.network}' needs image observations; '{args.env_id}' has {obs_space.shape}")
    if args.network == "mlp" and len(obs_space.shape) != 1:
        fail("network", f"'mlp' needs flat observations; '{args.env_id}' has {obs_space.shape}")
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


def env_seed(args: Args, actor: int, update: int) -> int:
    """Seed of env 0 of `actor` (local actors first, then remote ranks) when actors start at `update`: distinct
    for every env, actor and restart point."""
    return args.seed + (update * args.total_actors + actor) * args.num_envs


# ----------------------------------------------------------------------------------------------- networks
def layer_init(layer: nn.Module, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Module:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(n_in: int, n_out: int, out_std: float) -> nn.Module:
    return nn.Sequential(layer_init(nn.Linear(n_in, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh(),
                         layer_init(nn.Linear(64, n_out), out_std))


class ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


def resnet_torso(in_channels: int) -> nn.Module:
    """The paper's deep network (Figure 3, right): three sections of conv 3x3, max-pool 3x3 stride 2 and two
    residual blocks, with 16, 32, 32 channels; then ReLU and a 256-unit fully connected layer."""
    layers, c = [], in_channels
    for out in (16, 32, 32):
        layers += [nn.Conv2d(c, out, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1),
                   ResidualBlock(out), ResidualBlock(out)]
        c = out
    return nn.Sequential(*layers, nn.ReLU(), nn.Flatten(), nn.Linear(32 * 11 * 11, 256), nn.ReLU())


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
    """Torso, optional LSTM core, policy-logit and baseline heads. Images: a shared Nature-CNN or residual torso
    with linear heads (the paper's layout). Vectors: two 64-64 tanh MLPs as heads, policy and baseline apart
    (docs/conventions.md). `forward` takes a time axis, [T, N, ...], so actors (T = 1) and the learner
    (T = unroll + 1) share it. With norm_reward, `return_rms` holds the reward scaler's statistics."""

    def __init__(self, obs_shape, num_actions: int, network: str = "auto", use_lstm: bool = False,
                 norm_reward: bool = False):
        super().__init__()
        self.image = len(obs_shape) == 3
        network = ("nature" if self.image else "mlp") if network == "auto" else network
        if network == "mlp":
            self.torso, width = nn.Identity(), int(np.prod(obs_shape))
        elif network == "nature":
            self.torso = nn.Sequential(
                layer_init(nn.Conv2d(obs_shape[0], 32, 8, stride=4)), nn.ReLU(),
                layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
                layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(), nn.Flatten(),
                layer_init(nn.Linear(64 * 7 * 7, 512)), nn.ReLU())
            width = 512
        else:
            self.torso, width = resnet_torso(obs_shape[0]), 256
        self.core = nn.LSTMCell(width, 64 if network == "mlp" else 256) if use_lstm else None
        width = self.core.hidden_size if use_lstm else width
        if network == "mlp":
            self.policy, self.baseline = mlp(width, num_actions, 0.01), mlp(width, 1, 1.0)
        else:
            self.policy, self.baseline = layer_init(nn.Linear(width, num_actions), 0.01), layer_init(nn.Linear(width, 1), 1.0)
        self.return_rms = RunningMeanStd() if norm_reward else None

    def initial_state(self, n: int, device=None):
        """Zero LSTM state (h, c) stacked as [2, n, width]; an empty tensor without LSTM."""
        return torch.zeros(2, n, self.core.hidden_size if self.core is not None else 0, device=device)

    def forward(self, obs: torch.Tensor, valid: torch.Tensor, state: torch.Tensor):
        """obs [T, N, ...], valid [T, N] (0 on envpool's reset steps), state [2, N, H] -> logits [T, N, A],
        values [T, N], state after the last step. The LSTM state is zeroed after a reset step, so every episode
        starts from the zero state."""
        T, N = obs.shape[:2]
        x = obs.reshape((T * N,) + obs.shape[2:]).float()
        h = self.torso(x / 255.0 if self.image else x)
        if self.core is not None:
            h, outs = h.view(T, N, -1), []
            hx, cx = state[0], state[1]
            for t in range(T):
                hx, cx = self.core(h[t], (hx, cx))
                outs.append(hx)
                keep = valid[t].unsqueeze(-1)
                hx, cx = hx * keep, cx * keep
            h, state = torch.stack(outs).view(T * N, -1), torch.stack([hx, cx])
        return self.policy(h).view(T, N, -1), self.baseline(h).view(T, N), state


# ----------------------------------------------------------------------------------------------- algorithm
@torch.no_grad()
def vtrace(behaviour_logp, target_logp, rewards, values, bootstrap_value, terms, dones, valid,
           gamma: float, rho_bar: float = 1.0, c_bar: float = 1.0, lam: float = 1.0):
    """V-trace targets v_s and policy-gradient advantages over a [T, B] batch (paper, Section 4.1):

      rho_t = min(rho_bar, pi/mu),  c_t = lam * min(c_bar, pi/mu)
      delta_t = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t))            gamma_t = gamma (1 - terminated_t)
      v_s - V(x_s) = delta_s + gamma c_s (v_{s+1} - V(x_{s+1}))      (the trace is cut where an episode ends)
      A_s = rho_s (r_s + gamma_s v_{s+1} - V(x_s))

    V(x_T) is bootstrap_value. A truncated step bootstraps from the value of the final observation, which envpool
    returns as x_{t+1}. Steps with valid = 0 (envpool's reset step after an episode end) have v_s = V(x_s)."""
    ratio = (target_logp - behaviour_logp).exp()
    rho, c = ratio.clamp(max=rho_bar), lam * ratio.clamp(max=c_bar)
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
    """Policy gradient weighted by the V-trace advantages, baseline loss towards v_s, entropy bonus; means over
    the valid steps of the batch. batch: obs [T+1, B, ...], the rest [T, B] (logits [T, B, A], state [2, B, H])."""
    T = batch["actions"].shape[0]
    valid_all = torch.cat([batch["valid"], torch.ones_like(batch["valid"][:1])])
    logits, values, _ = agent(batch["obs"], valid_all, batch["state"])
    logp_all = torch.log_softmax(logits[:T], dim=-1)
    target_logp = logp_all.gather(-1, batch["actions"].unsqueeze(-1)).squeeze(-1)
    behaviour_logp = torch.log_softmax(batch["logits"], dim=-1).gather(-1, batch["actions"].unsqueeze(-1)).squeeze(-1)
    vs, pg_adv = vtrace(behaviour_logp, target_logp.detach(), batch["rewards"], values[:T].detach(), values[T].detach(),
                        batch["terms"], batch["dones"], batch["valid"], args.gamma, args.rho_bar, args.c_bar,
                        args.vtrace_lambda)
    valid = batch["valid"]
    n = valid.sum().clamp(min=1.0)
    pg_loss = -(pg_adv * target_logp * valid).sum() / n
    baseline_loss = 0.5 * (((vs - values[:T]) ** 2) * valid).sum() / n
    entropy = (-(logp_all.exp() * logp_all).sum(-1) * valid).sum() / n
    loss = pg_loss + args.vf_coef * baseline_loss - args.ent_coef * entropy
    return loss, torch.stack([pg_loss, baseline_loss, entropy]).detach()


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


def scale_rewards(rewards, return_rms: RunningMeanStd, clip: float):
    """The reward scaler: rewards divided by the running std of the discounted return (the actors' `returns`),
    clipped. The value targets then stay of order one whatever the discount, which an MLP baseline can track."""
    return (rewards / torch.sqrt(return_rms.var + 1e-8)).clamp(-clip, clip)


def rmsprop_step(params, grad: torch.Tensor, state: dict, lr: float, alpha: float = 0.99, eps: float = 0.01) -> None:
    """RMSProp on the flat gradient vector, in torch.optim.RMSprop's form (bitwise equal to it, momentum 0):
    v <- alpha v + (1 - alpha) g^2;  p <- p - lr g / (sqrt(v) + eps). Written out, as is Adam, because
    constructing a torch.optim optimizer imports torch._dynamo (over a second of start-up)."""
    state["step"] += 1
    state["v"].mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
    update = lr * grad / state["v"].sqrt().add_(eps)
    apply_update(params, update)


def adam_step(params, grad: torch.Tensor, state: dict, lr: float, betas=(0.9, 0.999), eps: float = 1e-5) -> None:
    """Adam (Kingma & Ba, 2015) on the flat gradient vector, in torch.optim.Adam's order of operations:
    equals torch.optim.Adam(params, lr, betas, eps).step() (tested bitwise)."""
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
def trajectory_buffers(args: Args, spec, num_buffers: int, state_width: int) -> dict:
    """Unroll buffers [K, ...], filled by the inference thread, read by the training thread; the layout of
    impala.py's shared buffers (here the parameter version is the one at x_0)."""
    T, N, A, obs_shape = args.unroll_length, args.num_envs, spec.action_space.n, spec.observation_space.shape
    b = {"obs": torch.zeros((num_buffers, T + 1, N) + obs_shape, dtype=torch.uint8 if len(obs_shape) == 3 else torch.float32),
         "actions": torch.zeros((num_buffers, T, N), dtype=torch.long), "logits": torch.zeros((num_buffers, T, N, A)),
         "state": torch.zeros((num_buffers, 2, N, state_width)),
         "meta": torch.zeros((num_buffers, 3), dtype=torch.long)}  # parameter version, actor, sequence number
    for k in ["rewards", "terms", "dones", "valid", "returns", "ep_return", "ep_length"]:
        b[k] = torch.zeros((num_buffers, T, N))
    return b


def actor_slots(args: Args, spec, num_actors: int) -> dict:
    """One request/response slot per actor in shared memory: the observation, what the last step gave (reward,
    terminated, done, discounted return so far, return and length of an episode that ended, NaN otherwise; the
    actor's last wait), and the action the learner answers with (-1: stop)."""
    obs_shape, N = spec.observation_space.shape, args.num_envs
    return {"obs": torch.zeros((num_actors, N) + obs_shape, dtype=torch.uint8 if len(obs_shape) == 3 else torch.float32).share_memory_(),
            "step": torch.zeros((num_actors, N, 7)).share_memory_(),
            "actions": torch.zeros((num_actors, N), dtype=torch.long).share_memory_()}


def actor_loop(actor: int, args: Args, slots: dict, conn, group=None, start_update: int = 0) -> None:
    """One actor, no model: write the observation (and what the last step gave) into its slot, ask the learner
    for actions, step the envs. Local actors signal through a pipe (`conn`); a remote actor (rank > 0) sends its
    slot to rank 0 and receives the actions through torch.distributed (`group`, a pair group with rank 0)."""
    if group is None:  # a local actor process: die with the learner, leave SIGTERM/SIGUSR1 to it
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Local or remote (torchrun sends SIGTERM to every rank): the learner turns the signal into a checkpoint and
    # then answers every actor with "stop", so an actor must not die of it first.
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    torch.set_num_threads(1)
    N = args.num_envs
    envs = make_env(args.env_id, N, env_seed(args, actor, start_update), args.env_threads or 1)
    obs = envs.reset()[0]
    ep_return, ep_length, prev_done = np.zeros(N), np.zeros(N), np.zeros(N, dtype=bool)
    ret_acc = np.zeros(N)  # discounted return along each env, R_t = gamma R_{t-1} + r_t, reset after an episode end
    step = np.tile(np.array([0, 0, 0, 0, np.nan, 0, 0], dtype=np.float32), (N, 1))  # nothing happened yet
    while True:
        slots["obs"][actor] = torch.as_tensor(obs)
        slots["step"][actor] = torch.as_tensor(step)
        t0 = time.time()
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
        obs, r, term, trunc, info = envs.step(action)
        done = term | trunc
        # Episode statistics (Atari: raw rewards and real game over); the reset step after an end adds nothing.
        ep_return += info.get("reward", r) * ~prev_done
        ep_length += ~prev_done
        ended = (info["terminated"].astype(bool) | trunc) if "terminated" in info else done
        ret_acc = ret_acc * args.gamma + r
        step[:] = np.stack([r, term, done, ret_acc, np.where(ended, ep_return, np.nan), ep_length,
                            np.full(N, time.time() - t0)], axis=1)
        ep_return[ended], ep_length[ended], ret_acc[done] = 0.0, 0, 0.0
        prev_done = done


def remote_bridge(actor: int, peer: int, group, slots: dict, conn, control: dict) -> None:
    """Rank 0's stand-in for the remote actor on rank `peer`: receive its request into the actor's slot, pass it to
    the inference thread like a local actor would, send the actions back."""
    try:
        while True:
            dist.recv(slots["obs"][actor], peer, group=group)
            dist.recv(slots["step"][actor], peer, group=group)
            conn.send_bytes(b"")
            conn.recv_bytes()
            actions = slots["actions"][actor].clone()  # what was sent decides: the learner may write "stop" meanwhile
            dist.send(actions, peer, group=group)
            if actions[0] < 0:
                return
    except Exception as e:  # noqa: BLE001 - any failure of the link ends the job
        control.setdefault("error", f"remote actor {actor} (rank {peer}): {e!r}")


def inference_loop(agent: Agent, lock, args: Args, slots: dict, conns: list, traj: dict, free_q, full_q,
                   control: dict, device, generator) -> None:
    """The learner's inference thread. Dynamic batching: wait for requests; run one batched forward pass when every
    actor waits or inference_timeout_ms after the first request. The LSTM state of every env lives here. Each
    answered request also extends that actor's unroll; a finished unroll goes to the training thread."""
    M, N, T = len(conns), args.num_envs, args.unroll_length
    state = agent.initial_state(M * N, device).view(2, M, N, -1)
    cur, t, seq = [free_q.get() for _ in range(M)], [0] * M, [0] * M
    waiting, first, timeout = [], 0.0, args.inference_timeout_ms / 1000
    control["waiting"] = waiting  # read but not answered yet: the learner answers these with "stop" at the end
    while not control.get("stop"):
        idle = [c for a, c in enumerate(conns) if a not in waiting]  # empty when every actor waits: run now
        limit = min(0.2, max(0.0, first + timeout - time.time())) if waiting else 0.2
        ready = multiprocessing.connection.wait(idle, timeout=limit) if idle else []
        for c in ready:
            a = conns.index(c)
            try:
                c.recv_bytes()
            except (EOFError, OSError):
                control.setdefault("error", f"actor {a} closed its connection (died)")
                return
            first = first if waiting else time.time()
            waiting.append(a)
        if not waiting or (len(waiting) < M and time.time() < first + timeout):
            continue
        t0 = time.time()
        R = sorted(waiting)
        idx = torch.tensor(R)
        obs, step = slots["obs"][idx], slots["step"][idx]
        valid = 1.0 - step[..., 2]  # the step after an episode end is envpool's reset step
        before = state[:, idx].flatten(1, 2)
        with lock, torch.no_grad():
            logits, _, after = agent(obs.flatten(0, 1).unsqueeze(0).to(device), valid.view(1, -1).to(device), before)
            version = control["version"]
        action = torch.multinomial(torch.softmax(logits[0], -1), 1, generator=generator).view(len(R), N).cpu()
        state[:, idx] = after.view(2, len(R), N, -1)
        logits, before = logits[0].view(len(R), N, -1).cpu(), before.view(2, len(R), N, -1).cpu()
        slots["actions"][idx] = action
        for a in R:  # answer first, then do the bookkeeping while the actors step
            conns[a].send_bytes(b"")
        for i, a in enumerate(R):
            k, ta = cur[a], t[a]
            if ta > 0:  # what the previous action gave
                for j, key in enumerate(["rewards", "terms", "dones", "returns", "ep_return", "ep_length"]):
                    traj[key][k, ta - 1] = step[i, :, j]
            if ta == T:  # unroll complete: x_T is also x_0 of the next one
                traj["obs"][k, T] = obs[i]
                full_q.put(k)
                while True:
                    try:
                        k = cur[a] = free_q.get(timeout=0.5)  # no free buffer: backpressure on every actor
                        break
                    except queue.Empty:
                        if control.get("stop"):
                            return waiting.clear()
                seq[a], ta = seq[a] + 1, 0
            if ta == 0:
                traj["state"][k] = before[:, i]
                traj["meta"][k] = torch.tensor([version, a, seq[a]])
            traj["obs"][k, ta], traj["logits"][k, ta] = obs[i], logits[i]
            traj["actions"][k, ta], traj["valid"][k, ta] = action[i], valid[i]
            t[a] = ta + 1
        for key, value in [("batch", len(R) * N), ("latency", 1000 * (time.time() - t0)),
                           ("wait", 1000 * step[..., 6].mean().item())]:
            control["stats"][key].append(value)
        waiting.clear()


def flat_params(agent: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in agent.parameters()]).cpu()


class ActorDied(RuntimeError):
    """An actor (or, in SEED, the link to it) is gone: the job ends non-zero."""


def evaluate(agent: Agent, env_id: str, episodes: int, seed: int, device, video_dir: Optional[str] = None):
    """Returns of `episodes` episodes of the greedy policy, one env per episode (no bias to short episodes)."""
    envs = make_env(env_id, episodes, seed, **(dict(episodic_life=False, reward_clip=False) if agent.image else {}))
    obs, _ = envs.reset()
    returns, done = np.zeros(episodes), np.zeros(episodes, dtype=bool)
    state, valid, frames = agent.initial_state(episodes, device), torch.ones(1, episodes, device=device), []
    while not done.all():
        with torch.no_grad():
            logits, _, state = agent(torch.as_tensor(obs, device=device).unsqueeze(0), valid, state)
        obs, r, term, trunc, info = envs.step(logits[0].argmax(-1).cpu().numpy())
        returns += info.get("reward", r) * ~done
        if video_dir is not None and not done[0]:
            frames.append(obs[0, -1])
        done |= (info["terminated"].astype(bool) if "terminated" in info else term) | trunc
        valid = torch.as_tensor(~(term | trunc), dtype=torch.float32, device=device).unsqueeze(0)
    if frames:
        os.makedirs(video_dir, exist_ok=True)
        np.savez_compressed(os.path.join(video_dir, "eval_episode0.npz"), frames=np.stack(frames))
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


def setup_distributed(args: Args):
    """torchrun sets RANK/LOCAL_RANK/WORLD_SIZE. Rank 0 is the learner; rank r > 0 is a remote actor linked to it
    by a gloo pair group (CPU tensors; inference may still run on the learner's GPU). Alone: world size 1."""
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
    args.num_actors = args.num_actors or available_cpus()
    args.total_actors = args.num_actors + world - 1
    args.unrolls_per_batch = args.batch_size // args.num_envs
    num_buffers = args.num_buffers or max(2 * args.unrolls_per_batch, args.unrolls_per_batch + 2 * args.total_actors)
    steps_per_update = args.batch_size * args.unroll_length
    args.num_updates = max(1, args.total_timesteps // steps_per_update)
    args.run_name = f"{args.env_id}__{args.exp_name}__{args.seed}"
    run_dir, ckpt_path = os.path.join("runs", args.run_name), os.path.join("runs", args.run_name, "checkpoint.pt")
    torch.set_num_threads(args.torch_threads or 1)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    ckpt = torch.load(ckpt_path, map_location=device, weights_only=True) \
        if args.resume and rank == 0 and os.path.exists(ckpt_path) else None
    start = torch.tensor([ckpt["update"] if ckpt else 0])
    if args.resume and world > 1:  # the learner's restart point decides every actor's env seeds
        dist.broadcast(start, 0)
    start_update = int(start)
    if rank > 0:  # a remote actor: its actor index follows the learner's local actors
        actor_loop(args.num_actors + rank - 1, args, actor_slots(args, envpool.make_spec(args.env_id), args.total_actors),
                   None, groups[rank], start_update)
        dist.barrier()
        dist.destroy_process_group()
        return 0
    if device.type == "cuda":  # CPU ops used here are deterministic already; this call costs ~1 s of imports
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS refuses deterministic mode without it
        torch.use_deterministic_algorithms(args.torch_deterministic)
        torch.backends.cudnn.deterministic = args.torch_deterministic

    spec = envpool.make_spec(args.env_id)
    threshold = spec.reward_threshold  # None for envs without one
    args.norm_reward = len(spec.observation_space.shape) != 3 if args.norm_reward is None else args.norm_reward
    agent = Agent(spec.observation_space.shape, spec.action_space.n, args.network, args.use_lstm,
                  args.norm_reward).to(device)
    params = list(agent.parameters())
    opt_state = optimizer_init(params)
    global_step, wall_before, time_to_threshold, threshold_step = 0, 0.0, None, None
    elapsed_before = 0.0  # wall time of earlier segments, each from its process start (whole-run figures)
    recent, lags = deque(maxlen=20), []
    if ckpt:
        agent.load_state_dict(ckpt["model"])  # and below: .get, for checkpoints from before whole-run times
        opt_state, elapsed_before = ckpt["optimizer"], ckpt.get("elapsed_s", 0.0)
        global_step, wall_before = ckpt["global_step"], ckpt["wall_time_s"]
        time_to_threshold, threshold_step = ckpt["time_to_threshold_s"], ckpt["threshold_step"]
        recent.extend(ckpt["recent_returns"])

    # Actor processes first (fork before the learner computes anything), then the bridges and the inference thread.
    slots = actor_slots(args, spec, args.total_actors)
    ctx = mp.get_context("fork")
    pipes = [ctx.Pipe() for _ in range(args.total_actors)]  # (learner end, actor end)
    actors = [ctx.Process(target=actor_loop, args=(i, args, slots, pipes[i][1], None, start_update), daemon=True)
              for i in range(args.num_actors)]
    for p in actors:
        p.start()
    control = {"version": start_update, "stats": {"batch": [], "latency": [], "wait": []}}
    bridges = [threading.Thread(target=remote_bridge, daemon=True,
                                args=(args.num_actors + r - 1, r, groups[r], slots, pipes[args.num_actors + r - 1][1], control))
               for r in range(1, world)]
    for b in bridges:
        b.start()
    traj = trajectory_buffers(args, spec, num_buffers, agent.initial_state(1).shape[-1])
    free_q, full_q = queue.Queue(maxsize=num_buffers), queue.Queue(maxsize=num_buffers)
    for k in range(num_buffers):
        free_q.put(k)
    generator = torch.Generator(device=device).manual_seed(env_seed(args, args.total_actors, start_update))
    lock = threading.Lock()  # held by inference's forward pass and the optimizer step
    inference = threading.Thread(target=inference_loop, daemon=True,
                                 args=(agent, lock, args, slots, [p[0] for p in pipes], traj, free_q, full_q, control,
                                       device, generator))
    inference.start()

    from torch.utils.tensorboard import SummaryWriter
    if args.track:
        import wandb
        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True,
                   config=asdict(args), name=args.run_name, id=args.run_name, resume="allow")
    writer = SummaryWriter(run_dir, purge_step=global_step if start_update else None)  # drop points after it
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in asdict(args).items()))

    stop = {"signal": 0}
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, lambda signum, frame: stop.update(signal=signum))

    def checkpoint(next_update: int):
        save_checkpoint(ckpt_path, {"model": agent.state_dict(), "optimizer": opt_state, "update": next_update,
                                    "global_step": global_step, "wall_time_s": wall_before + time.time() - train_start,
                                    "elapsed_s": elapsed_before + time.time() - PROCESS_START, "recent_returns": list(recent),
                                    "time_to_threshold_s": time_to_threshold, "threshold_step": threshold_step})

    def next_batch() -> list:  # unrolls_per_batch finished unrolls, in the order they were finished
        chosen = []
        while len(chosen) < args.unrolls_per_batch:
            try:
                chosen.append(full_q.get(timeout=0.5))
            except queue.Empty:
                pass
            for i, p in enumerate(actors):  # checked at every unroll: the other actors may keep the queue busy
                if p.exitcode is not None:
                    raise ActorDied(f"actor {i} (pid {p.pid}) exited with code {p.exitcode}")
            if "error" in control or not inference.is_alive():
                raise ActorDied(control.get("error", "the inference thread stopped"))
        return chosen

    sps, last_print, exit_code = 0.0, 0.0, 0
    inference_totals = {"inference_batch_mean": [], "inference_latency_ms": [], "actor_wait_ms": []}  # per update
    train_start = time.time()
    try:
        for update in range(start_update, args.num_updates):
            t0 = time.time()
            idx = torch.tensor(next_batch())
            wait_time = time.time() - t0
            # Copy the unrolls out ([K, T, N] -> [T, K*N]) and hand the buffers straight back.
            batch = {k: v[idx].transpose(0, 1).flatten(1, 2) for k, v in traj.items() if k != "meta"}
            meta = traj["meta"][idx]
            for k in idx.tolist():
                free_q.put(k)
            ep_return, ep_length, returns = batch.pop("ep_return"), batch.pop("ep_length"), batch.pop("returns")
            ended = ~torch.isnan(ep_return)
            finished = list(zip(ep_return[ended].tolist(), ep_length[ended].tolist()))
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            lr = args.learning_rate * (1.0 - update / args.num_updates) if args.anneal_lr else args.learning_rate

            t1 = time.time()
            rms = agent.return_rms
            if rms is not None:  # scaled by the statistics before this batch, then the batch is merged in
                batch["rewards"] = scale_rewards(batch["rewards"], rms, args.clip_reward)
                rms.load(*rms_merge(rms.mean, rms.var, rms.count,
                                    rms_moments(returns.to(device), batch["valid"].reshape(-1), rms.mean)))
            loss, losses = impala_loss(agent, batch, args)
            agent.zero_grad(set_to_none=False)
            loss.backward()
            grad = clip_grad(torch.cat([p.grad.reshape(-1) for p in params]), args.max_grad_norm)
            with lock:  # the inference thread never sees half-updated parameters
                if args.optimizer == "rmsprop":
                    rmsprop_step(params, grad, opt_state, lr, args.rmsprop_alpha, args.rmsprop_eps)
                else:
                    adam_step(params, grad, opt_state, lr, eps=args.adam_eps)
                control["version"] = update + 1
            learn_time = time.time() - t1

            global_step += steps_per_update
            lag = update - meta[:, 0].double().mean().item()  # learner version minus the batch's versions
            lags.append(lag)
            for ret, _ in finished:
                recent.append(ret)
                if threshold is not None and time_to_threshold is None and len(recent) == 20 and np.mean(recent) >= threshold:
                    time_to_threshold, threshold_step = elapsed_before + time.time() - PROCESS_START, global_step
            now = time.time()
            sps = global_step / (wall_before + now - train_start)  # whole run
            for ret, length in finished:
                writer.add_scalar("charts/episodic_return", ret, global_step)
                writer.add_scalar("charts/episodic_length", length, global_step)
            stats, control["stats"] = control["stats"], {"batch": [], "latency": [], "wait": []}
            means = {key: float(np.mean(v)) for key, v in zip(inference_totals, stats.values()) if v}  # {}: no batch
            for key, value in means.items():
                inference_totals[key].append(value)
            scalars = {"charts/learning_rate": lr, "charts/SPS": sps, "charts/policy_lag": lag, "stats/learner_wait_s":
                       wait_time, "stats/learn_time_s": learn_time, "stats/full_queue": full_q.qsize(),
                       **{f"stats/{key}": value for key, value in means.items()}}
            scalars.update(zip(["losses/policy_loss", "losses/value_loss", "losses/entropy"], losses.tolist()))
            for key, value in scalars.items():
                writer.add_scalar(key, value, global_step)
            if now - last_print > 2.0 or update == args.num_updates - 1:
                last_print = now
                mean = f"{np.mean(recent):.1f}" if recent else "n/a"
                print(f"update {update + 1}/{args.num_updates} global_step={global_step} SPS={sps:.0f} "
                      f"policy_lag={lag:.1f} return(last {len(recent)})={mean}", flush=True)
            if args.checkpoint_every and (update + 1) % args.checkpoint_every == 0:
                checkpoint(update + 1)
            if stop["signal"]:  # SIGTERM/SIGUSR1 (SLURM preemption): save, then exit cleanly
                checkpoint(update + 1)
                print(f"signal received: checkpoint of update {update + 1} written to {ckpt_path}; "
                      "rerun with --resume to continue", flush=True)
                break
        else:
            wall = wall_before + time.time() - train_start
            video_dir = os.path.join(run_dir, "videos") if args.capture_video else None
            for p in actors:  # the actors' CPU is the evaluation's now
                p.kill()
            eval_returns = evaluate(agent, args.env_id, args.eval_episodes, args.seed + 10**6, device, video_dir)
            for i, r in enumerate(eval_returns):
                writer.add_scalar("eval/episodic_return", r, i)
            import hashlib
            summary = {"algo": "seed", "env_id": args.env_id, "seed": args.seed, "world_size": world,
                       "num_actors": args.total_actors, "global_step": global_step, "train_time_s": wall,
                       "wall_time_s": elapsed_before + time.time() - PROCESS_START, "sps": global_step / wall,
                       "eval_return_mean": float(np.mean(eval_returns)), "eval_return_std": float(np.std(eval_returns)),
                       "train_return_last20": float(np.mean(recent)) if recent else None,
                       "time_to_threshold_s": time_to_threshold, "threshold_step": threshold_step,
                       "reward_threshold": threshold, "policy_lag_mean": float(np.mean(lags)) if lags else None,
                       **{k: float(np.mean(v)) if v else None for k, v in inference_totals.items()},  # None: no update
                       "params_sha256": hashlib.sha256(flat_params(agent).numpy().tobytes()).hexdigest()}
            with open(os.path.join(run_dir, "summary.json"), "w") as f:
                json.dump(summary, f, indent=2)
            if args.save_model:
                save_checkpoint(os.path.join(run_dir, "model.pt"), {k: v.cpu() for k, v in agent.state_dict().items()})
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
        inference.join(timeout=10)
    writer.close()
    if args.track:
        wandb.finish()  # imported above, with wandb.init
    if world > 1:
        if exit_code:
            os._exit(exit_code)  # torchrun stops the remote actors
        slots["actions"][args.num_actors:] = -1  # answer each remote actor's next request with "stop"
        for a, b in enumerate(bridges, start=args.num_actors):
            conn, end = pipes[a][0], time.time() + 30
            if a in control["waiting"]:  # read by the inference thread, not answered
                conn.send_bytes(b"")
            while b.is_alive() and time.time() < end:  # a bridge returns once it has sent "stop"
                if conn.poll(0.1):
                    conn.recv_bytes()
                    conn.send_bytes(b"")
            if b.is_alive():
                print(f"{os.path.basename(sys.argv[0])}: error: remote actor {a} did not take its stop in 30 s",
                      file=sys.stderr, flush=True)
                os._exit(1)  # torchrun stops the remote actors
        dist.barrier()
        dist.destroy_process_group()
    return exit_code


if __name__ == "__main__":
    sys.exit(main(tyro.cli(Args)))

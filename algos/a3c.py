# docs: docs/a3c.md | paper: https://arxiv.org/abs/1602.01783
"""A3C: Asynchronous Advantage Actor-Critic (Mnih et al., 2016).

Worker processes share one model and one optimizer state in shared memory. Each worker copies the shared
parameters, rolls out t_max steps on its own envs, computes n-step returns and the actor-critic gradient, and
applies it to the shared parameters without any lock (Hogwild). One node by nature (many: IMPALA, DD-PPO).

  python algos/a3c.py                                  # one worker per CPU this process may use, CartPole-v1
  python algos/a3c.py --num-workers 1                  # the reproducible reference (bitwise repeatable)

The file reads top to bottom down to main(); below the "infrastructure" line are the flags, checks, the
workers' health checks, checkpoints, signals and logging that keep a run alive, none of it A3C.
"""

import contextlib
import ctypes
import json
import math
import os
import queue
import signal
import sys
import time
import warnings
from collections import deque
from dataclasses import asdict, dataclass, field, fields
from typing import Literal, Optional

import envpool
import gymnasium as gym
import imageio
import numpy as np
import torch
import torch.multiprocessing as mp
import torch.nn as nn
import tyro
from torch.utils.tensorboard import SummaryWriter


@dataclass
class Args:
    """The algorithm's and the environment's flags; the infrastructure's (checkpoints, timeouts, threads,
    logging) are in `Infra`, below the fold, and the command line takes both."""

    # --- experiment and environment ---
    seed: int = 1  # seed of the experiment
    env_id: str = "CartPole-v1"  # the envpool environment id
    total_timesteps: int = 200_000  # total environment steps over all workers (the shared counter)
    # --- algorithm ---
    t_max: int = 5  # steps per rollout segment before each update (paper: 5)
    num_envs: int = 8  # environments stepped by each worker (the paper: 1)
    gamma: float = 0.98  # discount factor (paper: 0.99; see docs/a3c.md, Deviations)
    optimizer: Literal["rmsprop", "adam"] = "adam"  # shared RMSProp (the paper's) or Adam with shared state
    learning_rate: float = 2e-3  # the optimizer's learning rate
    anneal_lr: bool = True  # anneal the learning rate linearly to zero over total_timesteps (as in the paper)
    rmsprop_alpha: float = 0.99  # shared RMSProp's decay alpha (paper: 0.99)
    rmsprop_eps: float = 1e-5  # shared RMSProp's epsilon, inside the square root (paper: not stated; see docs)
    adam_eps: float = 1e-5  # Adam's epsilon
    ent_coef: float = 0.01  # entropy bonus beta (paper: 0.01)
    vf_coef: float = 0.5  # value loss coefficient
    max_grad_norm: float = 0.5  # per-worker gradient-norm clip before the shared update (0: off)
    use_lstm: bool = False  # an LSTM core between torso and heads (the paper's A3C LSTM)
    # --- distributed ---
    num_workers: int = 0  # Hogwild worker processes (0: the CPUs this process may use, at most 4; see docs)
    # --- computed at run time ---
    world_size: int = field(default=1, init=False)
    rank: int = field(default=0, init=False)
    local_rank: int = field(default=0, init=False)
    run_name: str = field(default="", init=False)


# `--preset atari`: the values of the page's Pong-v5 run (docs/a3c.md, Results); flags given beside it still apply
PRESETS = {
    "atari": dict(
        env_id="Pong-v5",
        total_timesteps=10_000_000,
        num_envs=8,
        optimizer="adam",
        learning_rate=2.5e-4,
        gamma=0.99,
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


def env_seed(args: Args, worker: int, segment: int) -> int:
    """Seed of env 0 of `worker` in run segment `segment` (0, then one more per resume): distinct
    for every env."""
    return args.seed + (segment * args.num_workers + worker) * args.num_envs


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


class Agent(nn.Module):
    """Actor-critic: 64-64 tanh MLP heads (vectors) or a Nature-CNN torso with linear heads
    (images), an optional LSTM core; softmax policy (Discrete) or Gaussian with state-independent
    log-std (Box). Inputs have a time axis."""

    def __init__(self, obs_shape, action_space, use_lstm: bool = False):
        super().__init__()
        self.image = len(obs_shape) == 3
        self.continuous = isinstance(action_space, gym.spaces.Box)
        n_out = int(np.prod(action_space.shape)) if self.continuous else int(action_space.n)
        if self.image:
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
            self.torso = nn.Identity()
            width = int(np.prod(obs_shape))
        self.core = nn.LSTMCell(width, 256 if self.image else 64) if use_lstm else None
        width = self.core.hidden_size if use_lstm else width
        if self.image:
            self.actor = layer_init(nn.Linear(width, n_out), 0.01)
            self.critic = layer_init(nn.Linear(width, 1), 1.0)
        else:
            self.actor = mlp(width, n_out, 0.01)
            self.critic = mlp(width, 1, 1.0)
        if self.continuous:
            self.actor_logstd = nn.Parameter(torch.zeros(n_out))

    def initial_state(self, n: int) -> torch.Tensor:
        """The zero LSTM state (h, c) as [2, n, width]; empty without an LSTM."""
        return torch.zeros(2, n, self.core.hidden_size if self.core is not None else 0)

    def forward(self, obs: torch.Tensor, valid: torch.Tensor, state: torch.Tensor):
        """obs [T, N, ...], valid [T, N] (0 on envpool's reset steps: the LSTM state restarts from
        zero there), state [2, N, H] -> policy outputs [T, N, A], values [T, N], state after the
        last step."""
        T, N = obs.shape[:2]
        x = obs.reshape((T * N,) + obs.shape[2:]).float()
        h = self.torso(scale_frames(x) if self.image else x)
        if self.core is not None:
            h = h.view(T, N, -1)
            hx = state[0]
            cx = state[1]
            outs = []
            for t in range(T):
                hx, cx = self.core(h[t], (hx, cx))
                outs.append(hx)
                # after a reset step the next episode starts from the zero state
                keep = valid[t].unsqueeze(-1)
                hx = hx * keep
                cx = cx * keep
            h = torch.stack(outs).view(T * N, -1)
            state = torch.stack([hx, cx])
        return self.actor(h).view(T, N, -1), self.critic(h).view(T, N), state

    def logprob_entropy(self, out: torch.Tensor, actions: torch.Tensor):
        """log pi(a|s) and the entropy H(pi(.|s)) for policy outputs out [..., A] and actions."""
        if self.continuous:
            std = self.actor_logstd.exp()
            logp = (-0.5 * ((actions - out) / std) ** 2 - std.log() - 0.5 * math.log(2 * math.pi)).sum(-1)
            entropy = (0.5 + 0.5 * math.log(2 * math.pi) + self.actor_logstd).sum().expand(out.shape[:-1])
            return logp, entropy
        logp_all = torch.log_softmax(out, dim=-1)
        return logp_all.gather(-1, actions.unsqueeze(-1)).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)


# ----------------------------------------------------------------------------------------------- algorithm
def nstep_returns(rewards, values, bootstrap, terms, dones, gamma: float):
    """The paper's n-step returns over a [T, N] segment, R_t = r_t + gamma R_{t+1}, R_T = V(s_T) =
    bootstrap. A termination stops the bootstrap; a truncation bootstraps from envpool's final
    observation (values[t + 1], or bootstrap)."""
    T = rewards.shape[0]
    returns = torch.zeros_like(rewards)
    R = bootstrap
    for t in reversed(range(T)):
        v_next = bootstrap if t == T - 1 else values[t + 1]
        # an episode ended at t: do not reach into the next one
        R_next = dones[t] * v_next + (1.0 - dones[t]) * R
        R = rewards[t] + gamma * (1.0 - terms[t]) * R_next
        returns[t] = R
    return returns


def a3c_loss(agent: Agent, seg: dict, returns, args: Args):
    """Policy gradient with advantage R_t - V(s_t), squared-error value loss, entropy bonus; means
    over valid steps."""
    out, values, _ = agent(seg["obs"], seg["valid"], seg["state"])
    logp, entropy = agent.logprob_entropy(out, seg["actions"])
    valid = seg["valid"]
    n = valid.sum().clamp(min=1.0)
    advantages = (returns - values).detach()
    pg_loss = -(logp * advantages * valid).sum() / n
    v_loss = 0.5 * (((returns - values) ** 2) * valid).sum() / n
    ent = (entropy * valid).sum() / n
    loss = pg_loss + args.vf_coef * v_loss - args.ent_coef * ent
    return loss, torch.stack([pg_loss, v_loss, ent]).detach()


class SharedRMSprop(torch.optim.Optimizer):
    """The paper's shared RMSProp (Section 4): g <- alpha g + (1 - alpha) dtheta^2; theta <- theta -
    lr dtheta / sqrt(g + eps), with eps inside the square root (torch.optim.RMSprop: sqrt(g) + eps).
    Its state g is created here so that share_memory() moves it to shared memory before the workers
    fork; every worker's step() then updates the one g in place, without a lock (Hogwild)."""

    def __init__(self, params, lr: float, alpha: float = 0.99, eps: float = 1e-5):
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps))
        for group in self.param_groups:
            for theta in group["params"]:
                self.state[theta]["square_avg"] = torch.zeros_like(theta)

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            for theta in group["params"]:
                g = self.state[theta]["square_avg"]
                d_theta = theta.grad
                g.mul_(group["alpha"]).addcmul_(d_theta, d_theta, value=1 - group["alpha"])
                theta.sub_(group["lr"] * d_theta / (g + group["eps"]).sqrt())


class SharedAdam(torch.optim.Adam):
    """torch's Adam with its state (step count, moments) created here, so that share_memory()
    moves it to shared memory before the workers fork; every worker's step() then updates the one
    state in place, without a lock (Hogwild), the step count too. One worker alone:
    torch.optim.Adam exactly."""

    def __init__(self, params, lr: float, eps: float = 1e-5):
        super().__init__(params, lr=lr, eps=eps)
        for group in self.param_groups:
            for theta in group["params"]:
                self.state[theta]["step"] = torch.tensor(0.0)
                self.state[theta]["exp_avg"] = torch.zeros_like(theta)
                self.state[theta]["exp_avg_sq"] = torch.zeros_like(theta)


def share_memory(flat: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
    """Move the parameters and the optimizer state to shared memory, in place: after restore()
    (load_state_dict replaces the state tensors) and before the workers fork, which then read and
    write these very tensors."""
    flat.share_memory_()
    for state in optimizer.state.values():
        for value in state.values():
            value.share_memory_()


def count(counter, steps: int):
    """Add steps and one update to the shared [env steps, updates] (the paper's global counter T, and
    the updates) under its lock (exact); return the new values."""
    with counter.get_lock():
        counter[0] += steps
        counter[1] += 1
        return counter[0], counter[1]


def flatten_parameters(net: nn.Module) -> torch.Tensor:
    """Make every parameter a view of one flat vector and every gradient a view of `flat.grad`
    (backward adds into them in place), so that sharing, copying, the clip and the optimizer each
    act on one tensor."""
    params = list(net.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    flat.grad = torch.zeros_like(flat)
    offset = 0
    for p in params:
        p.data = flat[offset : offset + p.numel()].view_as(p)
        p.grad = flat.grad[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    return flat


def make_optimizer(args: Args, flat: torch.Tensor) -> torch.optim.Optimizer:
    """The paper's shared RMSProp or Adam with shared state, on the flat parameter vector."""
    if args.optimizer == "rmsprop":
        return SharedRMSprop([flat], args.learning_rate, args.rmsprop_alpha, args.rmsprop_eps)
    return SharedAdam([flat], args.learning_rate, args.adam_eps)


# ----------------------------------------------------------------------------------------------- roles
def new_segment(args: Args, spec, first_obs: torch.Tensor, agent: Agent) -> dict:
    """The buffers of one rollout segment, [t_max, num_envs] each (the LSTM state at its start is
    added later)."""
    shape = (args.t_max, args.num_envs)
    action_dtype = torch.float32 if agent.continuous else torch.long
    return {
        "obs": torch.zeros(shape + spec.observation_space.shape, dtype=first_obs.dtype),
        "valid": torch.zeros(shape),
        "actions": torch.zeros(shape + spec.action_space.shape, dtype=action_dtype),
        "rewards": torch.zeros(shape),
        "terms": torch.zeros(shape),
        "dones": torch.zeros(shape),
        "values": torch.zeros(shape),
    }


def rollout(index: int, agent: Agent, envs, seg: dict, live: dict, episodes: dict, generator, messages) -> None:
    """t_max steps of the worker's envs with its local copy, no gradient, into `seg`; `live` carries
    the observation, its valid mask and the LSTM state over from segment to segment. Finished
    episodes go to the parent (Atari: raw rewards and the real game over); the reset step after an
    episode end adds nothing."""
    seg["state"] = live["state"].clone()
    for t in range(seg["rewards"].shape[0]):
        seg["obs"][t] = live["obs"]
        seg["valid"][t] = live["valid"]
        with torch.no_grad():
            out, value, live["state"] = agent(live["obs"].unsqueeze(0), live["valid"].unsqueeze(0), live["state"])
            # sampled with the worker's own seeded generator
            if agent.continuous:
                noise = torch.randn(out[0].shape, generator=generator)
                action = out[0] + agent.actor_logstd.exp() * noise
            else:
                action = torch.multinomial(torch.softmax(out[0], -1), 1, generator=generator).squeeze(-1)
        seg["actions"][t] = action
        seg["values"][t] = value[0]
        if agent.continuous:
            env_action = np.clip(action.numpy(), envs.action_space.low, envs.action_space.high)
        else:
            env_action = action.numpy()
        obs, reward, terminated, truncated, info = envs.step(env_action)
        done = terminated | truncated
        live["obs"] = torch.as_tensor(obs)
        live["valid"] = torch.as_tensor(~done, dtype=torch.float32)
        seg["rewards"][t] = torch.as_tensor(reward)
        seg["terms"][t] = torch.as_tensor(terminated)
        seg["dones"][t] = torch.as_tensor(done)
        counted = ~episodes["reset_step"]
        episodes["return"] += info.get("reward", reward) * counted
        episodes["length"] += counted
        ended = (info["terminated"].astype(bool) | truncated) if "terminated" in info else done
        for env in np.flatnonzero(ended):
            messages.put(("episode", index, (float(episodes["return"][env]), int(episodes["length"][env]))))
        episodes["return"][ended] = 0.0
        episodes["length"][ended] = 0
        episodes["reset_step"] = done


class WorkerLink:
    """What the parent and its workers share besides the model and the optimizer state: the counter of [env steps,
    updates] (exact under concurrency: it has a lock), `halt` (the parent tells the workers to stop), `go` (the
    workers start stepping), the bounded queue of the workers' small tuples ("ready" | "episode" | "stats" |
    "exit", worker, payload) and the parent's pid."""

    def __init__(self, global_step: int, update: int):
        self.counter = mp.Array("q", [global_step, update])
        self.halt = mp.Value("b", 0, lock=False)
        self.go = mp.Event()
        self.messages = mp.get_context("fork").Queue(maxsize=10_000)
        self.parent = os.getpid()


def learning_rate(args: Args, global_step: int) -> float:
    """Annealed linearly to zero over total_timesteps (as in the paper), or constant."""
    if args.anneal_lr:
        return args.learning_rate * max(0.0, 1.0 - global_step / args.total_timesteps)
    return args.learning_rate


def worker_loop(index: int, args: Args, spec, flat, optimizer, link: WorkerLink, segment: int):
    """One Hogwild worker: copy the shared parameters, roll out t_max steps, compute the gradient on
    the local copy, apply it to the shared parameters with the shared optimizer, without a lock.
    Says "ready" once its envs and network are built and waits for the go; sends episodes and, every
    0.5 s, its statistics; "exit" last. `segment`: the run segment (0, then one more per resume), which
    seeds its envs and sampling."""
    # die with the parent, whatever kills it; signals are the parent's to handle (it turns them into a stop)
    tie_to_parent(link.parent)
    torch.set_num_threads(args.torch_threads)
    seed = env_seed(args, index, segment)
    envs = make_env(args.env_id, args.num_envs, seed)
    generator = torch.Generator().manual_seed(seed)
    agent = Agent(spec.observation_space.shape, spec.action_space, args.use_lstm)
    local_flat = flatten_parameters(agent)
    # the shared optimizer steps the shared parameters with this worker's gradient, which backward fills
    flat.grad = local_flat.grad
    live = {
        "obs": torch.as_tensor(envs.reset()[0]),
        "valid": torch.ones(args.num_envs),
        "state": agent.initial_state(args.num_envs),
    }
    episodes = {
        "return": np.zeros(args.num_envs),
        "length": np.zeros(args.num_envs),
        "reset_step": np.zeros(args.num_envs, dtype=bool),
    }
    seg = new_segment(args, spec, live["obs"], agent)
    link.messages.put(("ready", index, None))
    link.go.wait()
    # its statistics for the parent, sent every 0.5 s (below the fold)
    report = WorkerReport(link.messages, index)
    global_step = link.counter[0]
    # each worker ends after the update that reaches total_timesteps
    while not link.halt.value and global_step < args.total_timesteps:
        # COLLECT: the paper's "synchronize thread-specific parameters theta' = theta", then t_max steps
        local_flat.copy_(flat)
        rollout(index, agent, envs, seg, live, episodes, generator, link.messages)
        # LEARN: n-step returns, the gradient on the local copy, the shared optimizer's step (no lock)
        with torch.no_grad():
            bootstrap = agent(live["obs"].unsqueeze(0), live["valid"].unsqueeze(0), live["state"])[1][0]
        returns = nstep_returns(seg["rewards"], seg["values"], bootstrap, seg["terms"], seg["dones"], args.gamma)
        optimizer.zero_grad(set_to_none=False)
        loss, losses = a3c_loss(agent, seg, returns, args)
        loss.backward()
        if args.max_grad_norm:
            torch.nn.utils.clip_grad_norm_([local_flat], args.max_grad_norm)
        global_step, _ = count(link.counter, args.t_max * args.num_envs)
        lr = learning_rate(args, global_step)
        optimizer.param_groups[0]["lr"] = lr
        optimizer.step()
        # BOOKKEEPING: this worker's statistics for the parent (its losses, learning rate and speed), every 0.5 s
        report.update(losses, lr, args.t_max * args.num_envs)
    envs.close()
    link.messages.put(("exit", index, None))


def start_workers(args: Args, spec, flat, optimizer, link: WorkerLink, segment: int) -> list:
    """Fork the workers (after the shared state, the signal handlers and the link with its queue exist).
    Returns them."""
    context = mp.get_context("fork")
    workers = []
    for index in range(args.num_workers):
        worker_args = (index, args, spec, flat, optimizer, link, segment)
        workers.append(context.Process(target=worker_loop, args=worker_args, daemon=True))
    # a failed fork or a second Ctrl-C here: the workers already started must not outlive it
    try:
        for worker in workers:
            worker.start()
    except BaseException:
        stop_workers([worker for worker in workers if worker.pid is not None])
        raise
    return workers


def stop_workers(workers: list) -> None:
    """Kill and reap every worker (a no-op for one that ended on its own), with Ctrl-C ignored
    meanwhile: raised here, it would leave a worker running, and the interpreter's exit would wait for it for
    ever (workers ignore the SIGTERM that exit sends them)."""
    previous_handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    for worker in workers:
        worker.kill()
        worker.join()
    signal.signal(signal.SIGINT, previous_handler)


def evaluate(agent: Agent, env_id: str, episodes: int, seed: int, video_dir: Optional[str] = None):
    """Returns of `episodes` episodes of the greedy policy, one env per episode (no bias to short
    episodes). With video_dir, episode 0 is also written there as an MP4."""
    options = dict(episodic_life=False, reward_clip=False) if agent.image else {}
    render_mode = "rgb_array" if video_dir is not None else None
    envs = make_env(env_id, episodes, seed, render_mode=render_mode, **options)
    video = open_video(video_dir) if video_dir is not None else None
    obs, _ = envs.reset()
    returns = np.zeros(episodes)
    done = np.zeros(episodes, dtype=bool)
    state = agent.initial_state(episodes)
    valid = torch.ones(1, episodes)
    while not done.all():
        if video is not None and not done[0]:
            video.append_data(envs.render()[0])
        with torch.no_grad():
            out, _, state = agent(torch.as_tensor(obs).unsqueeze(0), valid, state)
        if agent.continuous:
            action = np.clip(out[0].numpy(), envs.action_space.low, envs.action_space.high)
        else:
            action = out[0].argmax(-1).numpy()
        obs, reward, terminated, truncated, info = envs.step(action)
        returns += info.get("reward", reward) * ~done
        done |= (info["terminated"].astype(bool) if "terminated" in info else terminated) | truncated
        valid = torch.as_tensor(~(terminated | truncated), dtype=torch.float32).unsqueeze(0)
    if video is not None:
        video.close()
    envs.close()
    return returns


# ----------------------------------------------------------------------------------------------- main
def main(args: Args) -> int:
    # stop signals, flag checks, seeds and threads: all below the fold
    run = Run(args)
    args.num_workers = args.num_workers or default_num_workers()
    spec = envpool.make_spec(args.env_id)
    agent = Agent(spec.observation_space.shape, spec.action_space, args.use_lstm)
    flat = flatten_parameters(agent)
    optimizer = make_optimizer(args, flat)
    # fresh progress, or a checkpoint's with --resume (weights and optimizer state loaded in place)
    progress = run.restore(agent, optimizer)

    # The model and the optimizer state in shared memory, updated in place by every worker; the link holds the
    # counter of [env steps, updates], exact under concurrency (it has a lock), and what tells the workers to start
    # and to stop.
    share_memory(flat, optimizer)
    link = WorkerLink(progress["global_step"], progress["update"])
    workers = start_workers(args, spec, flat, optimizer, link, progress["segment"])
    # the workers' health where the parent waits for their messages (deaths, start-up, silence): below the fold
    watch = WorkerWatch(workers, link.messages, args.worker_timeout)
    # whatever ends the loop (an exception too), no worker outlives it; a dead or silent worker ends the run
    with run.workers_running(workers):
        # the writer, then the go once every worker has built its envs and network: training time counts from there
        run.start_training(watch, link)
        while watch.running():
            # COLLECT: what the workers sent (episodes, statistics, "exit"); a dead or silent worker raises WorkerDied
            received = watch.receive()
            # LEARN and PUBLISH: in the workers (worker_loop), which step the shared parameters (Hogwild)
            # BOOKKEEPING: a stop signal halts the workers; clocks, counters, episodes, logs, checkpoints
            run.end_pass(received)
    # the last progress line, then a checkpoint after a stop signal, or the final evaluation and summary.json
    return run.finish()


# ==== infrastructure: flags, checks, workers' health, checkpoints, signals, logging; nothing below is A3C ====
@dataclass
class Infra:
    """The flags that keep a run alive, watched, reproducible and resumable, not what it learns."""

    exp_name: str = "a3c"  # the name of this experiment (part of the run name)
    preset: Optional[Literal[tuple(PRESETS)]] = None  # start from a preset's values (PRESETS, above the fold)
    torch_deterministic: bool = True  # kept for the common block: A3C runs on CPU, whose kernels here are deterministic
    cuda: bool = False  # kept for the common block: Hogwild workers share CPU memory; this flag is ignored
    track: bool = False  # log to Weights & Biases as well as TensorBoard
    wandb_project_name: str = "distrl"  # the wandb project name
    wandb_entity: Optional[str] = None  # the wandb entity (team)
    capture_video: bool = False  # write the first evaluation episode as runs/<run_name>/videos/eval_episode0.mp4
    save_model: bool = False  # write the final weights (state_dict) to runs/<run_name>/model.pt
    eval_episodes: int = 10  # episodes of the final, greedy policy to evaluate at the end
    torch_threads: int = 1  # torch threads per worker
    # write runs/<run_name>/checkpoint.pt every this many shared updates (0: on signals only)
    checkpoint_every: int = 0
    resume: bool = False  # continue from runs/<run_name>/checkpoint.pt when it exists
    worker_timeout: float = 60.0  # seconds a worker may fall silent (stopped, hung; 5x that to start): the job ends


# every flag of the command line, the algorithm's first (in --help too)
@dataclass
class RunArgs(Infra, Args):
    pass


# a checkpoint of another format version ends the run with exit 2 (read_checkpoint)
CHECKPOINT_VERSION = 1


class Run:
    """The infrastructure of one run, as main() uses it: set-up, restore, the workers' end, the go, clocks, the
    bookkeeping of each pass over the workers' messages (the stop request, the shared counter, episodes,
    TensorBoard, progress lines, checkpoints) and the end (the last progress line, a checkpoint after a stop
    signal or the final evaluation and summary.json, closing the writer)."""

    def __init__(self, args: RunArgs):
        # first of all: a signal during start-up ends in a checkpoint (forked processes keep the handlers)
        self.stop = install_stop_handlers()
        # envpool's spaces warn about it
        warnings.filterwarnings("ignore", message=".*precision lowered by casting.*")
        validate(args)
        args.run_name = f"{args.env_id}__{args.exp_name}__{args.seed}"
        self.run_dir = os.path.join("runs", args.run_name)
        self.checkpoint_path = os.path.join(self.run_dir, "checkpoint.pt")
        seed_everything(args)
        keep_freed_memory()
        self.args = args
        self.threshold = envpool.make_spec(args.env_id).reward_threshold
        self.writer = None
        self.exit_code = 0

    def restore(self, agent, optimizer) -> dict:
        """Fresh progress, or the checkpoint's with --resume (the weights and optimizer state loaded in place,
        before share_memory). The run keeps agent and optimizer for its checkpoints and summary."""
        self.agent = agent
        self.optimizer = optimizer
        self.progress = restore(self.args, agent, optimizer, "cpu", self.checkpoint_path)
        return self.progress

    @contextlib.contextmanager
    def workers_running(self, workers: list):
        """Around the training loop: a dead or silent worker (WorkerDied) ends the run with one line and exit code
        1; whatever ends it, every worker is killed and reaped (they ignore the SIGTERM of exit)."""
        try:
            yield
        except WorkerDied as error:
            print(f"{os.path.basename(sys.argv[0])}: error: {error}; stopping", file=sys.stderr, flush=True)
            self.exit_code = 1
        finally:
            stop_workers(workers)

    def start_training(self, watch, link: WorkerLink) -> None:
        """The writer (after the fork: it and wandb start threads), then the go once every worker is ready
        (watch.wait_until_ready); training time counts from the go."""
        self.link = link
        self.writer = open_writer(self.args, self.run_dir, self.progress)
        watch.wait_until_ready()
        # training starts when the workers start stepping
        self.clock = start_clock(self.progress)
        link.go.set()
        self.worker_sps = {}
        self.last_print = 0.0
        self.last_checkpoint = self.progress["update"]

    def end_pass(self, received: list) -> None:
        """One pass's bookkeeping: a stop signal halts the workers; the clocks, the shared counter, the episodes
        and statistics the workers sent, the log and progress line, a checkpoint when due."""
        args = self.args
        progress = self.progress
        if self.stop["signal"]:
            # SIGTERM/SIGUSR1/Ctrl-C: every worker ends its segment and exits
            self.link.halt.value = 1
        self.clock = advance_clock(progress, self.clock)
        read_counter(progress, self.link.counter)
        finished, scalars = sort_messages(received, self.worker_sps)
        record_returns(progress, [episode_return for episode_return, _ in finished], self.threshold)
        if time.time() - self.last_print >= 2.0:
            scalars.update(speed_scalars(progress, self.worker_sps))
        log_update(self.writer, progress, finished, scalars)
        self.last_print = print_progress(progress, args.total_timesteps, self.last_print)
        if args.checkpoint_every and progress["update"] - self.last_checkpoint >= args.checkpoint_every:
            write_checkpoint(self.checkpoint_path, progress, self.agent, self.optimizer, self.link.counter)
            self.last_checkpoint = progress["update"]

    def finish(self) -> int:
        """Once the workers have ended (not after a dead or silent one): the final counts and progress line, then
        a checkpoint after a stop signal, or the final evaluation and summary once the run has reached its steps;
        then the writer and wandb. Returns the exit code."""
        args = self.args
        progress = self.progress
        if self.exit_code == 0:
            # the workers have ended: the final counts and progress line
            self.clock = advance_clock(progress, self.clock)
            read_counter(progress, self.link.counter)
            print_progress(progress, args.total_timesteps, 0.0)
        # a checkpoint; a run that had reached its steps goes on to its summary
        if self.exit_code == 0 and self.stop["signal"]:
            write_checkpoint(self.checkpoint_path, progress, self.agent, self.optimizer, self.link.counter)
            print(
                f"signal received: checkpoint of update {progress['update']} written to {self.checkpoint_path}; "
                "rerun with --resume to continue",
                flush=True,
            )
        if self.exit_code == 0 and progress["global_step"] >= args.total_timesteps:
            write_summary(args, self.agent, self.writer, progress, self.clock, self.run_dir)
        if self.writer is not None:
            self.writer.close()
            if args.track:
                import wandb

                wandb.finish()
        return self.exit_code


# ----------------------------------------------------------------------------------------------- workers' health
class WorkerDied(RuntimeError):
    """A worker process ended with a non-zero exit code: the run ends, naming it."""


# prctl's request to die with the parent process
PR_SET_PDEATHSIG = 1


def tie_to_parent(parent: int) -> None:
    """A worker process dies with its parent, whatever kills the parent (PR_SET_PDEATHSIG), and exits at once if
    the parent died before it asked; the stop signals are the parent's to handle (it turns them into a stop)."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    # the parent died before the line above
    if os.getppid() != parent:
        os._exit(1)
    for signal_number in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(signal_number, signal.SIG_IGN)


def receive(messages, workers: list) -> list:
    """Up to 256 messages, waiting at most 0.2 s for the first; then the workers are checked: a dead
    one raises WorkerDied (a death is seen within a pass, whatever the queue holds)."""
    received = []
    try:
        received.append(messages.get(timeout=0.2))
        while len(received) < 256:
            received.append(messages.get_nowait())
    except queue.Empty:
        pass
    for index, worker in enumerate(workers):
        if worker.exitcode:
            raise WorkerDied(f"worker {index} (pid {worker.pid}) exited with code {worker.exitcode}")
    return received


# the times --worker-timeout a worker may take to build its envs and network before it says "ready"
STARTUP_GRACE = 5


def wait_until_ready(messages, workers: list, timeout: float) -> None:
    """Until every worker has built its envs and network: "ready" is all a worker sends before the
    go. One not ready within STARTUP_GRACE times the timeout (stopped or hung: its process lives on)
    raises WorkerDied. As in WorkerWatch.watch_silence, a pause of the parent's own over half the timeout (the
    whole job suspended, say) starts the count again."""
    ready = set()
    started = time.monotonic()
    looked = started
    grace = STARTUP_GRACE * timeout
    while len(ready) < len(workers):
        ready.update(index for _, index, _ in receive(messages, workers))
        now = time.monotonic()
        if now - looked > timeout / 2:
            started = now
        looked = now
        if len(ready) < len(workers) and now - started > grace:
            index = min(set(range(len(workers))) - ready)
            why = f"not started after {grace:g} s, {STARTUP_GRACE} x --worker-timeout (stopped or hung)"
            raise WorkerDied(f"worker {index} (pid {workers[index].pid}) {why}")


class WorkerWatch:
    """The parent's look at its workers where it waits for their messages: one that exited with a non-zero code,
    one not ready within the start-up grace, or one silent for the timeout before its "exit" (stopped or hung: its
    process lives on, so its exit code cannot show it) raises WorkerDied."""

    def __init__(self, workers: list, messages, timeout: float):
        self.workers = workers
        self.messages = messages
        self.timeout = timeout
        # the workers that said "exit"
        self.exited = set()
        self.last_heard = []

    def wait_until_ready(self) -> None:
        """Until every worker has built its envs and network (wait_until_ready); silence counts from then."""
        wait_until_ready(self.messages, self.workers, self.timeout)
        # one entry per worker, and one more: when the parent last looked
        self.last_heard = [time.monotonic()] * (len(self.workers) + 1)

    def receive(self) -> list:
        """The next messages (receive), with a look at the workers: a dead or silent one raises WorkerDied. Notes
        the workers that said "exit"."""
        received = receive(self.messages, self.workers)
        self.watch_silence(received)
        self.exited.update(index for kind, index, _ in received if kind == "exit")
        return received

    def watch_silence(self, received: list) -> None:
        """Notes when each worker was last heard from (it sends its statistics every 0.5 s); one silent
        for the timeout before its "exit" (stopped or hung: its process lives on, so its exit code
        cannot show it) raises WorkerDied. last_heard ends with when this was last called: after a pause of
        the parent's own over half the timeout (the whole job suspended, say), the count starts again."""
        last_heard = self.last_heard
        now = time.monotonic()
        if now - last_heard[-1] > self.timeout / 2:
            last_heard[:] = [now] * len(last_heard)
        last_heard[-1] = now
        for _, index, _ in received:
            last_heard[index] = now
        for index, worker in enumerate(self.workers):
            if index not in self.exited and now - last_heard[index] > self.timeout:
                raise WorkerDied(f"worker {index} (pid {worker.pid}) silent for {self.timeout:g} s (stopped or hung)")

    def running(self) -> bool:
        """Until every worker said "exit" (no message is left unread) and ended with code 0 (a death is
        always seen)."""
        return len(self.exited) < len(self.workers) or any(worker.exitcode != 0 for worker in self.workers)


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
        "total_timesteps",
        "t_max",
        "num_envs",
        "eval_episodes",
        "learning_rate",
        "rmsprop_eps",
        "adam_eps",
        "torch_threads",
    ]
    for name in positive:
        if getattr(args, name) <= 0:
            fail(name, f"must be positive, got {getattr(args, name)}")
    # a pause of the parent's own over half the timeout (the whole job suspended) restarts the silence count, and
    # it looks at its workers every 0.2 s: a shorter timeout might never fire
    if args.worker_timeout < 2:
        fail("worker_timeout", f"must be at least 2 s, got {args.worker_timeout}")
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
    env_family = envpool.registration.registry.specs[args.env_id][0]
    if args.capture_video and env_family not in ("envpool.atari", "envpool.classic_control"):
        # envpool renders MuJoCo through a GPU context: without one, its render() ends the process
        fail("capture_video", f"'{args.env_id}' is not Atari or classic control, the envs recorded here")
    spec = envpool.make_spec(args.env_id)
    obs_space = spec.observation_space
    action_space = spec.action_space
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) not in (1, 3):
        fail("env_id", f"'{args.env_id}' has observation space {obs_space}; A3C here needs a flat or image Box")
    if not isinstance(action_space, (gym.spaces.Discrete, gym.spaces.Box)) or len(action_space.shape) > 1:
        fail("env_id", f"'{args.env_id}' has action space {action_space}; A3C here needs Discrete or 1-D Box")


# ----------------------------------------------------------------------------------------------- bookkeeping
def process_start_time() -> float:
    """When this process started (Linux /proc), so that startup_s also counts the imports."""
    with open("/proc/self/stat") as stat:
        start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as uptime:
        uptime_s = float(uptime.read().split()[0])
    return time.time() - uptime_s + start_ticks / os.sysconf("SC_CLK_TCK")


def new_progress(config: dict) -> dict:
    """Everything a resumed run continues from; every time in it is a whole-run figure (docs/conventions.md §1a).
    The file adds `segment`: the run segment (0, then one more per resume), which seeds the workers' envs."""
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
        "segment": 0,
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
    """TensorBoard points of one iteration: its finished episodes, then the named scalars."""
    step = progress["global_step"]
    for episode_return, episode_length in finished:
        writer.add_scalar("charts/episodic_return", episode_return, step)
        writer.add_scalar("charts/episodic_length", episode_length, step)
    for key, value in scalars.items():
        writer.add_scalar(key, value, step)


def sort_messages(received: list, worker_sps: dict) -> tuple:
    """The finished episodes (return, length) of one pass and the scalars (losses, learning rate) of
    the last statistics a worker sent; notes each worker's own steps per second ("exit"s: WorkerWatch)."""
    finished = []
    scalars = {}
    for kind, index, payload in received:
        if kind == "episode":
            finished.append(payload)
        elif kind == "stats":
            scalars, worker_sps[index] = payload
    return finished, scalars


def read_counter(progress: dict, counter) -> None:
    """The shared [env steps, updates] into progress, read without the lock (which a killed worker
    may hold), so the pair may be one update apart; a checkpoint reads it under the lock
    (write_checkpoint)."""
    values = counter.get_obj()
    progress["global_step"] = values[0]
    progress["update"] = values[1]


def speed_scalars(progress: dict, worker_sps: dict) -> dict:
    """Environment steps per second over all workers (whole run) and each worker's own (its steps,
    its time)."""
    sps = progress["global_step"] / max(progress["train_time_s"], 1e-9)
    return {"charts/SPS": sps, **{f"stats/worker{index}_sps": value for index, value in worker_sps.items()}}


def print_progress(progress: dict, total_timesteps: int, last_print: float) -> float:
    """A progress line at most every 2 s; returns when one was last printed. The workers run to total_timesteps (no
    fixed number of updates), so the line counts steps; run.finish prints the last line once the workers have ended."""
    now = time.time()
    if now - last_print < 2.0:
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


class WorkerReport:
    """A worker's statistics for the parent (its last losses and learning rate, its own steps per second), sent
    every 0.5 s: also its sign of life (WorkerWatch)."""

    def __init__(self, messages, index: int):
        self.messages = messages
        self.index = index
        self.started = time.time()
        self.steps_done = 0
        self.last_sent = 0.0

    def update(self, losses: torch.Tensor, lr: float, steps: int) -> None:
        """One update of `steps` env steps: its statistics go to the parent when 0.5 s have passed."""
        self.steps_done += steps
        if time.time() - self.last_sent > 0.5:
            self.last_sent = time.time()
            policy_loss, value_loss, entropy = losses.tolist()
            scalars = {
                "losses/policy_loss": policy_loss,
                "losses/value_loss": value_loss,
                "losses/entropy": entropy,
                "charts/learning_rate": lr,
            }
            speed = self.steps_done / (self.last_sent - self.started)
            self.messages.put(("stats", self.index, (scalars, speed)))


# ----------------------------------------------------------------------------------------------- checkpoints
def save_checkpoint(path: str, payload: dict) -> None:
    """Atomic: write a temporary file beside the target, then rename it over the target."""
    payload = {**payload, "algo": "a3c", "version": CHECKPOINT_VERSION}
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
    if written_by not in (None, "a3c"):
        fail("resume", f"{checkpoint_path} was written by {written_by}.py, not a3c.py; use another --exp-name")
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
            f"{checkpoint_path} lacks {', '.join(missing)}: not a checkpoint of a3c.py; use another --exp-name",
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


def write_checkpoint(path: str, progress: dict, agent: Agent, optimizer, counter) -> None:
    """The shared tensors as they are (Hogwild: workers may be writing them), with the counter pair
    read under its lock, so that steps and updates agree."""
    progress["global_step"], progress["update"] = counter[:]
    save_checkpoint(path, {**progress, "model": agent.state_dict(), "optimizer": optimizer.state_dict()})


def run_config(args: RunArgs) -> dict:
    """The flags that define the run, which a resumed run must share with its checkpoint: the algorithm's
    (`Args`) but the budget, which may grow, and the number of workers, which a requeued job may change with
    the machine; none of `Infra`'s (how the run is kept alive, watched or saved). Values derived from the flags
    (init=False) follow from them."""
    may_change = {"total_timesteps", "num_workers"}
    return {flag.name: getattr(args, flag.name) for flag in fields(Args) if flag.init and flag.name not in may_change}


def restore(args: RunArgs, model, optimizer, device, checkpoint_path: str) -> dict:
    """A fresh progress dict, or with --resume and a checkpoint, the checkpoint's, with the model and the optimizer
    loaded in place (before share_memory); a resumed run is the next run segment."""
    progress = new_progress(run_config(args))
    if not (args.resume and os.path.exists(checkpoint_path)):
        return progress
    checkpoint = read_checkpoint(checkpoint_path, progress)
    try:
        model.load_state_dict(checkpoint.pop("model"))
        optimizer.load_state_dict(checkpoint.pop("optimizer"))
    except (KeyError, RuntimeError, ValueError, TypeError, AttributeError) as error:
        refuse_checkpoint(checkpoint_path, error)
    recent_returns = checkpoint.pop("recent_returns")
    progress.update(checkpoint)
    progress["recent_returns"].extend(recent_returns)
    progress["segment"] += 1
    return progress


# ----------------------------------------------------------------------------------------------- signals and output
def install_stop_handlers() -> dict:
    """SIGTERM and SIGUSR1 (SLURM preemption) ask for a checkpoint once the workers end their segment;
    so does Ctrl-C's SIGINT here, which reaches the workers too (they ignore it: the parent turns it
    into the stop). A second Ctrl-C ends the run at once (KeyboardInterrupt, no checkpoint)."""
    stop = {"signal": 0}

    def ask_to_stop(signum, frame):
        stop["signal"] = signum
        # a second Ctrl-C ends the run at once
        signal.signal(signal.SIGINT, signal.default_int_handler)

    for signal_number in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(signal_number, ask_to_stop)
    return stop


def open_writer(args: RunArgs, run_dir: str, progress: dict) -> SummaryWriter:
    """TensorBoard (and wandb with --track), after the fork: both start threads. After a resume,
    points past the checkpoint's step are dropped."""
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


def write_summary(args: RunArgs, agent: Agent, writer, progress: dict, clock: float, run_dir: str) -> None:
    """The final evaluation, runs/<run_name>/summary.json (whole-run figures) and, with --save-model, the weights."""
    video_dir = os.path.join(run_dir, "videos") if args.capture_video else None
    eval_returns = evaluate(agent, args.env_id, args.eval_episodes, args.seed + 10**6, video_dir)
    for episode, episode_return in enumerate(eval_returns):
        writer.add_scalar("eval/episodic_return", episode_return, episode)
    # the evaluation counts in wall time only
    advance_clock(progress, clock, training=False)
    recent = progress["recent_returns"]
    summary = {
        "algo": "a3c",
        "env_id": args.env_id,
        "seed": args.seed,
        "world_size": 1,
        "num_workers": args.num_workers,
        "global_step": progress["global_step"],
        "updates": progress["update"],
        "wall_time_s": progress["wall_time_s"],
        "startup_s": progress["startup_s"],
        "train_time_s": progress["train_time_s"],
        "sps": progress["global_step"] / progress["train_time_s"],
        "eval_return_mean": float(np.mean(eval_returns)),
        "eval_return_std": float(np.std(eval_returns)),
        "train_return_last20": float(np.mean(recent)) if recent else None,
        "time_to_threshold_s": progress["time_to_threshold_s"],
        # the same figure (time to threshold counts from training start); the key is kept for older readers
        "threshold_step": progress["threshold_step"],
        "reward_threshold": envpool.make_spec(args.env_id).reward_threshold,
    }
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    if args.save_model:
        # a copy of each: the parameters are views of one shared vector
        weights = {key: value.clone() for key, value in agent.state_dict().items()}
        torch.save(weights, os.path.join(run_dir, "model.pt"))
    print(
        f"eval return {summary['eval_return_mean']:.1f} +- {summary['eval_return_std']:.1f}; "
        f"time to threshold: {summary['time_to_threshold_s']}; summary in {run_dir}/summary.json",
        flush=True,
    )


# ----------------------------------------------------------------------------------------------- processes
def default_num_workers() -> int:
    """The CPUs this process may use (its affinity mask, which taskset, SLURM and containers set),
    at most 4: with 8 or 16 Hogwild workers the default learning rate made CartPole runs collapse on
    a 16-core machine (docs)."""
    return max(1, min(4, len(os.sched_getaffinity(0))))


def seed_everything(args: RunArgs) -> None:
    """The parent's threads and seed (its network's initial weights); each worker sets its own threads and seeds
    its envs and sampling (worker_loop)."""
    torch.set_num_threads(args.torch_threads)
    torch.manual_seed(args.seed)


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

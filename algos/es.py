# docs: docs/es.md | paper: https://arxiv.org/abs/1703.03864
"""ES: Evolution Strategies as a scalable alternative to reinforcement learning (Salimans et al., 2017).

Each generation perturbs the policy parameters theta with mirrored Gaussian noise taken from a noise table
that every worker builds from the same seed, runs one episode per perturbation, and moves theta along the
rank-weighted sum of the noise. Workers exchange only noise indices, returns, lengths and observation
statistics (a few kilobytes), never parameters or gradients: every worker applies the same update to its
own copy of theta.

  python algos/es.py                                         # one worker, CartPole-v1
  python algos/es.py --num-workers 2                         # two worker processes on this machine
  torchrun --standalone --nproc_per_node=2 algos/es.py       # the same under torchrun (or across nodes)

The file reads top to bottom down to main(); below the "infrastructure" line are the flags, checks,
checkpoints, signals, worker processes and logging that keep a run alive, none of it ES.
"""

import ctypes
import functools
import hashlib
import importlib
import json
import math
import os
import signal
import socket
import sys
import time
import warnings
from collections import deque
from dataclasses import asdict, dataclass, field, fields
from datetime import timedelta
from typing import Optional, Tuple

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
import tyro
from torch.utils.tensorboard import SummaryWriter


@dataclass
class Args:
    """The algorithm's and the environment's flags; the infrastructure's (checkpoints, processes, logging) are
    in `Infra`, below the fold, and the command line takes both."""

    # --- experiment and environment ---
    seed: int = 1  # seed of the experiment (initial weights, noise table, noise indices, env seeds)
    env_id: str = "CartPole-v1"  # the envpool environment id (vector observations: classic control, MuJoCo)
    total_timesteps: int = 300_000  # environment steps over all workers (ends after the generation that exceeds it)
    # --- algorithm ---
    population_size: int = 48  # perturbations per generation (antithetic: half as many noise vectors, each +/-)
    sigma: float = 0.1  # noise standard deviation sigma
    learning_rate: float = 0.05  # Adam's stepsize
    l2_coeff: float = 0.005  # weight decay: l2_coeff * theta joins the negated gradient before Adam (paper: 0.005)
    noise_table_size: int = 2**24  # floats in the shared noise table (64 MiB; the paper used 250M)
    obs_norm: bool = True  # normalize observations with running statistics aggregated over all workers
    obs_clip: float = 5.0  # clip normalized observations to [-obs_clip, obs_clip]
    episode_cap: int = 0  # cap on episode length in steps (0: the environment's own limit)
    adaptive_cap: bool = False  # cap episodes at twice the previous generation's mean length (paper's adaptive mode)
    hidden_sizes: Tuple[int, ...] = (64, 64)  # hidden layer widths of the tanh MLP policy
    # --- computed at run time ---
    world_size: int = field(default=1, init=False)
    rank: int = field(default=0, init=False)
    local_rank: int = field(default=0, init=False)
    run_name: str = field(default="", init=False)


# ----------------------------------------------------------------------------------------------- environment
def make_env(env_id: str, num_envs: int, seed: int, num_threads: int = 1, **kwargs):
    """An envpool batch. Env i of the batch is seeded with seed + i."""
    return envpool.make(
        env_id,
        env_type="gymnasium",
        num_envs=num_envs,
        seed=seed,
        num_threads=num_threads,
        thread_affinity_offset=-1,
        **kwargs,
    )


def open_video(video_dir: str):
    """An MP4 writer for evaluation episode 0: envpool renders the frames and imageio-ffmpeg's own binary
    encodes them as they come, so no episode is held in memory."""
    os.makedirs(video_dir, exist_ok=True)
    return imageio.get_writer(os.path.join(video_dir, "eval_episode0.mp4"), fps=30, macro_block_size=1)


def env_seed(args: Args, generation: int, member: int) -> int:
    """Seed of the episode of population member `member` (global index) in `generation`: never tied
    to the worker that runs it, so a run's results do not depend on the number of workers."""
    return args.seed + generation * args.population_size + member


# ----------------------------------------------------------------------------------------------- networks
class Policy:
    """Deterministic tanh MLP held as one flat parameter vector, so that perturbations are slices of
    the noise table. `forward` evaluates P parameter vectors on P observations at once (one batched
    matmul per layer): the whole population's step is one call. Discrete actions: argmax; Box
    actions: the output, clipped."""

    def __init__(self, obs_dim: int, action_space, hidden_sizes=(64, 64)):
        self.continuous = isinstance(action_space, gym.spaces.Box)
        n_out = int(np.prod(action_space.shape)) if self.continuous else int(action_space.n)
        sizes = [obs_dim, *hidden_sizes, n_out]
        self.shapes = [(sizes[i + 1], sizes[i]) for i in range(len(sizes) - 1)]
        self.num_params = sum(o * i + o for o, i in self.shapes)
        if self.continuous:
            self.low = torch.as_tensor(action_space.low, dtype=torch.float32)
            self.high = torch.as_tensor(action_space.high, dtype=torch.float32)

    def init_params(self, generator) -> torch.Tensor:
        """Rows of each weight matrix drawn from N(0, I) and scaled to norm 1 (0.01 for the output
        layer), as in the paper's code; zero biases."""
        chunks = []
        for k, (o, i) in enumerate(self.shapes):
            w = torch.randn(o, i, generator=generator)
            w *= (0.01 if k == len(self.shapes) - 1 else 1.0) / w.norm(dim=1, keepdim=True)
            chunks += [w.reshape(-1), torch.zeros(o)]
        return torch.cat(chunks)

    def forward(self, params: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """params [P, num_params], obs [P, obs_dim] -> outputs [P, n_out]."""
        h = obs.unsqueeze(-1)
        offset = 0
        for k, (o, i) in enumerate(self.shapes):
            w = params[:, offset : offset + o * i].view(-1, o, i)
            b = params[:, offset + o * i : offset + o * i + o].unsqueeze(-1)
            offset += o * i + o
            h = torch.baddbmm(b, w, h)
            if k < len(self.shapes) - 1:
                h = torch.tanh(h)
        return h.squeeze(-1)

    def act(self, params: torch.Tensor, obs: torch.Tensor) -> np.ndarray:
        out = self.forward(params, obs)
        if self.continuous:
            return torch.maximum(torch.minimum(out, self.high), self.low).numpy()
        return out.argmax(-1).numpy()


# ----------------------------------------------------------------------------------------------- algorithm
def noise_table(seed: int, size: int) -> torch.Tensor:
    """The shared noise table: `size` standard normal float32 numbers from a generator seeded with
    `seed`. Every worker builds the same table; a perturbation is an offset into it (its slice of
    num_params numbers)."""
    return torch.randn(size, generator=torch.Generator().manual_seed(seed))


def sample_noise_indices(seed: int, generation: int, num_pairs: int, table_size: int, dim: int):
    """Offsets of the generation's noise vectors, from (seed, generation) alone: the same in every
    worker."""
    rng = np.random.default_rng([seed, generation])
    return rng.integers(0, table_size - dim + 1, size=num_pairs)


def centered_ranks(x: np.ndarray) -> np.ndarray:
    """Fitness shaping: replace each value by its rank over the whole array (0 for the smallest),
    scaled to [-0.5, 0.5]. Tied values share their average rank, so a constant fitness gives
    all-zero weights."""
    flat = x.ravel()
    # one value is a constant fitness too (its rank over size - 1 would be 0 / 0)
    if flat.size == 1:
        return np.zeros(x.shape)
    # a value's tied group spans [left, right) in sorted order; its mean rank is the middle
    ordered = np.sort(flat)
    ranks = (np.searchsorted(ordered, flat, "left") + np.searchsorted(ordered, flat, "right") - 1) / 2.0
    return (ranks / (flat.size - 1) - 0.5).reshape(x.shape)


def es_gradient(noise: torch.Tensor, indices, weights: np.ndarray, dim: int) -> torch.Tensor:
    """g = 1/N sum_i w_i eps_i with eps_i = noise[indices[i]:indices[i] + dim], N = 2 * len(indices)
    perturbations and w_i = shaped(+eps_i) - shaped(-eps_i) (the antithetic pair). Accumulated one
    pair at a time in index order, so the result does not depend on how many threads or workers
    there are."""
    g = torch.zeros(dim, dtype=torch.float32)
    for i, w in zip(indices, weights, strict=True):
        g.add_(noise[int(i) : int(i) + dim], alpha=float(w))
    return g / (2 * len(indices))


def es_update(theta: torch.Tensor, optimizer, noise, indices, returns: np.ndarray, args) -> float:
    """One ES step from the population's returns [num_pairs, 2] (+eps, -eps): centered ranks over
    all 2n returns, the gradient estimate g, then Adam on theta descending -g + l2_coeff * theta
    (ascent on g with weight decay). No 1/sigma: Adam ignores the scale. Updates theta in place;
    returns |g|."""
    shaped = centered_ranks(returns)
    g = es_gradient(noise, indices, shaped[:, 0] - shaped[:, 1], theta.numel())
    theta.grad = -g + args.l2_coeff * theta
    optimizer.step()
    return float(g.norm())


def obs_mean_std(obstat: torch.Tensor, dim: int):
    """Running observation statistics [sum, sum of squares, count] -> mean, std, as float32. The
    variance is floored at 1e-4 (std >= 0.01); OpenAI's ES starter floors it at 1e-2 (see
    docs/es.md)."""
    mean = obstat[:dim] / obstat[-1]
    var = obstat[dim : 2 * dim] / obstat[-1] - mean**2
    return mean.float(), var.clamp(min=1e-4).sqrt().float()


# ----------------------------------------------------------------------------------------------- roles
def rollout_population(
    policy: Policy,
    params: torch.Tensor,
    env_id: str,
    seed: int,
    normalizer,
    cap: int,
    num_threads: int = 1,
    video_dir: Optional[str] = None,
):
    """One episode per row of params [P, num_params], all P at once: one envpool batch (env i seeded
    seed + i), one batched forward pass per step. `normalizer` is (mean, std, clip) for the
    observations. Returns returns [P], lengths [P] and per-episode observation statistics
    [P, 2 * obs_dim + 1] (sum, sum of squares, count), elementwise so that each row depends only on
    its own episode."""
    mean, std, clip = normalizer
    num_episodes = params.shape[0]
    render_mode = "rgb_array" if video_dir is not None else None
    envs = make_env(env_id, num_episodes, seed, num_threads, render_mode=render_mode)
    video = open_video(video_dir) if video_dir is not None else None
    obs, _ = envs.reset()
    obs_dim = obs.shape[1]
    alive = np.ones(num_episodes, dtype=bool)
    returns = np.zeros(num_episodes)
    lengths = np.zeros(num_episodes, dtype=np.int64)
    stats = torch.zeros(num_episodes, 2 * obs_dim + 1, dtype=torch.float64)
    for _ in range(cap):
        if video is not None and alive[0]:
            video.append_data(envs.render()[0])
        obs_tensor = torch.as_tensor(obs)
        live = torch.as_tensor(alive, dtype=torch.float64).unsqueeze(-1)
        obs64 = obs_tensor.double() * live
        stats[:, :obs_dim] += obs64
        stats[:, obs_dim : 2 * obs_dim] += obs64 * obs64
        stats[:, -1:] += live
        normalized = ((obs_tensor.float() - mean) / std).clamp(-clip, clip)
        with torch.no_grad():
            action = policy.act(params, normalized)
        # step only the envs whose episode goes on (envpool steps a subset by id)
        ids = np.flatnonzero(alive)
        next_obs, reward, terminated, truncated, info = envs.step(action[ids], ids)
        obs[info["env_id"]] = next_obs
        returns[info["env_id"]] += reward
        lengths[ids] += 1
        alive[info["env_id"]] = ~(terminated | truncated)
        if not alive.any():
            break
    if video is not None:
        video.close()
    envs.close()
    return returns, lengths, stats


# Columns of the table the workers all-gather, one row per antithetic pair: global pair index, noise-table index,
# the returns and lengths of its two episodes (theta + sigma eps, theta - sigma eps), and their observation
# statistics summed (sum, sum of squares, count per feature). Besides them only the stop request (below the fold)
# and, on --resume, the checkpoint cross between workers.
PAIR = 0
NOISE = 1
RETURNS = slice(2, 4)
LENGTHS = slice(4, 6)
OBSTAT = slice(6, None)


def normalizer(args: Args, obstat: torch.Tensor, obs_dim: int) -> tuple:
    """(mean, std, clip) for rollout_population: the running statistics, or none without
    --obs-norm."""
    if not args.obs_norm:
        return torch.zeros(obs_dim), torch.ones(obs_dim), args.obs_clip
    mean, std = obs_mean_std(obstat, obs_dim)
    return mean, std, args.obs_clip


def gathered_bytes(num_pairs: int, world: int, obs_dim: int) -> int:
    """What run_episodes' all_gather hands every worker: blocks of float64 rows (PAIR .. OBSTAT)
    padded alike."""
    return world * math.ceil(num_pairs / world) * (6 + 2 * obs_dim + 1) * 8


def run_episodes(args: Args, policy: Policy, theta, noise, indices, obstat, seed: int, cap: int):
    """The generation's episodes, split over the workers in contiguous blocks of antithetic pairs
    (pair j: episodes 2j and 2j + 1, theta + sigma eps_j and theta - sigma eps_j, env seeds
    seed + 2j and seed + 2j + 1). Only the rows (PAIR .. OBSTAT) travel (all_gather); every worker
    gets the rows of all pairs, in pair order."""
    num_pairs = len(indices)
    dim = theta.numel()
    obs_dim = (obstat.numel() - 1) // 2
    pairs_per_worker = math.ceil(num_pairs / args.world_size)
    first = min(args.rank * pairs_per_worker, num_pairs)
    end = min((args.rank + 1) * pairs_per_worker, num_pairs)
    # padding rows keep PAIR -1
    rows = torch.full((pairs_per_worker, 6 + 2 * obs_dim + 1), -1.0, dtype=torch.float64)
    # a worker may get no pair (more workers than pairs); envpool refuses an empty batch
    if end > first:
        # The statistics as of the start of the generation: every worker has exactly these (this generation's
        # own observations are merged after the gather), so all members are evaluated with the same normalization.
        norm = normalizer(args, obstat, obs_dim)
        eps = torch.stack([noise[int(i) : int(i) + dim] for i in indices[first:end]])
        pairs = torch.stack([theta + args.sigma * eps, theta - args.sigma * eps], 1)
        params = pairs.reshape(-1, dim)
        returns, lengths, stats = rollout_population(
            policy, params, args.env_id, seed + 2 * first, norm, cap, args.env_threads
        )
        mine = rows[: end - first]
        mine[:, PAIR] = torch.arange(first, end)
        mine[:, NOISE] = torch.as_tensor(indices[first:end], dtype=torch.float64)
        mine[:, RETURNS] = torch.as_tensor(returns.reshape(-1, 2))
        mine[:, LENGTHS] = torch.as_tensor(lengths.reshape(-1, 2))
        mine[:, OBSTAT] = stats[0::2] + stats[1::2]
    if args.world_size > 1:
        gathered = [torch.empty_like(rows) for _ in range(args.world_size)]
        dist.all_gather(gathered, rows)
        rows = torch.cat(gathered)
    rows = rows[rows[:, PAIR] >= 0]
    assert torch.equal(rows[:, PAIR], torch.arange(num_pairs, dtype=torch.float64))
    return rows


def evaluate(
    args: Args, policy: Policy, theta: torch.Tensor, obstat: torch.Tensor, video_dir: Optional[str] = None
) -> np.ndarray:
    """The final policy, theta without noise, for eval_episodes episodes (env seeds
    seed + 10**6 + i); with video_dir, episode 0 is also written there as an MP4."""
    obs_dim = (obstat.numel() - 1) // 2
    params = theta.expand(args.eval_episodes, theta.numel())
    max_steps = envpool.make_spec(args.env_id).config.max_episode_steps
    norm = normalizer(args, obstat, obs_dim)
    returns, _, _ = rollout_population(
        policy, params, args.env_id, args.seed + 10**6, norm, max_steps, args.env_threads, video_dir
    )
    return returns


# ----------------------------------------------------------------------------------------------- main
def main(args: Args, stop: Optional[dict] = None) -> int:
    # stop: the stop-signal dict a forked worker inherits from its launcher (None otherwise)
    # stop signals, flag checks, then the worker processes or torchrun's group, threads: all below the fold
    run = Run(args, stop)
    if run.forks_workers:
        # without torchrun: fork the --num-workers worker processes (each runs main()) and wait for them
        return spawn_workers(args, run.stop)
    spec = envpool.make_spec(args.env_id)
    max_steps = spec.config.max_episode_steps
    obs_dim = spec.observation_space.shape[0]
    policy = Policy(obs_dim, spec.action_space, args.hidden_sizes)
    dim = policy.num_params
    num_pairs = args.population_size // 2
    # its own stream, apart from the weights' (seed)
    noise = noise_table(args.seed + 2**32, args.noise_table_size)
    theta = policy.init_params(torch.Generator().manual_seed(args.seed))
    optimizer = torch.optim.Adam([theta], lr=args.learning_rate, eps=1e-8)
    # observation statistics [sum, sum of squares, count], as OpenAI's starter begins them
    obstat = torch.cat([torch.zeros(obs_dim), torch.full((obs_dim,), 1e-2), torch.tensor([1e-2])])
    obstat = obstat.double()
    cap = args.episode_cap or max_steps
    # fresh progress, or a checkpoint's with --resume (theta, Adam's state and obstat loaded in place; rank 0
    # reads it and broadcasts it, so every worker's copy of theta stays the same)
    progress = run.restore(policy, theta, optimizer, obstat, cap)
    run.start_training()
    while progress["global_step"] < args.total_timesteps:
        # COLLECT: one episode for each of theta + sigma eps_i and theta - sigma eps_i, over all workers
        generation = progress["update"]
        indices = sample_noise_indices(args.seed, generation, num_pairs, args.noise_table_size, dim)
        seed = env_seed(args, generation, 0)
        rows = run_episodes(args, policy, theta, noise, indices, obstat, seed, progress["cap"])
        run.lap("rollout")
        # LEARN: the ES gradient estimate and Adam, then the observation statistics and the episode cap
        returns = rows[:, RETURNS].numpy()
        lengths = rows[:, LENGTHS].numpy()
        grad_norm = es_update(theta, optimizer, noise, rows[:, NOISE].long().tolist(), returns, args)
        obstat += rows[:, OBSTAT].sum(0)
        if args.adaptive_cap:
            progress["cap"] = min(max_steps, max(1, int(2 * lengths.mean())))
        run.lap("update")
        # BOOKKEEPING: the counters, clocks, the stop request over all workers (one all-reduce), the population's
        # episodes in global order, logs, checkpoints (rank 0); a stop signal ends the loop after a checkpoint
        progress["update"] += 1
        progress["global_step"] += int(lengths.sum())
        if run.end_generation(returns, lengths, grad_norm):
            break
    # the final evaluation and summary.json (unless a signal stopped the run), then the writer and process group
    run.finish()
    return 0


# ==== infrastructure: flags, checks, checkpoints, signals, processes, logging; nothing below is ES ====
@dataclass
class Infra:
    """The flags that keep a run alive, watched, reproducible and resumable, not what it learns."""

    exp_name: str = "es"  # the name of this experiment (part of the run name)
    torch_deterministic: bool = True  # kept for the common block: runs on CPU, whose kernels here are deterministic
    cuda: bool = False  # kept for the common block: ES evaluates small policies on CPU; this flag is ignored
    track: bool = False  # log to Weights & Biases as well as TensorBoard
    wandb_project_name: str = "distrl"  # the wandb project name
    wandb_entity: Optional[str] = None  # the wandb entity (team)
    capture_video: bool = False  # write the first evaluation episode as runs/<run_name>/videos/eval_episode0.mp4
    save_model: bool = False  # write the final theta and observation statistics to runs/<run_name>/model.pt
    eval_episodes: int = 10  # episodes of the final, unperturbed policy to evaluate at the end
    torch_threads: int = 1  # torch threads per worker (tiny forward pass; 1 keeps results split-independent)
    env_threads: int = 0  # envpool threads per worker (0: this process's CPUs divided among the node's workers)
    num_workers: int = 1  # worker processes to spawn here (without torchrun; under it, each rank is a worker)
    checkpoint_every: int = 0  # write runs/<run_name>/checkpoint.pt every this many generations (0: on signals only)
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
    generation (the stop request over all workers, episodes, TensorBoard, progress lines, checkpoints) and
    the end (the final evaluation, summary.json, closing the writer and the process group)."""

    def __init__(self, args: RunArgs, stop: Optional[dict]):
        # first of all: a SIGTERM/SIGUSR1 during start-up ends in a checkpoint, not in exit 143
        self.stop = install_stop_handlers(stop)
        # envpool's spaces warn about it
        warnings.filterwarnings("ignore", message=".*precision lowered by casting.*")
        validate(args)
        args.run_name = f"{args.env_id}__{args.exp_name}__{args.seed}"
        self.run_dir = os.path.join("runs", args.run_name)
        self.checkpoint_path = os.path.join(self.run_dir, "checkpoint.pt")
        self.args = args
        self.forks_workers = args.num_workers > 1
        if self.forks_workers:
            if args.resume and os.path.exists(self.checkpoint_path):
                # a checkpoint no worker could use is refused here, in one line, before any worker starts
                read_checkpoint(self.checkpoint_path, new_progress(run_config(args), args.episode_cap))
            return
        setup_distributed(args)
        torch.set_num_threads(args.torch_threads)
        args.env_threads = args.env_threads or available_cpus()
        self.threshold = envpool.make_spec(args.env_id).reward_threshold
        self.stopped = False

    def restore(self, policy, theta: torch.Tensor, optimizer, obstat: torch.Tensor, cap: int) -> dict:
        """Fresh progress, or the checkpoint's with --resume (theta, Adam's state and the observation statistics
        loaded in place); opens rank 0's writer. The run keeps what its checkpoints and summary hold."""
        args = self.args
        self.policy = policy
        self.theta = theta
        self.optimizer = optimizer
        self.obstat = obstat
        self.progress = restore(args, theta, optimizer, obstat, self.checkpoint_path, cap)
        self.writer = open_writer(args, self.run_dir, self.progress) if args.rank == 0 else None
        obs_dim = (obstat.numel() - 1) // 2
        self.stats = {
            "bytes_per_generation": gathered_bytes(args.population_size // 2, args.world_size, obs_dim),
            "gradient_bytes": policy.num_params * 4,
        }
        return self.progress

    def start_training(self) -> None:
        """Training time counts from here (start-up is reported on its own)."""
        self.clock = start_clock(self.progress)
        self.lap_start = self.clock
        self.last_print = 0.0

    def lap(self, name: str) -> None:
        """The time since the previous lap (or the start of the generation) as this generation's `name` time."""
        now = time.time()
        self.stats[f"{name}_time_s"] = now - self.lap_start
        self.lap_start = now

    def end_generation(self, returns: np.ndarray, lengths: np.ndarray, grad_norm: float) -> bool:
        """One generation's bookkeeping: the clocks, the stop request and the mean rollout time over all
        workers (one small all-reduce), the population's episodes, rank 0's log and progress line, a
        checkpoint when due or asked for. Returns True when a stop signal reached some worker (checkpoint
        written: the loop ends)."""
        args = self.args
        progress = self.progress
        stats = self.stats
        stats["grad_norm"] = grad_norm
        stats["theta_norm"] = float(self.theta.norm())
        self.clock = advance_clock(progress, self.clock)
        self.stopped, stats["rollout_time_s"] = agree_to_stop(args, self.stop, stats["rollout_time_s"])
        record_returns(progress, returns.reshape(-1).tolist(), self.threshold)
        if args.rank == 0:
            population_means = [(returns.mean(), lengths.mean())]
            scalars = generation_scalars(args, progress, returns, stats)
            log_update(self.writer, progress, population_means, scalars)
            self.last_print = print_progress(progress, args.total_timesteps, self.last_print)
            every = args.checkpoint_every
            if self.stopped or (every and progress["update"] % every == 0):
                checkpoint = {**progress, "model": self.theta, "optimizer": self.optimizer.state_dict()}
                save_checkpoint(self.checkpoint_path, {**checkpoint, "obstat": self.obstat})
        if self.stopped and args.rank == 0:
            # SIGTERM/SIGUSR1 on some worker (SLURM preemption): saved above, exit cleanly
            print(
                f"signal received: checkpoint of generation {progress['update']} written to {self.checkpoint_path}; "
                "rerun with --resume to continue",
                flush=True,
            )
        self.lap_start = time.time()
        return self.stopped

    def finish(self) -> None:
        """The final evaluation and summary (also after resuming a checkpoint past the budget; not after a stop
        signal), then the writer, wandb and the process group."""
        args = self.args
        if args.rank == 0 and not self.stopped:
            write_summary(
                args,
                self.policy,
                self.theta,
                self.obstat,
                self.writer,
                self.progress,
                self.clock,
                self.run_dir,
                self.stats,
            )
        if self.writer is not None:
            self.writer.close()
            if args.track:
                import wandb

                wandb.finish()
        finish_distributed(args)


# ----------------------------------------------------------------------------------------------- checks
def fail(arg: str, message: str) -> None:
    """Bad argument: one line naming it on stderr, exit code 2 (as argparse does). Every worker checks
    the same arguments and checkpoint, so the first (rank 0) speaks for all."""
    if os.environ.get("RANK", "0") == "0":
        print(f"{os.path.basename(sys.argv[0])}: error: --{arg.replace('_', '-')}: {message}", file=sys.stderr)
    sys.exit(2)


def validate(args: RunArgs) -> None:
    # env seeds add offsets to the seed and must stay 32-bit
    if not 0 <= args.seed < 2**30:
        fail("seed", f"must be in [0, 2**30), got {args.seed}")
    positive = [
        "collective_timeout",
        "total_timesteps",
        "population_size",
        "eval_episodes",
        "num_workers",
        "sigma",
        "learning_rate",
        "noise_table_size",
        "obs_clip",
    ]
    for name in positive:
        if getattr(args, name) <= 0:
            fail(name, f"must be positive, got {getattr(args, name)}")
    for name in ["l2_coeff", "episode_cap", "torch_threads", "env_threads", "checkpoint_every"]:
        if getattr(args, name) < 0:
            fail(name, f"must not be negative, got {getattr(args, name)}")
    if args.population_size % 2:
        fail("population_size", f"must be even (antithetic pairs), got {args.population_size}")
    if any(size <= 0 for size in args.hidden_sizes):
        fail("hidden_sizes", f"must be positive, got {args.hidden_sizes}")
    if args.num_workers > 1 and "WORLD_SIZE" in os.environ:
        fail("num_workers", "under torchrun every rank is a worker; leave --num-workers at 1")
    if args.env_id not in envpool.list_all_envs():
        fail("env_id", f"'{args.env_id}' is not an envpool environment")
    env_family = envpool.registration.registry.specs[args.env_id][0]
    if args.capture_video and env_family not in ("envpool.atari", "envpool.classic_control"):
        # envpool renders MuJoCo through a GPU context: without one, its render() ends the process
        fail("capture_video", f"'{args.env_id}' is not Atari or classic control, the envs recorded here")
    spec = envpool.make_spec(args.env_id)
    obs_space = spec.observation_space
    act_space = spec.action_space
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        fail("env_id", f"'{args.env_id}' has observation space {obs_space}; ES here needs a flat Box")
    if not isinstance(act_space, (gym.spaces.Discrete, gym.spaces.Box)) or len(act_space.shape) > 1:
        fail("env_id", f"'{args.env_id}' has action space {act_space}; ES here needs Discrete or 1-D Box")
    num_params = Policy(obs_space.shape[0], act_space, args.hidden_sizes).num_params
    if args.noise_table_size < num_params:
        fail("noise_table_size", f"{args.noise_table_size} is smaller than the policy ({num_params} parameters)")


# ----------------------------------------------------------------------------------------------- bookkeeping
@functools.cache
def process_start_time() -> float:
    """When this process started (Linux /proc), so that startup_s also counts the imports. Cached:
    spawn_workers reads it before forking, so the workers report the launcher's start, not the fork."""
    with open("/proc/self/stat") as stat:
        start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as uptime:
        uptime_s = float(uptime.read().split()[0])
    return time.time() - uptime_s + start_ticks / os.sysconf("SC_CLK_TCK")


def new_progress(config: dict, cap: int) -> dict:
    """Everything a resumed run continues from; every time in it is a whole-run figure
    (docs/conventions.md §1a). `update` counts generations. ES adds `cap`: the episode-length cap in
    force (--adaptive-cap changes it)."""
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
        "cap": cap,
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
    """TensorBoard points of one iteration: its finished episodes, then the named scalars. ES passes
    one (return, length) per generation, the population's means (docs/conventions.md §6)."""
    step = progress["global_step"]
    for episode_return, episode_length in finished:
        writer.add_scalar("charts/episodic_return", episode_return, step)
        writer.add_scalar("charts/episodic_length", episode_length, step)
    for key, value in scalars.items():
        writer.add_scalar(key, value, step)


def print_progress(progress: dict, total_timesteps: int, last_print: float) -> float:
    """A progress line at most every 2 s (and at the end); returns when one was last printed. The
    loop runs to total_timesteps, so the line counts steps."""
    now = time.time()
    if now - last_print < 2.0 and progress["global_step"] < total_timesteps:
        return last_print
    recent = progress["recent_returns"]
    mean_return = f"{np.mean(recent):.1f}" if recent else "n/a"
    sps = progress["global_step"] / max(progress["train_time_s"], 1e-9)
    print(
        f"generation {progress['update']} global_step={progress['global_step']}/{total_timesteps} SPS={sps:.0f} "
        f"return(last {len(recent)})={mean_return}",
        flush=True,
    )
    return now


# ----------------------------------------------------------------------------------------------- checkpoints
def save_checkpoint(path: str, payload: dict) -> None:
    """Atomic: write a temporary file beside the target, then rename it over the target."""
    payload = {**payload, "algo": "es", "version": CHECKPOINT_VERSION}
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
    if written_by not in (None, "es"):
        fail("resume", f"{checkpoint_path} was written by {written_by}.py, not es.py; use another --exp-name")
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
            f"{checkpoint_path} lacks {', '.join(missing)}: not a checkpoint of es.py; use another --exp-name",
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
    return config


def restore(args: RunArgs, theta: torch.Tensor, optimizer, obstat, checkpoint_path: str, cap: int) -> dict:
    """A fresh progress dict, or with --resume and a checkpoint, the checkpoint's, with theta,
    Adam's state and the observation statistics loaded in place. Rank 0 reads the checkpoint and
    broadcasts it: nodes need no shared filesystem. Episodes and noise follow from (seed,
    generation), so nothing else is needed."""
    progress = new_progress(run_config(args), cap)
    shared = [None]
    if args.resume and args.rank == 0 and os.path.exists(checkpoint_path):
        shared = [read_checkpoint(checkpoint_path, progress)]
    if args.world_size > 1:
        dist.broadcast_object_list(shared, 0)
    checkpoint = shared[0]
    if checkpoint is None:
        return progress
    try:
        theta.copy_(checkpoint.pop("model"))
        optimizer.load_state_dict(checkpoint.pop("optimizer"))
        obstat.copy_(checkpoint.pop("obstat"))
    except (KeyError, RuntimeError, ValueError, TypeError, AttributeError) as error:
        refuse_checkpoint(checkpoint_path, error)
    recent_returns = checkpoint.pop("recent_returns")
    progress.update(checkpoint)
    progress["recent_returns"].extend(recent_returns)
    return progress


# ----------------------------------------------------------------------------------------------- signals and output
def install_stop_handlers(stop: Optional[dict] = None) -> dict:
    """SIGTERM, SIGUSR1 (SLURM preemption) and Ctrl-C's SIGINT ask for a checkpoint at the end of the
    current generation. Installed first thing in main(), and again by a forked worker on the dict it
    inherits, so that a signal during start-up is kept, never fatal (exit 143). A second Ctrl-C ends the
    run at once (KeyboardInterrupt, no checkpoint) in the parent; its workers die with it."""
    # a forked worker, given its parent's dict, keeps asking: a worker forked the moment Ctrl-C came was seen
    # to take that one Ctrl-C twice, and its KeyboardInterrupt then ended the job with exit 1
    forked = stop is not None
    stop = {"signal": 0} if stop is None else stop

    def ask_to_stop(signum, frame):
        stop["signal"] = signum
        # a second Ctrl-C ends the run at once
        if not forked:
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
    # a resumed run drops the points an interrupted run logged past its checkpoint
    purge_step = progress["global_step"] if progress["update"] else None
    writer = SummaryWriter(run_dir, purge_step=purge_step)
    table = "\n".join(f"|{key}|{value}|" for key, value in asdict(args).items())
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + table)
    return writer


def generation_scalars(args: RunArgs, progress: dict, returns: np.ndarray, stats: dict) -> dict:
    """TensorBoard scalars of one generation, after its mean return and length."""
    return {
        "charts/episodic_return_max": returns.max(),
        "charts/SPS": progress["global_step"] / progress["train_time_s"],
        "charts/episode_cap": progress["cap"],
        "charts/learning_rate": args.learning_rate,
        "losses/grad_norm": stats["grad_norm"],
        "losses/theta_norm": stats["theta_norm"],
        "stats/bytes_per_generation": float(stats["bytes_per_generation"]),
        "stats/gradient_bytes": float(stats["gradient_bytes"]),
        "stats/rollout_time_s": stats["rollout_time_s"],
        "stats/update_time_s": stats["update_time_s"],
        "stats/generation": progress["update"],
    }


def write_summary(args, policy, theta, obstat, writer, progress: dict, clock: float, run_dir, stats: dict):
    """The final evaluation, runs/<run_name>/summary.json (whole-run figures) and, with
    --save-model, the weights."""
    video_dir = os.path.join(run_dir, "videos") if args.capture_video else None
    eval_returns = evaluate(args, policy, theta, obstat, video_dir)
    for episode, episode_return in enumerate(eval_returns):
        writer.add_scalar("eval/episodic_return", episode_return, episode)
    # the evaluation counts in wall time only
    advance_clock(progress, clock, training=False)
    recent = progress["recent_returns"]
    summary = {
        "algo": "es",
        "env_id": args.env_id,
        "seed": args.seed,
        "world_size": args.world_size,
        "global_step": progress["global_step"],
        "generations": progress["update"],
        "wall_time_s": progress["wall_time_s"],
        "startup_s": progress["startup_s"],
        "train_time_s": progress["train_time_s"],
        "sps": progress["global_step"] / progress["train_time_s"],
        "episodes_per_s": progress["update"] * args.population_size / progress["train_time_s"],
        "eval_return_mean": float(np.mean(eval_returns)),
        "eval_return_std": float(np.std(eval_returns)),
        "train_return_last20": float(np.mean(recent)) if recent else None,
        "time_to_threshold_s": progress["time_to_threshold_s"],
        "threshold_step": progress["threshold_step"],
        "reward_threshold": envpool.make_spec(args.env_id).reward_threshold,
        "num_params": theta.numel(),
        "bytes_per_generation": stats["bytes_per_generation"],
        "gradient_bytes": stats["gradient_bytes"],
        "theta_sha256": hashlib.sha256(theta.numpy().tobytes()).hexdigest(),
    }
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    if args.save_model:
        torch.save({"theta": theta, "obstat": obstat}, os.path.join(run_dir, "model.pt"))
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


def setup_distributed(args: RunArgs) -> None:
    """torchrun (or spawn_workers) sets RANK/LOCAL_RANK/WORLD_SIZE: join the gloo group. Alone:
    world size 1."""
    args.world_size = int(os.environ.get("WORLD_SIZE", "1"))
    args.rank = int(os.environ.get("RANK", "0"))
    args.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.world_size > 1:
        # torch.optim imports torch._dynamo on first use; imported once the group exists, it keeps references to
        # the group, destroy_process_group then leaves gloo's threads running, and a rank can abort as it exits
        importlib.import_module("torch._dynamo")
        # a stop signal during the rendezvous breaks the store's sockets (a NetworkError, exit 1): hold the
        # stop signals until the group exists, then their handlers run (a checkpoint after the first update)
        stop_signals = {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
        dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=args.collective_timeout))
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stop_signals)


def finish_distributed(args: RunArgs) -> None:
    if args.world_size > 1:
        dist.barrier()
        dist.destroy_process_group()


def worker_entry(index: int, args: RunArgs, num_workers: int, parent: int, stop: dict) -> None:
    # PR_SET_PDEATHSIG: die with the parent, whatever kills it
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    # from the start: a signal while main() sets up still ends in a checkpoint (and one the parent had is kept)
    install_stop_handlers(stop)
    # the parent died before the prctl above
    if os.getppid() != parent:
        os._exit(1)
    os.environ.update(RANK=str(index), LOCAL_RANK=str(index))
    os.environ.update(WORLD_SIZE=str(num_workers), LOCAL_WORLD_SIZE=str(num_workers))
    args.num_workers = 1
    # None: a clean exit with code 0
    sys.exit(main(args, stop) or None)


def forward_signal(stop: dict, workers: list, signum: int, frame=None) -> None:
    """The parent's SIGTERM/SIGUSR1 handler: keep the signal and pass it on to the workers started
    so far."""
    stop["signal"] = signum
    for worker in workers:
        if worker.is_alive():
            os.kill(worker.pid, signum)


def spawn_workers(args: RunArgs, stop: dict) -> int:
    """`--num-workers K` without torchrun: fork K workers that form a gloo group on 127.0.0.1. If
    one dies, the others are terminated and the job exits non-zero naming it. SIGTERM/SIGUSR1 are
    passed on to the workers, also one that came before they existed (kept in `stop`)."""
    # a free port for the group's rendezvous (torch's TCPStore), not a protocol
    with socket.socket() as rendezvous:
        rendezvous.bind(("127.0.0.1", 0))
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(rendezvous.getsockname()[1]))
    workers = []
    for signal_number in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(signal_number, functools.partial(forward_signal, stop, workers))
    # the workers inherit the cached start of this process (a forked process starts at the fork)
    process_start_time()
    context = mp.start_processes(
        worker_entry,
        args=(args, args.num_workers, os.getpid(), stop),
        nprocs=args.num_workers,
        join=False,
        start_method="fork",
    )
    workers.extend(context.processes)
    if stop["signal"]:
        # a stop that came while they were forked: passed on as SIGUSR1, the same request to them. A Ctrl-C's
        # SIGINT would raise KeyboardInterrupt in a worker forked after it: the parent's handler had armed the
        # second Ctrl-C, and the worker inherits that until it installs its own
        forward_signal(stop, workers, signal.SIGUSR1)
    try:
        # grace_period: once one worker failed, the others get 2 s to end, then SIGTERM, 2 s more, then SIGKILL
        # (torch's default waits 30 s for a worker that is stopped, and so cannot act on SIGTERM)
        while not context.join(timeout=1.0, grace_period=2.0):
            pass
    # it died, or raised (then the exception has its traceback)
    except (mp.ProcessExitedException, mp.ProcessRaisedException) as e:
        # exit 2: the workers refused an argument or the checkpoint, and rank 0 said why in one line
        if getattr(e, "exit_code", None) == 2:
            return 2
        print(
            f"{os.path.basename(sys.argv[0])}: error: worker {e.error_index} (pid {getattr(e, 'pid', '?')}): {e}; "
            "the other workers were stopped",
            file=sys.stderr,
        )
        return 1
    return 0


def agree_to_stop(args: RunArgs, stop: dict, rollout_time: float) -> tuple:
    """One all_reduce: whether any worker received SIGTERM/SIGUSR1, and the workers' mean rollout
    time."""
    counters = torch.tensor([float(stop["signal"] != 0), rollout_time], dtype=torch.float64)
    if args.world_size > 1:
        dist.all_reduce(counters)
    return bool(counters[0] > 0), float(counters[1]) / args.world_size


if __name__ == "__main__":
    sys.exit(main(tyro.cli(RunArgs)))

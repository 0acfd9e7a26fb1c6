# docs: docs/ga.md | paper: https://arxiv.org/abs/1712.06567
"""Deep GA: a simple genetic algorithm for deep reinforcement learning (Such et al., 2017).

A population of N policies; each generation the top T are parents, and every child is a parent plus Gaussian
noise (sigma epsilon, epsilon from a noise table every worker builds from the same seed). No crossover. The
elite, the best of a few candidates re-evaluated over extra episodes, survives unchanged. An individual is
stored as its list of seeds (an initialization seed, then one noise offset per generation), which every
worker derives from (seed, generation): workers exchange only episode indices, returns and lengths, and
rebuild parameters themselves, never sending them.

  python algos/ga.py                                         # one worker, CartPole-v1
  python algos/ga.py --num-workers 2                         # two worker processes on this machine
  torchrun --standalone --nproc_per_node=2 algos/ga.py       # the same under torchrun (or across nodes)

The file reads top to bottom down to main(); below the "infrastructure" line are the flags, checks,
checkpoints, signals, worker processes and logging that keep a run alive, none of it the GA.
"""

import ctypes
import functools
import hashlib
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
    seed: int = 1  # seed of the experiment (initialization seeds, noise table, mutations, parent choices, env seeds)
    env_id: str = "CartPole-v1"  # the envpool environment id (vector observations: classic control, MuJoCo)
    total_timesteps: int = 300_000  # environment steps over all workers (ends after the generation that exceeds it)
    # --- algorithm ---
    population_size: int = 64  # N: individuals per generation (the elite plus N - 1 mutants)
    truncation: int = 8  # T: the top T individuals are the parents of the next generation (the elite is one of them)
    sigma: float = 0.05  # mutation power sigma: child = parent + sigma * epsilon
    elite_candidates: int = 10  # elite candidates: the generation's top ones and the previous elite (paper: 10)
    elite_episodes: int = 30  # extra episodes per elite candidate; the best mean is the elite (paper: 30)
    noise_table_size: int = 2**24  # floats in the shared noise table (64 MiB); a mutation seed is an offset into it
    episode_cap: int = 0  # cap on episode length in steps (0: the environment's own limit)
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


def env_seed(args: Args, generation: int, episode: int) -> int:
    """Seed of episode `episode` (global index: mutants first, then the elite candidates' episodes)
    of `generation`: never tied to the worker that runs it, so results do not depend on the number
    of workers."""
    per_generation = args.population_size + args.elite_candidates * args.elite_episodes
    return args.seed + generation * per_generation + episode


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
        """The initialization phi(tau_0) of an individual: rows of each weight matrix drawn from
        N(0, I) (generator seeded with tau_0) and scaled to norm 1 (0.01 for the output layer); zero
        biases."""
        chunks = []
        for k, (o, i) in enumerate(self.shapes):
            w = torch.randn(o, i, generator=generator)
            w *= (0.01 if k == len(self.shapes) - 1 else 1.0) / w.norm(dim=1, keepdim=True)
            chunks += [w.reshape(-1), torch.zeros(o)]
        return torch.cat(chunks)

    def forward(self, params: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """params [P, num_params], obs [P, obs_dim] -> outputs [P, n_out]. A single row is computed
        inside a batch of two (itself twice): baddbmm takes another kernel for a batch of one, whose
        low bits differ, and an individual's result must not depend on how many others share its
        worker's block."""
        if params.shape[0] == 1:
            return self.forward(params.repeat(2, 1), obs.repeat(2, 1))[:1]
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


def mutate(params: torch.Tensor, noise: torch.Tensor, offset: int, sigma: float) -> torch.Tensor:
    """psi(theta, tau) = theta + sigma * epsilon(tau), epsilon(tau) the noise table's slice at
    offset tau."""
    return params + sigma * noise[offset : offset + params.numel()]


def params_from_seeds(policy: Policy, noise: torch.Tensor, seeds, sigma: float) -> torch.Tensor:
    """Decode the compact encoding [tau_0, tau_1, ..., tau_g]: initialize from tau_0, then apply the
    mutations in order. Workers use it only for individuals whose parent is not cached (at start and
    after a resume)."""
    params = policy.init_params(torch.Generator().manual_seed(int(seeds[0])))
    for offset in seeds[1:]:
        params = mutate(params, noise, int(offset), sigma)
    return params


def make_generation(parents: list, seed: int, generation: int, population: int, table_size: int, dim: int) -> list:
    """The seed lists of a generation, from random choices drawn from (seed, generation) alone, so
    every worker makes the same ones. Generation 0: N fresh individuals [tau_0]. Later: N - 1
    mutants, each a parent chosen uniformly among the T parents with one new mutation offset
    appended (the encoding grows by one seed)."""
    rng = np.random.default_rng([seed, generation])
    if generation == 0:
        return [[int(tau)] for tau in rng.integers(0, 2**31, size=population)]
    choice = rng.integers(0, len(parents), size=population - 1)
    offsets = rng.integers(0, table_size - dim + 1, size=population - 1)
    return [parents[k] + [int(o)] for k, o in zip(choice, offsets, strict=True)]


def elite_candidates(individuals: list, fitness: np.ndarray, elite: Optional[list], num: int) -> list:
    """The candidates for the elite: the previous elite (if any) first, then the best of the
    generation by fitness (descending; ties by index), num in all."""
    order = np.argsort(-fitness, kind="stable")
    best = [individuals[i] for i in order[: num - (elite is not None)]]
    return ([elite] if elite is not None else []) + best


def next_parents(individuals: list, fitness: np.ndarray, elite: list, truncation: int) -> list:
    """Truncation selection: the elite, then the best of the generation other than the elite, T in
    all."""
    order = np.argsort(-fitness, kind="stable")
    return [elite] + [individuals[i] for i in order if individuals[i] != elite][: truncation - 1]


def ga_update(progress: dict, individuals: list, fitness, candidates: list, candidate_returns, args: Args) -> int:
    """One GA step from the generation's returns and the candidates' E episodes each (episode j:
    candidate j // E): the elite is the candidate with the best mean (ties: the first, so a previous
    elite that ties keeps its place), then truncation selection of the next parents. Updates
    progress; returns the elite's index."""
    scores = candidate_returns.reshape(len(candidates), args.elite_episodes).mean(1)
    best = int(np.argmax(scores))
    progress["elite"] = candidates[best]
    progress["elite_score"] = float(scores[best])
    progress["parents"] = next_parents(individuals, fitness, progress["elite"], args.truncation)
    return best


# ----------------------------------------------------------------------------------------------- roles
def rollout_population(
    policy: Policy,
    params: torch.Tensor,
    env_id: str,
    seed: int,
    cap: int,
    num_threads: int = 1,
    video_dir: Optional[str] = None,
):
    """One episode per row of params [P, num_params], all P at once: one envpool batch (env i seeded
    seed + i), one batched forward pass per step. Returns returns [P] and lengths [P]."""
    num_episodes = params.shape[0]
    render_mode = "rgb_array" if video_dir is not None else None
    envs = make_env(env_id, num_episodes, seed, num_threads, render_mode=render_mode)
    video = open_video(video_dir) if video_dir is not None else None
    obs, _ = envs.reset()
    alive = np.ones(num_episodes, dtype=bool)
    returns = np.zeros(num_episodes)
    lengths = np.zeros(num_episodes, dtype=np.int64)
    for _ in range(cap):
        if video is not None and alive[0]:
            video.append_data(envs.render()[0])
        with torch.no_grad():
            action = policy.act(params, torch.as_tensor(obs, dtype=torch.float32))
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
    return returns, lengths


def params_of(seeds: list, cache: dict, policy: Policy, noise: torch.Tensor, sigma: float) -> torch.Tensor:
    """An individual's parameters: cached (a parent), one mutation of a cached parent, or decoded in
    full."""
    if tuple(seeds) in cache:
        return cache[tuple(seeds)]
    if tuple(seeds[:-1]) in cache:
        return mutate(cache[tuple(seeds[:-1])], noise, int(seeds[-1]), sigma)
    return params_from_seeds(policy, noise, seeds, sigma)


def cache_parents(parents: list, cache: dict, policy: Policy, noise: torch.Tensor, sigma: float) -> dict:
    """The parents' parameters by seed list, built from the previous generation's cache (one
    mutation each)."""
    return {tuple(parent): params_of(parent, cache, policy, noise, sigma) for parent in parents}


def gathered_bytes(count: int, world: int) -> int:
    """What run_episodes' all_gather hands every worker for `count` episodes: blocks of float64 rows
    padded alike."""
    return world * math.ceil(count / world) * 3 * 8


def run_episodes(args: Args, policy: Policy, noise, cache: dict, individuals: list, seed: int, cap: int):
    """Episodes 0..count-1 of a phase (episode j: the parameters of individuals[j], env seed
    seed + j), split over the workers in contiguous blocks. Only (index, return, length) rows travel
    (all_gather); every worker gets the returns and lengths of all episodes, in index order."""
    count = len(individuals)
    episodes_per_worker = math.ceil(count / args.world_size)
    first = min(args.rank * episodes_per_worker, count)
    end = min((args.rank + 1) * episodes_per_worker, count)
    # padding rows keep index -1
    rows = torch.full((episodes_per_worker, 3), -1.0, dtype=torch.float64)
    # a worker may get no episode (more workers than episodes); envpool refuses an empty batch
    if end > first:
        block = [params_of(individuals[j], cache, policy, noise, args.sigma) for j in range(first, end)]
        returns, lengths = rollout_population(
            policy, torch.stack(block), args.env_id, seed + first, cap, args.env_threads
        )
        rows[: end - first, 0] = torch.arange(first, end, dtype=torch.float64)
        rows[: end - first, 1] = torch.as_tensor(returns)
        rows[: end - first, 2] = torch.as_tensor(lengths, dtype=torch.float64)
    if args.world_size > 1:
        gathered = [torch.empty_like(rows) for _ in range(args.world_size)]
        dist.all_gather(gathered, rows)
        rows = torch.cat(gathered)
    rows = rows[rows[:, 0] >= 0]
    assert torch.equal(rows[:, 0], torch.arange(count, dtype=torch.float64))
    return rows[:, 1].numpy(), rows[:, 2].numpy().astype(np.int64)


def evaluate(args: Args, policy: Policy, theta: torch.Tensor, video_dir: Optional[str] = None) -> np.ndarray:
    """The final elite for eval_episodes episodes (env seeds seed + 10**6 + i); with video_dir, episode 0
    is also written there as an MP4."""
    params = theta.expand(args.eval_episodes, theta.numel())
    max_steps = envpool.make_spec(args.env_id).config.max_episode_steps
    returns, _ = rollout_population(
        policy, params, args.env_id, args.seed + 10**6, max_steps, args.env_threads, video_dir
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
    cap = args.episode_cap or max_steps
    # its own stream, apart from the weights' (seed)
    noise = noise_table(args.seed + 2**32, args.noise_table_size)
    # An individual is its seed list; the parents and the elite (in progress) are all the state there is. `cache`
    # maps the seed lists of the current parents to their parameters, so that building a child is one mutation.
    cache = {}
    # fresh progress, or a checkpoint's with --resume (the parents' and the elite's seed lists; rank 0 reads it
    # and broadcasts it)
    progress = run.restore(policy)
    run.start_training()
    while progress["global_step"] < args.total_timesteps:
        # COLLECT: one episode for each individual (N fresh ones at first, then N - 1 mutants of uniformly chosen
        # parents), then E more for each elite candidate (with the mutants' episode cap, as in Uber's code)
        generation = progress["update"]
        cache = cache_parents(progress["parents"], cache, policy, noise, args.sigma)
        individuals = make_generation(
            progress["parents"], args.seed, generation, args.population_size, args.noise_table_size, dim
        )
        seed = env_seed(args, generation, 0)
        fitness, lengths = run_episodes(args, policy, noise, cache, individuals, seed, cap)
        candidates = elite_candidates(individuals, fitness, progress["elite"], args.elite_candidates)
        candidate_episodes = [candidate for candidate in candidates for _ in range(args.elite_episodes)]
        seed = env_seed(args, generation, args.population_size)
        candidate_returns, candidate_lengths = run_episodes(args, policy, noise, cache, candidate_episodes, seed, cap)
        run.lap("rollout")
        # LEARN: the elite (the candidate with the best mean) and truncation selection of the next parents
        best = ga_update(progress, individuals, fitness, candidates, candidate_returns, args)
        # BOOKKEEPING: the counters, clocks, the stop request over all workers (one all-reduce), the elite's
        # episodes, logs, checkpoints (rank 0); a stop signal ends the loop after a checkpoint
        progress["update"] += 1
        progress["global_step"] += int(lengths.sum() + candidate_lengths.sum())
        # the elite's re-evaluation episodes (the policy the GA returns), not the mutants, which are exploration
        elite_returns = candidate_returns[best * args.elite_episodes : (best + 1) * args.elite_episodes]
        if run.end_generation(fitness, lengths, elite_returns, len(candidate_episodes)):
            break
    # the final evaluation of the elite and summary.json (unless a signal stopped the run), then the writer and
    # process group
    run.finish(params_of(progress["elite"], cache, policy, noise, args.sigma))
    return 0


# ==== infrastructure: flags, checks, checkpoints, signals, processes, logging; nothing below is the GA ====
@dataclass
class Infra:
    """The flags that keep a run alive, watched, reproducible and resumable, not what it learns."""

    exp_name: str = "ga"  # the name of this experiment (part of the run name)
    torch_deterministic: bool = True  # kept for the common block: runs on CPU, whose kernels here are deterministic
    cuda: bool = False  # kept for the common block: the GA evaluates small policies on CPU; this flag is ignored
    track: bool = False  # log to Weights & Biases as well as TensorBoard
    wandb_project_name: str = "distrl"  # the wandb project name
    wandb_entity: Optional[str] = None  # the wandb entity (team)
    capture_video: bool = False  # write the first evaluation episode as runs/<run_name>/videos/eval_episode0.mp4
    save_model: bool = False  # write the elite's parameters and seed list to runs/<run_name>/model.pt
    eval_episodes: int = 10  # episodes of the final elite to evaluate at the end
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
                read_checkpoint(self.checkpoint_path, new_progress(run_config(args)))
            return
        setup_distributed(args)
        torch.set_num_threads(args.torch_threads)
        args.env_threads = args.env_threads or available_cpus()
        self.threshold = envpool.make_spec(args.env_id).reward_threshold
        self.stopped = False

    def restore(self, policy) -> dict:
        """Fresh progress, or the checkpoint's with --resume (the GA's whole state is its seed lists, in
        progress); opens rank 0's writer. The run keeps the policy for its summary."""
        args = self.args
        self.policy = policy
        self.progress = restore(args, self.checkpoint_path)
        self.writer = open_writer(args, self.run_dir, self.progress) if args.rank == 0 else None
        self.stats = {"parameter_bytes": policy.num_params * 4 * args.population_size}
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

    def end_generation(self, fitness: np.ndarray, lengths: np.ndarray, elite_returns, candidate_episodes: int) -> bool:
        """One generation's bookkeeping: the clocks, the stop request and the mean rollout time over all
        workers (one small all-reduce), the elite's episodes, rank 0's log and progress line, a checkpoint when
        due or asked for; `candidate_episodes` counts the elite candidates' episodes (for the bytes
        exchanged). Returns True when a stop signal reached some worker (checkpoint written: the loop ends)."""
        args = self.args
        progress = self.progress
        stats = self.stats
        table_bytes = gathered_bytes(len(fitness), args.world_size)
        stats["bytes_per_generation"] = table_bytes + gathered_bytes(candidate_episodes, args.world_size)
        self.clock = advance_clock(progress, self.clock)
        self.stopped, stats["rollout_time_s"] = agree_to_stop(args, self.stop, stats["rollout_time_s"])
        record_returns(progress, elite_returns.tolist(), self.threshold)
        if args.rank == 0:
            population_means = [(fitness.mean(), lengths.mean())]
            scalars = generation_scalars(args, progress, fitness, stats)
            log_update(self.writer, progress, population_means, scalars)
            self.last_print = print_progress(progress, args.total_timesteps, self.last_print)
            every = args.checkpoint_every
            if self.stopped or (every and progress["update"] % every == 0):
                save_checkpoint(self.checkpoint_path, progress)
        if self.stopped and args.rank == 0:
            # SIGTERM/SIGUSR1 on some worker (SLURM preemption): saved above, exit cleanly
            print(
                f"signal received: checkpoint of generation {progress['update']} written to {self.checkpoint_path}; "
                "rerun with --resume to continue",
                flush=True,
            )
        self.lap_start = time.time()
        return self.stopped

    def finish(self, elite: torch.Tensor) -> None:
        """The final evaluation of the elite's parameters and the summary (also after resuming a checkpoint past
        the budget; not after a stop signal), then the writer, wandb and the process group."""
        args = self.args
        if args.rank == 0 and not self.stopped:
            write_summary(args, self.policy, elite, self.writer, self.progress, self.clock, self.run_dir, self.stats)
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
        "truncation",
        "elite_candidates",
        "elite_episodes",
        "eval_episodes",
        "num_workers",
        "sigma",
        "noise_table_size",
    ]
    for name in positive:
        if getattr(args, name) <= 0:
            fail(name, f"must be positive, got {getattr(args, name)}")
    for name in ["episode_cap", "torch_threads", "env_threads", "checkpoint_every"]:
        if getattr(args, name) < 0:
            fail(name, f"must not be negative, got {getattr(args, name)}")
    mutants = args.population_size - 1
    if args.population_size < 2:
        fail("population_size", f"must be at least 2 (the elite and a mutant), got {args.population_size}")
    if args.truncation > mutants:
        fail("truncation", f"{args.truncation} is more than the population's {mutants} mutants")
    if args.elite_candidates > mutants:
        fail("elite_candidates", f"{args.elite_candidates} is more than the population's {mutants} mutants")
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
        fail("env_id", f"'{args.env_id}' has observation space {obs_space}; the GA here needs a flat Box")
    if not isinstance(act_space, (gym.spaces.Discrete, gym.spaces.Box)) or len(act_space.shape) > 1:
        fail("env_id", f"'{args.env_id}' has action space {act_space}; the GA here needs Discrete or 1-D Box")
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


def new_progress(config: dict) -> dict:
    """Everything a resumed run continues from; every time in it is a whole-run figure
    (docs/conventions.md §1a). `update` counts generations. The GA adds its whole state: the
    parents' and the elite's seed lists (a few hundred bytes, whatever the network's size) and the
    elite's score."""
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
        "parents": [],
        "elite": None,
        "elite_score": None,
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
    """TensorBoard points of one iteration: its finished episodes, then the named scalars. The GA
    passes one (return, length) per generation, the population's means (docs/conventions.md §6)."""
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
        f"return(last {len(recent)})={mean_return} elite={progress['elite_score']:.1f}",
        flush=True,
    )
    return now


# ----------------------------------------------------------------------------------------------- checkpoints
def save_checkpoint(path: str, payload: dict) -> None:
    """Atomic: write a temporary file beside the target, then rename it over the target."""
    payload = {**payload, "algo": "ga", "version": CHECKPOINT_VERSION}
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
    if written_by not in (None, "ga"):
        fail("resume", f"{checkpoint_path} was written by {written_by}.py, not ga.py; use another --exp-name")
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
            f"{checkpoint_path} lacks {', '.join(missing)}: not a checkpoint of ga.py; use another --exp-name",
        )
    recorded = checkpoint["config"]
    changed = {flag: value for flag, value in progress["config"].items() if recorded.get(flag) != value}
    if changed:
        was = ", ".join(
            f"{as_typed(flag, recorded.get(flag))} (now {as_typed(flag, value)})" for flag, value in changed.items()
        )
        fail("resume", f"{checkpoint_path} is of a run with {was}; resume with its settings or use another --exp-name")
    return checkpoint


def run_config(args: RunArgs) -> dict:
    """The flags that define the run, which a resumed run must share with its checkpoint: the algorithm's
    (`Args`) but the budget, which may grow; none of `Infra`'s (how the run is kept alive, watched or
    saved). Values derived from the flags (init=False) follow from them."""
    may_change = {"total_timesteps"}
    config = {flag.name: getattr(args, flag.name) for flag in fields(Args) if flag.init and flag.name not in may_change}
    return config


def restore(args: RunArgs, checkpoint_path: str) -> dict:
    """A fresh progress dict, or with --resume and a checkpoint, the checkpoint's: the GA has no
    model or optimizer apart from the seed lists in progress. Rank 0 reads the checkpoint and
    broadcasts it: nodes need no shared filesystem. Episodes and mutations follow from (seed,
    generation), so nothing else is needed."""
    progress = new_progress(run_config(args))
    shared = [None]
    if args.resume and args.rank == 0 and os.path.exists(checkpoint_path):
        shared = [read_checkpoint(checkpoint_path, progress)]
    if args.world_size > 1:
        dist.broadcast_object_list(shared, 0)
    checkpoint = shared[0]
    if checkpoint is None:
        return progress
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


def generation_scalars(args: RunArgs, progress: dict, fitness: np.ndarray, stats: dict) -> dict:
    """TensorBoard scalars of one generation, after its mean return and length."""
    return {
        "charts/episodic_return_max": fitness.max(),
        "charts/elite_return": progress["elite_score"],
        "charts/parents_return": float(np.sort(fitness)[::-1][: args.truncation].mean()),
        "charts/SPS": progress["global_step"] / progress["train_time_s"],
        "charts/encoding_length": len(progress["elite"]),
        "stats/bytes_per_generation": stats["bytes_per_generation"],
        "stats/parameter_bytes": float(stats["parameter_bytes"]),
        "stats/rollout_time_s": stats["rollout_time_s"],
        "stats/generation": progress["update"],
    }


def write_summary(args, policy, theta, writer, progress: dict, clock: float, run_dir, stats: dict):
    """The final evaluation, runs/<run_name>/summary.json (whole-run figures) and, with
    --save-model, the weights."""
    video_dir = os.path.join(run_dir, "videos") if args.capture_video else None
    eval_returns = evaluate(args, policy, theta, video_dir)
    for episode, episode_return in enumerate(eval_returns):
        writer.add_scalar("eval/episodic_return", episode_return, episode)
    # the evaluation counts in wall time only
    advance_clock(progress, clock, training=False)
    recent = progress["recent_returns"]
    # generation 0 has N individuals, every later one N - 1 mutants; each has C * E elite episodes
    elite_episodes = args.elite_candidates * args.elite_episodes
    episodes = progress["update"] * (args.population_size - 1 + elite_episodes) + 1
    summary = {
        "algo": "ga",
        "env_id": args.env_id,
        "seed": args.seed,
        "world_size": args.world_size,
        "global_step": progress["global_step"],
        "generations": progress["update"],
        "wall_time_s": progress["wall_time_s"],
        "startup_s": progress["startup_s"],
        "train_time_s": progress["train_time_s"],
        "sps": progress["global_step"] / progress["train_time_s"],
        "episodes_per_s": episodes / progress["train_time_s"],
        "eval_return_mean": float(np.mean(eval_returns)),
        "eval_return_std": float(np.std(eval_returns)),
        "train_return_last20": float(np.mean(recent)) if recent else None,
        "time_to_threshold_s": progress["time_to_threshold_s"],
        "threshold_step": progress["threshold_step"],
        "reward_threshold": envpool.make_spec(args.env_id).reward_threshold,
        "num_params": theta.numel(),
        "elite_score": progress["elite_score"],
        "elite_seeds": progress["elite"],
        # a generation after the first
        "bytes_per_generation": gathered_bytes(args.population_size - 1, args.world_size)
        + gathered_bytes(elite_episodes, args.world_size),
        "parameter_bytes": stats["parameter_bytes"],
        "theta_sha256": hashlib.sha256(theta.numpy().tobytes()).hexdigest(),
    }
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    if args.save_model:
        torch.save({"theta": theta, "seeds": progress["elite"]}, os.path.join(run_dir, "model.pt"))
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

# docs: docs/fedpg.md | paper: https://arxiv.org/abs/2110.14074
"""Federated policy gradient: FedAvg (McMahan et al., 2017), FedPG-BR (Fan et al., 2021) and robust
baselines.

Each round the server (rank 0) sends theta to the K clients; each samples trajectories in its own
environments and sends back only a model update, never an observation, action or reward. The server
aggregates them: a sample-weighted average (fedavg), a coordinate-wise median or trimmed mean, or
FedPG-BR's Byzantine filter followed by its variance-reduced (SCSG) inner loop on trajectories of
its own. `--num-byzantine M` clients send corrupt updates.

  python algos/fedpg.py                                                 # 10 clients (fedavg), CartPole-v1
  python algos/fedpg.py --aggregator fedpg-br --num-byzantine 3 --attack sign-flip
  torchrun --standalone --nproc_per_node=2 algos/fedpg.py               # the same 10 clients on 2 ranks

The file reads top to bottom down to main(); below the "infrastructure" line are the flags, checks,
checkpoints, signals, worker processes and logging that keep a run alive, none of it federated learning.
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
from typing import Literal, Optional, Tuple

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
    seed: int = 1  # seed of the experiment (initial weights, Byzantine clients, env seeds, action sampling)
    env_id: str = "CartPole-v1"  # the envpool environment id (vector observations: classic control, MuJoCo)
    total_timesteps: int = 1_500_000  # environment steps over all clients and the server (ends after that round)
    # --- algorithm ---
    num_clients: int = 10  # K: clients (agents), each with its own environments
    aggregator: Literal["fedavg", "fedpg-br", "median", "trimmed-mean"] = "fedavg"  # how the server combines updates
    B: int = 16  # trajectories each client samples per local update (FedPG-BR: the batch B of each round)
    b: int = 4  # FedPG-BR: trajectories the server samples per inner (SCSG) step
    local_updates: int = 1  # E: local policy-gradient steps per round (fedavg, median, trimmed-mean; fedpg-br: 1)
    learning_rate: float = 0.0  # eta, every ascent step's size (0: 8 for fedavg/median/trimmed-mean, 2 for fedpg-br)
    anneal_lr: bool = True  # eta_t decays linearly from learning_rate to 0 over total_timesteps
    max_grad_norm: float = 0.1  # every ascent direction is rescaled to at most this norm (0: no clipping)
    gamma: float = 0.999  # discount of the reward-to-go
    sigma: float = 0.06  # FedPG-BR: sigma, the bound on a gradient estimate's deviation that sets the filter's radii
    delta: float = 0.6  # FedPG-BR: delta, the filter's confidence parameter (V = 2 log(2K / delta))
    alpha: float = 0.4  # FedPG-BR: alpha, the assumed upper bound on the fraction of Byzantine clients (< 0.5)
    trim_fraction: float = 0.3  # trimmed-mean: fraction of clients dropped at each end of every coordinate
    num_byzantine: int = 0  # M: Byzantine clients (a seeded choice among the K, logged)
    attack: Literal["sign-flip", "random-noise", "random-action"] = "sign-flip"  # what the Byzantine clients do
    heterogeneity: float = 0.0  # h: client k's CartPole pole is (1 + h (2k / (K - 1) - 1)) times the standard length
    hidden_sizes: Tuple[int, ...] = (16, 16)  # hidden layer widths of the tanh MLP policy (the paper's CartPole net)
    # --- computed at run time ---
    world_size: int = field(default=1, init=False)
    rank: int = field(default=0, init=False)
    local_rank: int = field(default=0, init=False)
    run_name: str = field(default="", init=False)


# ----------------------------------------------------------------------------------------------- environment
def make_env(
    env_id: str,
    num_envs: int,
    seed: int,
    num_threads: int = 1,
    pole_scale: Optional[float] = None,
    render_mode: Optional[str] = None,
):
    """`num_envs` envs: envpool's (env i seeded with seed + i), or (pole_scale given) gymnasium's
    vectorized CartPole with a scaled pole (one generator seeded with seed draws every start state),
    since envpool's classic-control physics is fixed. Both autoreset on the next step."""
    if pole_scale is not None:
        from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv

        envs = CartPoleVectorEnv(num_envs)
        # half the pole's length; the physics reads these two products too
        envs.length *= pole_scale
        envs.polemass_length = envs.masspole * envs.length
        envs.reset = functools.partial(envs.reset, seed=seed)
        return envs
    return envpool.make(
        env_id,
        env_type="gymnasium",
        num_envs=num_envs,
        seed=seed,
        num_threads=num_threads,
        thread_affinity_offset=-1,
        render_mode=render_mode,
    )


def open_video(video_dir: str):
    """An MP4 writer for evaluation episode 0: envpool renders the frames and imageio-ffmpeg's own binary
    encodes them as they come, so no episode is held in memory."""
    os.makedirs(video_dir, exist_ok=True)
    return imageio.get_writer(os.path.join(video_dir, "eval_episode0.mp4"), fps=30, macro_block_size=1)


def pole_scale(args: Args, client: int) -> Optional[float]:
    """Client k's pole-length factor 1 + h (2k / (K - 1) - 1), spread over [1 - h, 1 + h]; None
    without h."""
    if not args.heterogeneity:
        return None
    if args.num_clients == 1:
        return 1.0
    return 1.0 + args.heterogeneity * (2 * client / (args.num_clients - 1) - 1)


def client_env_seed(args: Args, round_: int, local_update: int, client: int) -> int:
    """Seed of client `client`'s B trajectories in local update `local_update` of round `round_`:
    tied to the client, never to the process that hosts it. The server's own trajectories start at
    seed + 10**9."""
    return args.seed + 2 * 10**6 + ((round_ * args.local_updates + local_update) * args.num_clients + client) * args.B


def byzantine_clients(seed: int, K: int, M: int) -> list:
    """The seeded choice of the M Byzantine clients among the K."""
    return sorted(np.random.default_rng([seed, 7]).choice(K, M, replace=False).tolist())


# ----------------------------------------------------------------------------------------------- networks
class Policy:
    """Stochastic tanh MLP on a flat parameter vector theta (what server and clients exchange):
    categorical for Discrete actions, diagonal Gaussian with state-independent log-std (theta's last
    entries) for Box actions."""

    def __init__(self, obs_dim: int, action_space, hidden_sizes=(16, 16)):
        self.continuous = isinstance(action_space, gym.spaces.Box)
        self.n_out = int(np.prod(action_space.shape)) if self.continuous else int(action_space.n)
        sizes = [obs_dim, *hidden_sizes, self.n_out]
        # (out, in) of each layer; theta is the weights and biases of each layer (and the log-std), flat
        self.shapes = [(sizes[i + 1], sizes[i]) for i in range(len(sizes) - 1)]
        self.sizes = [n for o, i in self.shapes for n in (o * i, o)] + ([self.n_out] if self.continuous else [])
        self.num_params = sum(self.sizes)
        if self.continuous:
            self.low = torch.as_tensor(action_space.low, dtype=torch.float32)
            self.high = torch.as_tensor(action_space.high, dtype=torch.float32)

    def init_params(self) -> torch.Tensor:
        """Orthogonal weights (gain sqrt 2; 0.01 for the output layer), zero biases, log-std 0."""
        chunks = []
        for k, (o, i) in enumerate(self.shapes):
            gain = 0.01 if k == len(self.shapes) - 1 else math.sqrt(2)
            w = torch.nn.init.orthogonal_(torch.empty(o, i), gain)
            chunks += [w.reshape(-1), torch.zeros(o)]
        if self.continuous:
            chunks.append(torch.zeros(self.n_out))
        return torch.cat(chunks)

    def forward(self, theta: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """theta [num_params], obs [N, obs_dim] -> logits or Gaussian means [N, n_out]."""
        h = obs
        offset = 0
        for k, (o, i) in enumerate(self.shapes):
            weight = theta[offset : offset + o * i].view(o, i)
            bias = theta[offset + o * i : offset + o * i + o]
            h = torch.nn.functional.linear(h, weight, bias)
            offset += o * i + o
            if k < len(self.shapes) - 1:
                h = torch.tanh(h)
        return h

    def log_prob(self, theta: torch.Tensor, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        out = self.forward(theta, obs)
        if self.continuous:
            std = theta[-self.n_out :].exp().expand_as(out)
            return torch.distributions.Normal(out, std).log_prob(actions).sum(-1)
        return torch.distributions.Categorical(logits=out).log_prob(actions)

    def sample(self, theta: torch.Tensor, obs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        out = self.forward(theta, obs)
        if self.continuous:
            return out + theta[-self.n_out :].exp() * torch.randn(out.shape, generator=generator)
        return torch.multinomial(torch.softmax(out, -1), 1, generator=generator).squeeze(-1)

    def greedy(self, theta: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        out = self.forward(theta, obs)
        return out if self.continuous else out.argmax(-1)


# ----------------------------------------------------------------------------------------------- algorithm
def trajectory_weights(rewards: torch.Tensor, valid: torch.Tensor, gamma: float) -> torch.Tensor:
    """Weights w_t [T, N] of N trajectories: the reward-to-go sum_{h >= t} gamma^(h - t) r_h,
    standardized over its own trajectory's steps (as the authors' code), 0 outside it (valid = 0):
    each depends on its trajectory alone."""
    G = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = rewards[t] * valid[t] + gamma * running * valid[t]
        G[t] = running
    n = valid.sum(0).clamp(min=1)
    mean = (G * valid).sum(0) / n
    std = (((G - mean) ** 2 * valid).sum(0) / n).sqrt()
    return (G - mean) / (std + 1e-8) * valid


def policy_gradient(policy: Policy, theta: torch.Tensor, batch: dict, gamma: float) -> torch.Tensor:
    """The estimate g^ = sum_j sum_t grad log pi_theta(a_t | s_t) w_t / sum_j L_j (ascent
    direction): the mean over the batch's steps, as the authors' code; L_j is trajectory j's
    length."""
    th = theta.detach().requires_grad_()
    m = batch["valid"].bool()
    w = trajectory_weights(batch["rewards"], batch["valid"], gamma)[m]
    objective = (policy.log_prob(th, batch["obs"][m], batch["actions"][m]) * w).sum() / m.sum()
    return torch.autograd.grad(objective, th)[0]


def semi_stochastic_gradient(policy: Policy, theta_0, theta_n, mu, batch: dict, gamma: float):
    """FedPG-BR's inner-loop direction v_n = g^(theta_n) - g^_omega(theta_0) + mu on b trajectories
    sampled with theta_n, with importance weights omega_j = p(tau_j | theta_0) / p(tau_j | theta_n)
    = prod_t pi_theta_0(a_t|s_t) / pi_theta_n(a_t|s_t) (the dynamics cancel). g^ as
    policy_gradient's (a per-step mean); g^_omega weights trajectory j's steps by omega_j, over the
    same sum_j L_j steps (as the authors' code; see docs: not unbiased). Returns v_n, omega."""
    m = batch["valid"].bool()
    w = trajectory_weights(batch["rewards"], batch["valid"], gamma)
    th_n = theta_n.detach().requires_grad_()
    th_0 = theta_0.detach().requires_grad_()
    lp_n = policy.log_prob(th_n, batch["obs"][m], batch["actions"][m])
    lp_0 = policy.log_prob(th_0, batch["obs"][m], batch["actions"][m])
    log_ratio = torch.zeros(m.shape)
    log_ratio[m] = (lp_0 - lp_n).detach()
    omega = log_ratio.sum(0).exp()
    g_n = torch.autograd.grad((lp_n * w[m]).sum() / m.sum(), th_n)[0]
    g_0 = torch.autograd.grad((lp_0 * (omega * w)[m]).sum() / m.sum(), th_0)[0]
    return g_n - g_0 + mu, omega


def filter_pass(mu: torch.Tensor, distances: torch.Tensor, radius: float) -> torch.Tensor:
    """One pass of FedPG-BR's filter with one radius: S = the gradients within `radius` of more than
    K/2 gradients (itself included); mu_mom = the member of S closest to S's mean; the mask of the
    gradients within `radius` of mu_mom (all False if S is empty)."""
    K = mu.shape[0]
    S = ((distances <= radius).sum(1) > K / 2).nonzero().squeeze(1)
    if len(S) == 0:
        return torch.zeros(K, dtype=torch.bool)
    mu_mom = mu[S[(mu[S] - mu[S].mean(0)).norm(dim=1).argmin()]]
    return (mu - mu_mom).norm(dim=1) <= radius


def byzantine_filter(mu: torch.Tensor, B: int, sigma: float, delta: float, alpha: float):
    """FedPG-BR's filter (Algorithm 1) on the K gradients mu [K, D]. R1: the pass with radius T_mu =
    2 sigma sqrt(V / B), V = 2 log(2K / delta); R2: if it keeps fewer than (1 - alpha) K, the pass
    with radius 2 sigma. Returns the kept gradients' mask (G) and whether R2 was used."""
    K = mu.shape[0]
    mu = mu.double()
    T_mu = 2 * sigma * math.sqrt(2 * math.log(2 * K / delta) / B)
    distances = (mu[:, None, :] - mu[None, :, :]).norm(dim=-1)
    G = filter_pass(mu, distances, T_mu)
    if G.sum() < (1 - alpha) * K:
        return filter_pass(mu, distances, 2 * sigma), True
    return G, False


def sample_N_t(rng: np.random.Generator, B: int, b: int) -> int:
    """N_t ~ Geom(B / (B + b)) as in SCSG: P(N_t = n) = (B / (B + b))^n b / (B + b) for n >= 0, mean
    B / b."""
    # numpy's geometric counts trials, from 1
    return int(rng.geometric(b / (B + b))) - 1


def coordinate_median(u: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise median of the rows of u [K, D] (the mean of the two middle values when K is
    even)."""
    s = u.sort(0).values
    K = u.shape[0]
    return s[K // 2] if K % 2 else (s[K // 2 - 1] + s[K // 2]) / 2


def trimmed_mean(u: torch.Tensor, fraction: float) -> torch.Tensor:
    """Coordinate-wise trimmed mean: drop the floor(fraction K) largest and smallest values of every
    coordinate."""
    k = math.floor(fraction * u.shape[0] + 1e-9)
    return u.sort(0).values[k : u.shape[0] - k].mean(0)


def clip_norm(v: torch.Tensor, max_norm: float) -> torch.Tensor:
    """v rescaled to norm max_norm if it is longer (max_norm 0: unchanged): a new vector, exactly at
    max_norm (torch's clip_grad_norm_ works on .grad in place and divides by norm + 1e-6; theta here
    is a plain vector)."""
    n = float(v.norm())
    return v * (max_norm / n) if max_norm and n > max_norm else v


def corrupt(u: torch.Tensor, attack: str, generator: torch.Generator, sizes: list) -> torch.Tensor:
    """What a Byzantine client sends instead of u: sign-flip -2.5 u; random-noise u plus noise
    uniform in +-3 (max - min) of each parameter tensor's own entries (`sizes`: the tensors' lengths
    in u), as the authors' code; random-action changes the sampling, not u."""
    if attack == "sign-flip":
        return -2.5 * u
    if attack == "random-noise":
        noisy = []
        for c in u.split(sizes):
            noisy.append(c + (torch.rand(c.shape, generator=generator) * 2 - 1) * 3 * (c.max() - c.min()))
        return torch.cat(noisy)
    return u


# ----------------------------------------------------------------------------------------------- roles
# What crosses the wire each round: theta down to every client; up from every client one row, its update and META
# numbers (client id, env steps, number and sum of its episodes' returns, for the logs). Never observations,
# actions or per-step rewards.
META = 4


def learning_rate(args: Args, progress: dict) -> float:
    """eta_t: decays linearly to zero over total_timesteps (a round ends past its share), or
    constant."""
    if args.anneal_lr:
        return args.learning_rate * (1 - progress["global_step"] / args.total_timesteps)
    return args.learning_rate


def sample_trajectories(
    policy: Policy, theta, envs, num: int, max_steps: int, generator=None, mode="sample", video=None
):
    """One trajectory from a fresh reset in each of the `num` envs, stepped together (one batched
    forward pass per step) until every first episode has ended; later steps (envpool's reset step,
    the next episode) are masked out (valid = 0). Actions: sampled, greedy, or uniformly random (the
    random-action attack). With a video writer, env 0's frames go to it. Returns obs, actions,
    rewards, valid along time [T, num, ...]."""
    obs, _ = envs.reset()
    alive = np.ones(num, dtype=bool)
    trajectories = {"obs": [], "actions": [], "rewards": [], "valid": []}
    for _ in range(max_steps):
        if video is not None and alive[0]:
            video.append_data(envs.render()[0])
        obs = torch.as_tensor(obs, dtype=torch.float32)
        with torch.no_grad():
            if mode == "random" and policy.continuous:
                uniform = torch.rand((num, policy.n_out), generator=generator)
                actions = policy.low + (policy.high - policy.low) * uniform
            elif mode == "random":
                actions = torch.randint(policy.n_out, (num,), generator=generator)
            elif mode == "sample":
                actions = policy.sample(theta, obs, generator)
            else:
                actions = policy.greedy(theta, obs)
        if policy.continuous:
            env_actions = torch.maximum(torch.minimum(actions, policy.high), policy.low).numpy()
        else:
            env_actions = actions.numpy()
        next_obs, reward, terminated, truncated, _ = envs.step(env_actions)
        trajectories["obs"].append(obs)
        trajectories["actions"].append(actions)
        trajectories["rewards"].append(torch.as_tensor(reward, dtype=torch.float32))
        trajectories["valid"].append(torch.as_tensor(alive, dtype=torch.float32))
        obs = next_obs
        alive &= ~(terminated | truncated)
        if not alive.any():
            break
    return {key: torch.stack(values) for key, values in trajectories.items()}


def client_update(
    args: Args, policy: Policy, theta, eta: float, round_: int, client: int, byzantine: bool, max_steps: int
):
    """One client's round: E local gradient-ascent steps from the global theta on its own
    trajectories, or (fedpg-br) its gradient at theta; corrupted if the client is Byzantine. Returns
    the update u (theta_k - theta, or fedpg-br's mu_k), its env steps and its trajectories'
    returns."""
    seed = np.random.SeedSequence([args.seed, round_, client]).generate_state(1)[0]
    generator = torch.Generator().manual_seed(int(seed))
    mode = "random" if byzantine and args.attack == "random-action" else "sample"
    theta_k = theta.clone()
    steps = 0
    returns = []
    for local_update in range(args.local_updates):
        env_seed = client_env_seed(args, round_, local_update, client)
        envs = make_env(args.env_id, args.B, env_seed, args.env_threads, pole_scale(args, client))
        batch = sample_trajectories(policy, theta_k, envs, args.B, max_steps, generator, mode)
        envs.close()
        steps += int(batch["valid"].sum())
        returns += (batch["rewards"] * batch["valid"]).sum(0).tolist()
        g = policy_gradient(policy, theta_k, batch, args.gamma)
        if args.aggregator == "fedpg-br":
            u = g
        else:
            theta_k = theta_k + eta * clip_norm(g, args.max_grad_norm)
            u = theta_k - theta
    if byzantine:
        u = corrupt(u, args.attack, generator, policy.sizes)
    return u, steps, returns


def server_update(
    args: Args,
    policy: Policy,
    theta,
    eta: float,
    u: torch.Tensor,
    n: torch.Tensor,
    round_: int,
    server_trajectories: int,
    max_steps: int,
):
    """The K updates u [K, D] -> the next theta, and statistics. fedpg-br: the filter, mu_t = mean
    of the kept gradients, then N_t steps theta_{n+1} = theta_n + eta v_n, v_0 = mu_t (at theta_0
    the mini-batch terms cancel, so none is sampled for it), v_n from b trajectories the server
    samples with theta_n."""
    info = {
        "kept": torch.ones(u.shape[0], dtype=torch.bool),
        "N_t": 0,
        "omega_max": 1.0,
        "r2": False,
        "server_trajectories": 0,
        "server_steps": 0,
    }
    if args.aggregator == "fedavg":
        # n: each client's env steps (its samples)
        return theta + (n[:, None] * u).sum(0) / n.sum(), info
    if args.aggregator == "median":
        return theta + coordinate_median(u), info
    if args.aggregator == "trimmed-mean":
        return theta + trimmed_mean(u, args.trim_fraction), info
    info["kept"], info["r2"] = byzantine_filter(u, args.B, args.sigma, args.delta, args.alpha)
    # nothing passed the filter: no step this round
    if not info["kept"].any():
        return theta, info
    mu = u[info["kept"]].mean(0)
    rng = np.random.default_rng([args.seed, round_, 1])
    N_t = sample_N_t(rng, args.B, args.b)
    generator = torch.Generator().manual_seed(int(rng.integers(2**62)))
    theta_0 = theta
    theta_n = theta + eta * clip_norm(mu, args.max_grad_norm) if N_t > 0 else theta
    for _ in range(1, N_t):
        seed = args.seed + 10**9 + server_trajectories + info["server_trajectories"]
        envs = make_env(args.env_id, args.b, seed, args.env_threads)
        batch = sample_trajectories(policy, theta_n, envs, args.b, max_steps, generator)
        envs.close()
        v, omega = semi_stochastic_gradient(policy, theta_0, theta_n, mu, batch, args.gamma)
        # an importance weight overflowed float32: end the inner loop here
        if not torch.isfinite(v).all():
            break
        theta_n = theta_n + eta * clip_norm(v, args.max_grad_norm)
        info["omega_max"] = max(info["omega_max"], float(omega.max()))
        info["server_trajectories"] += args.b
        info["server_steps"] += int(batch["valid"].sum())
    info["N_t"] = N_t
    return theta_n, info


def share_round(args: Args, theta: torch.Tensor, progress: dict, stop_requested: bool) -> tuple:
    """The start of a round, one collective: theta, eta_t and whether the run is over from rank 0,
    and every process's stop signal. Returns theta, eta_t, and whether to stop (end of run, or a
    signal somewhere)."""
    dim = theta.numel()
    head = torch.zeros(dim + 3, dtype=torch.float64)
    if args.rank == 0:
        head[:dim] = theta
        head[dim] = float(progress["global_step"] >= args.total_timesteps)
        head[dim + 2] = learning_rate(args, progress)
    head[dim + 1] = float(stop_requested)
    if args.world_size > 1:
        dist.all_reduce(head)
    return head[:dim].float(), float(head[dim + 2]), bool(head[dim] > 0), bool(head[dim + 1] > 0)


def collect_updates(args: Args, policy: Policy, theta, eta: float, round_: int, byzantine: list, max_steps: int):
    """The round of the clients this process hosts (a contiguous block, padded to one length on
    every process), gathered at rank 0. Each client sends one row: its client id, env steps, number
    and sum of its episodes' returns (the META numbers, for the logs), then its update. Rank 0
    returns the K rows in client order; the others return None."""
    per_rank = math.ceil(args.num_clients / args.world_size)
    first = min(args.rank * per_rank, args.num_clients)
    last = min((args.rank + 1) * per_rank, args.num_clients)
    rows = torch.zeros(per_rank, META + policy.num_params)
    # padding rows
    rows[:, 0] = -1
    for row, client in enumerate(range(first, last)):
        u, steps, returns = client_update(args, policy, theta, eta, round_, client, client in byzantine, max_steps)
        rows[row, :META] = torch.tensor([client, steps, len(returns), sum(returns)])
        rows[row, META:] = u
    if args.world_size > 1:
        gathered = [torch.empty_like(rows) for _ in range(args.world_size)] if args.rank == 0 else None
        dist.gather(rows, gathered, dst=0)
        rows = torch.cat(gathered) if args.rank == 0 else None
    if args.rank != 0:
        return None
    rows = rows[rows[:, 0] >= 0]
    assert torch.equal(rows[:, 0], torch.arange(args.num_clients, dtype=torch.float32))
    return rows


def evaluate(
    policy: Policy, theta, env_id: str, episodes: int, seed: int, max_steps: int, video_dir: Optional[str] = None
):
    """Returns of `episodes` episodes of the greedy policy, one env per episode (no bias to short
    episodes). With video_dir, episode 0 is also written there as an MP4."""
    render_mode = "rgb_array" if video_dir is not None else None
    envs = make_env(env_id, episodes, seed, render_mode=render_mode)
    video = open_video(video_dir) if video_dir is not None else None
    batch = sample_trajectories(policy, theta, envs, episodes, max_steps, mode="greedy", video=video)
    if video is not None:
        video.close()
    envs.close()
    return (batch["rewards"] * batch["valid"]).sum(0).numpy()


# ----------------------------------------------------------------------------------------------- main
def main(args: Args, stop: Optional[dict] = None) -> int:
    # the aggregator's step size, before a checkpoint is read: it is part of the run's configuration
    args.learning_rate = args.learning_rate or (2.0 if args.aggregator == "fedpg-br" else 8.0)
    # stop signals, flag checks, then the worker processes or torchrun's group, seeds: all below the fold
    run = Run(args, stop)
    if run.forks_workers:
        # without torchrun: fork the --num-workers processes that host the clients (each runs main()), wait for them
        return spawn_workers(args, run.stop)
    spec = envpool.make_spec(args.env_id)
    max_steps = spec.config.max_episode_steps
    policy = Policy(spec.observation_space.shape[0], spec.action_space, args.hidden_sizes)
    theta = policy.init_params()
    byzantine = byzantine_clients(args.seed, args.num_clients, args.num_byzantine)
    # fresh progress, or a checkpoint's with --resume (theta loaded in place)
    progress = run.restore(policy, theta, byzantine, max_steps)
    run.start_training()
    while True:
        # PUBLISH: theta and eta_t from the server to every client's process, with the decision to go on
        theta, eta, run_over, stopping = share_round(args, theta, progress, run.stop_requested())
        if run_over or stopping:
            break
        # COLLECT: the clients' updates (E local steps, or FedPG-BR's gradient), gathered at rank 0
        rows = collect_updates(args, policy, theta, eta, progress["update"], byzantine, max_steps)
        run.lap("client")
        progress["update"] += 1
        if args.rank != 0:
            continue
        # LEARN: the server aggregates the K updates (FedPG-BR: its filter, then its SCSG inner loop)
        round_ = progress["update"] - 1
        updates = rows[:, META:]
        samples = rows[:, 1]
        server_trajectories = progress["server_trajectories"]
        theta, info = server_update(args, policy, theta, eta, updates, samples, round_, server_trajectories, max_steps)
        progress["global_step"] += int(rows[:, 1].sum()) + info["server_steps"]
        progress["server_trajectories"] += info["server_trajectories"]
        run.lap("server")
        # BOOKKEEPING: clocks, the honest clients' episodes, the filter's choices, logs, checkpoints (rank 0)
        run.end_round(rows, info, eta, theta)
    # a checkpoint after a stop signal, else the final evaluation and summary.json; the writer and process group
    run.finish(theta, stopping)
    return 0


# ==== infrastructure: flags, checks, checkpoints, signals, processes, logging; nothing below is federated PG ====
@dataclass
class Infra:
    """The flags that keep a run alive, watched, reproducible and resumable, not what it learns."""

    exp_name: str = "fedpg"  # the name of this experiment (part of the run name)
    torch_deterministic: bool = True  # kept for the common block: runs on CPU, whose kernels here are deterministic
    cuda: bool = False  # kept for the common block: clients run small policies on CPU; this flag is ignored
    track: bool = False  # log to Weights & Biases as well as TensorBoard
    wandb_project_name: str = "distrl"  # the wandb project name
    wandb_entity: Optional[str] = None  # the wandb entity (team)
    capture_video: bool = False  # write the first evaluation episode as runs/<run_name>/videos/eval_episode0.mp4
    save_model: bool = False  # write the final theta to runs/<run_name>/model.pt
    eval_episodes: int = 10  # episodes of the final greedy policy to evaluate at the end
    eval_every: int = 0  # also evaluate theta greedily every this many rounds (the papers' curves; 0: only at the end)
    num_workers: int = 0  # processes hosting the K clients here (0: min(K, available CPUs); under torchrun: ranks)
    env_threads: int = 1  # envpool threads per environment batch (small batches: 1)
    checkpoint_every: int = 0  # write runs/<run_name>/checkpoint.pt every this many rounds (0: on signals only)
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
    round (episodes, the filter's choices, evaluations, TensorBoard, progress lines, checkpoints, stop
    signals) and the end (the final evaluation, summary.json, closing the writer and the process group)."""

    def __init__(self, args: RunArgs, stop: Optional[dict]):
        # first of all: a SIGTERM/SIGUSR1 during start-up ends in a checkpoint, not in exit 143
        self.stop = install_stop_handlers(stop)
        # envpool's spaces warn about it
        warnings.filterwarnings("ignore", message=".*precision lowered by casting.*")
        validate(args)
        if "WORLD_SIZE" not in os.environ:
            args.num_workers = args.num_workers or min(args.num_clients, available_cpus())
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
        seed_everything(args)
        self.threshold = envpool.make_spec(args.env_id).reward_threshold

    def restore(self, policy, theta: torch.Tensor, byzantine: list, max_steps: int) -> dict:
        """Fresh progress, or the checkpoint's with --resume (theta loaded in place); opens rank 0's writer
        and names the Byzantine clients. The run keeps policy, byzantine and max_steps for its evaluations
        and logs."""
        args = self.args
        self.policy = policy
        self.max_steps = max_steps
        self.byzantine = byzantine
        self.honest = torch.tensor([client not in byzantine for client in range(args.num_clients)])
        self.progress = restore(args, theta, self.checkpoint_path)
        self.writer = None
        if args.rank == 0:
            self.writer = open_writer(args, self.run_dir, self.progress)
            self.writer.add_text("byzantine_clients", str(byzantine))
            print(
                f"{args.num_clients} clients on {args.world_size} process(es); Byzantine clients ({args.attack}): "
                f"{byzantine or 'none'}",
                flush=True,
            )
        self.stats = {"bytes_down": policy.num_params * 4, "bytes_up": (policy.num_params + META) * 4}
        return self.progress

    def start_training(self) -> None:
        """Training time counts from here (start-up is reported on its own)."""
        self.clock = start_clock(self.progress)
        self.lap_start = self.clock
        self.last_print = 0.0

    def stop_requested(self) -> bool:
        """Whether a stop signal reached this process (share_round sums it over all of them)."""
        return self.stop["signal"] != 0

    def lap(self, name: str) -> None:
        """The time since the previous lap (or the start of the round) as this round's `name` time."""
        now = time.time()
        self.stats[f"{name}_time_s"] = now - self.lap_start
        self.lap_start = now

    def end_round(self, rows: torch.Tensor, info: dict, eta: float, theta: torch.Tensor) -> None:
        """One round's bookkeeping at rank 0: the filter's choices, the clocks, the honest clients' episodes,
        the --eval-every evaluation, the log and progress line, a checkpoint when due."""
        args = self.args
        progress = self.progress
        honest = self.honest
        record_filter(progress, self.stats, info["kept"], honest)
        self.clock = advance_clock(progress, self.clock)
        trajectories = progress["update"] * args.B * args.local_updates
        episodes = rows[honest, 2].sum()
        record_returns(progress, [int(episodes), float(rows[honest, 3].sum())], self.threshold, trajectories)
        if args.eval_every and progress["update"] % args.eval_every == 0:
            evaluate_round(args, self.policy, theta, self.writer, progress, self.threshold, self.max_steps)
        round_means = [(float(rows[honest, 3].sum() / episodes), float(rows[honest, 1].sum() / episodes))]
        scalars = round_scalars(args, progress, rows, info, eta, theta, self.stats)
        log_update(self.writer, progress, round_means, scalars)
        self.last_print = print_progress(progress, args.total_timesteps, self.last_print)
        if args.checkpoint_every and progress["update"] % args.checkpoint_every == 0:
            save_checkpoint(self.checkpoint_path, {**progress, "model": theta})
        self.lap_start = time.time()

    def finish(self, theta: torch.Tensor, stopped: bool) -> None:
        """After a stop signal somewhere (SLURM preemption): a checkpoint at rank 0. Else the final evaluation
        and summary. Then the writer, wandb and the process group."""
        args = self.args
        self.clock = advance_clock(self.progress, self.clock)
        if stopped and args.rank == 0:
            save_checkpoint(self.checkpoint_path, {**self.progress, "model": theta})
            print(
                f"signal received: checkpoint of round {self.progress['update']} written to {self.checkpoint_path}; "
                "rerun with --resume to continue",
                flush=True,
            )
        elif args.rank == 0:
            write_summary(
                args,
                self.policy,
                theta,
                self.writer,
                self.progress,
                self.clock,
                self.run_dir,
                self.stats,
                self.max_steps,
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
    # env seeds add offsets (up to 10**9) to the seed and must stay 32-bit
    if not 0 <= args.seed < 2**29:
        fail("seed", f"must be in [0, 2**29), got {args.seed}")
    for name in [
        "total_timesteps",
        "eval_episodes",
        "num_clients",
        "B",
        "b",
        "local_updates",
        "sigma",
        "env_threads",
        "collective_timeout",
    ]:
        if getattr(args, name) <= 0:
            fail(name, f"must be positive, got {getattr(args, name)}")
    for name in ["learning_rate", "max_grad_norm", "num_byzantine", "num_workers", "checkpoint_every", "eval_every"]:
        if getattr(args, name) < 0:
            fail(name, f"must not be negative, got {getattr(args, name)}")
    for name, ok in [("gamma", 0 < args.gamma <= 1), ("delta", 0 < args.delta <= 1), ("alpha", 0 < args.alpha < 0.5)]:
        if not ok:
            fail(name, f"must be in {'(0, 0.5)' if name == 'alpha' else '(0, 1]'}, got {getattr(args, name)}")
    if 2 * args.num_byzantine >= args.num_clients:
        fail("num_byzantine", f"must be below half of --num-clients ({args.num_clients}), got {args.num_byzantine}")
    trimmed = math.floor(args.trim_fraction * args.num_clients + 1e-9)
    if not 0 <= args.trim_fraction < 0.5 or 2 * trimmed >= args.num_clients:
        fail("trim_fraction", f"must be in [0, 0.5) and leave a client untrimmed, got {args.trim_fraction}")
    if args.aggregator == "fedpg-br" and args.local_updates != 1:
        fail("local_updates", "fedpg-br clients send one gradient per round; leave it at 1")
    cartpole_clients = args.env_id == "CartPole-v1" and args.num_clients >= 2
    if not 0 <= args.heterogeneity < 1 or (args.heterogeneity and not cartpole_clients):
        fail(
            "heterogeneity",
            f"must be in [0, 1); it varies CartPole-v1's pole over 2+ clients, got {args.heterogeneity}",
        )
    if any(h <= 0 for h in args.hidden_sizes):
        fail("hidden_sizes", f"must be positive, got {args.hidden_sizes}")
    processes = int(os.environ["WORLD_SIZE"]) if "WORLD_SIZE" in os.environ else args.num_workers
    if "WORLD_SIZE" in os.environ and args.num_workers > 1 or processes > args.num_clients:
        fail("num_workers", f"{processes} processes for {args.num_clients} clients (under torchrun: leave it at 0)")
    if args.env_id not in envpool.list_all_envs():
        fail("env_id", f"'{args.env_id}' is not an envpool environment")
    env_family = envpool.registration.registry.specs[args.env_id][0]
    if args.capture_video and env_family not in ("envpool.atari", "envpool.classic_control"):
        # envpool renders MuJoCo through a GPU context: without one, its render() ends the process
        fail("capture_video", f"'{args.env_id}' is not Atari or classic control, the envs recorded here")
    spec = envpool.make_spec(args.env_id)
    obs_space = spec.observation_space
    action_space = spec.action_space
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        fail("env_id", f"'{args.env_id}' has observation space {obs_space}; fedpg needs a flat Box")
    if not isinstance(action_space, (gym.spaces.Discrete, gym.spaces.Box)) or len(action_space.shape) > 1:
        fail("env_id", f"'{args.env_id}' has action space {action_space}; fedpg needs Discrete or 1-D Box")


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
    (docs/conventions.md §1a). `update` counts rounds. Clients send no single episode returns, so
    `recent_returns` holds each round's honest episodes as [count, return sum]. Federated PG adds
    the server's trajectories so far (they seed its envs), when the thresholds were reached in
    trajectories per client and the summed fractions of Byzantine and honest clients the filter
    kept."""
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
        "server_trajectories": 0,
        "threshold_trajectories": None,
        "eval_threshold_trajectories": None,
        "kept_byzantine": 0.0,
        "kept_honest": 0.0,
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


def recent_mean(progress: dict) -> tuple:
    """Mean return and count of the episodes of the fewest latest rounds that hold at least 20 of
    them (all kept rounds if fewer)."""
    count = 0
    total = 0.0
    for episodes, return_sum in reversed(progress["recent_returns"]):
        count += episodes
        total += return_sum
        if count >= 20:
            break
    return (total / count if count else float("nan")), count


def record_returns(progress: dict, round_episodes: list, threshold, trajectories: int) -> None:
    """A round's honest episodes as [count, return sum] (clients send no single returns); the first
    time the mean of the last 20 or more (whole rounds) reaches the threshold is kept, also as
    `trajectories` per client."""
    progress["recent_returns"].append(round_episodes)
    mean, count = recent_mean(progress)
    reached = threshold is not None and count >= 20 and mean >= threshold
    if reached and progress["time_to_threshold_s"] is None:
        progress["time_to_threshold_s"] = progress["train_time_s"]
        progress["threshold_step"] = progress["global_step"]
        progress["threshold_trajectories"] = trajectories


def record_filter(progress: dict, stats: dict, kept: torch.Tensor, honest: torch.Tensor) -> None:
    """The fractions of honest and Byzantine clients whose updates the server kept this round
    (FedPG-BR's filter; the other aggregators keep all), summed over the run for the summary's
    means."""
    stats["kept_honest"] = float(kept[honest].float().mean())
    stats["kept_byzantine"] = float(kept[~honest].float().mean())
    progress["kept_honest"] += stats["kept_honest"]
    if not honest.all():
        progress["kept_byzantine"] += stats["kept_byzantine"]


def log_update(writer, progress: dict, finished: list, scalars: dict) -> None:
    """TensorBoard points of one iteration: its finished episodes, then the named scalars. Federated
    PG passes one (return, length) per round, the honest clients' episode means (docs/conventions.md
    §6)."""
    step = progress["global_step"]
    for episode_return, episode_length in finished:
        writer.add_scalar("charts/episodic_return", episode_return, step)
        writer.add_scalar("charts/episodic_length", episode_length, step)
    for key, value in scalars.items():
        writer.add_scalar(key, value, step)


def round_scalars(
    args: RunArgs, progress: dict, rows: torch.Tensor, info: dict, eta: float, theta, stats: dict
) -> dict:
    """TensorBoard scalars of one round, after the honest clients' episode means."""
    byzantine = {"stats/kept_byzantine": stats["kept_byzantine"]} if args.num_byzantine else {}
    return {
        "charts/SPS": progress["global_step"] / progress["train_time_s"],
        "charts/learning_rate": eta,
        "charts/trajectories_per_client": progress["update"] * args.B * args.local_updates,
        "losses/theta_norm": float(theta.norm()),
        "losses/update_norm_median": float(rows[:, META:].norm(dim=1).median()),
        "stats/bytes_per_client_up": stats["bytes_up"],
        "stats/bytes_per_client_down": stats["bytes_down"],
        "stats/bytes_per_round": args.num_clients * (stats["bytes_up"] + stats["bytes_down"]),
        "stats/client_time_s": stats["client_time_s"],
        "stats/server_time_s": stats["server_time_s"],
        "stats/round": progress["update"],
        "stats/kept_honest": stats["kept_honest"],
        **byzantine,
        "stats/N_t": info["N_t"],
        "stats/omega_max": info["omega_max"],
        "stats/filter_r2": float(info["r2"]),
        "stats/server_trajectories": progress["server_trajectories"],
    }


def print_progress(progress: dict, total_timesteps: int, last_print: float) -> float:
    """A progress line at most every 2 s (and at the end); returns when one was last printed. The
    loop runs to total_timesteps, so the line counts steps."""
    now = time.time()
    if now - last_print < 2.0 and progress["global_step"] < total_timesteps:
        return last_print
    mean, count = recent_mean(progress)
    mean_return = f"{mean:.1f}" if count else "n/a"
    sps = progress["global_step"] / max(progress["train_time_s"], 1e-9)
    print(
        f"round {progress['update']} global_step={progress['global_step']}/{total_timesteps} SPS={sps:.0f} "
        f"return(last {count})={mean_return}",
        flush=True,
    )
    return now


# ----------------------------------------------------------------------------------------------- checkpoints
def save_checkpoint(path: str, payload: dict) -> None:
    """Atomic: write a temporary file beside the target, then rename it over the target."""
    payload = {**payload, "algo": "fedpg", "version": CHECKPOINT_VERSION}
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
    if written_by not in (None, "fedpg"):
        fail("resume", f"{checkpoint_path} was written by {written_by}.py, not fedpg.py; use another --exp-name")
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
            f"{checkpoint_path} lacks {', '.join(missing)}: not a checkpoint of fedpg.py; use another --exp-name",
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


def restore(args: RunArgs, theta: torch.Tensor, checkpoint_path: str) -> dict:
    """A fresh progress dict, or with --resume and a checkpoint, the checkpoint's, with theta loaded
    in place. Rank 0 reads the checkpoint and sends it to the other ranks: nodes need no shared
    filesystem. Trajectories and random draws follow from (seed, round), so nothing else is needed;
    there is no optimizer state (plain gradient ascent)."""
    progress = new_progress(run_config(args))
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
    except (KeyError, RuntimeError, ValueError, TypeError, AttributeError) as error:
        refuse_checkpoint(checkpoint_path, error)
    recent_returns = checkpoint.pop("recent_returns")
    progress.update(checkpoint)
    progress["recent_returns"].extend(recent_returns)
    return progress


# ----------------------------------------------------------------------------------------------- signals and output
def install_stop_handlers(stop: Optional[dict] = None) -> dict:
    """SIGTERM, SIGUSR1 (SLURM preemption) and Ctrl-C's SIGINT ask for a checkpoint at the end of the
    current round. Installed first thing in main(), and again by a forked worker on the dict it
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
    writer = SummaryWriter(run_dir, purge_step=progress["global_step"] if progress["update"] else None)
    table = "\n".join(f"|{key}|{value}|" for key, value in asdict(args).items())
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + table)
    return writer


def evaluate_round(args: RunArgs, policy: Policy, theta, writer, progress: dict, threshold, max_steps: int) -> None:
    """--eval-every: theta's greedy return (the papers' curves), logged against trajectories per
    client; the first round it reaches the threshold is kept."""
    trajectories = progress["update"] * args.B * args.local_updates
    eval_returns = evaluate(policy, theta, args.env_id, args.eval_episodes, args.seed + 10**6, max_steps)
    eval_return = float(eval_returns.mean())
    writer.add_scalar("eval/round_return", eval_return, trajectories)
    reached = threshold is not None and eval_return >= threshold
    if reached and progress["eval_threshold_trajectories"] is None:
        progress["eval_threshold_trajectories"] = trajectories


def write_summary(args, policy, theta, writer, progress: dict, clock: float, run_dir, stats: dict, max_steps: int):
    """The final evaluation, runs/<run_name>/summary.json (whole-run figures) and, with
    --save-model, theta."""
    video_dir = os.path.join(run_dir, "videos") if args.capture_video else None
    eval_returns = evaluate(policy, theta, args.env_id, args.eval_episodes, args.seed + 10**6, max_steps, video_dir)
    for episode, episode_return in enumerate(eval_returns):
        writer.add_scalar("eval/episodic_return", episode_return, episode)
    # the evaluation counts in wall time only
    advance_clock(progress, clock, training=False)
    rounds = max(progress["update"], 1)
    byzantine = byzantine_clients(args.seed, args.num_clients, args.num_byzantine)
    summary = {
        "algo": "fedpg",
        "aggregator": args.aggregator,
        "env_id": args.env_id,
        "seed": args.seed,
        "world_size": args.world_size,
        "num_clients": args.num_clients,
        "num_byzantine": args.num_byzantine,
        "attack": args.attack,
        "byzantine_clients": byzantine,
        "heterogeneity": args.heterogeneity,
        "learning_rate": args.learning_rate,
        "global_step": progress["global_step"],
        "rounds": progress["update"],
        "trajectories_per_client": progress["update"] * args.B * args.local_updates,
        "server_trajectories": progress["server_trajectories"],
        "wall_time_s": progress["wall_time_s"],
        "startup_s": progress["startup_s"],
        "train_time_s": progress["train_time_s"],
        "sps": progress["global_step"] / progress["train_time_s"],
        "eval_return_mean": float(np.mean(eval_returns)),
        "eval_return_std": float(np.std(eval_returns)),
        "train_return_last20": recent_mean(progress)[0] if progress["recent_returns"] else None,
        "time_to_threshold_s": progress["time_to_threshold_s"],
        "threshold_step": progress["threshold_step"],
        "trajectories_per_client_to_threshold": progress["threshold_trajectories"],
        "reward_threshold": envpool.make_spec(args.env_id).reward_threshold,
        "trajectories_per_client_to_eval_threshold": progress["eval_threshold_trajectories"],
        "num_params": theta.numel(),
        "bytes_per_client_per_round": stats["bytes_up"] + stats["bytes_down"],
        "kept_byzantine_mean": progress["kept_byzantine"] / rounds if byzantine else None,
        "kept_honest_mean": progress["kept_honest"] / rounds,
        "theta_sha256": hashlib.sha256(theta.numpy().tobytes()).hexdigest(),
    }
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    if args.save_model:
        torch.save({"theta": theta}, os.path.join(run_dir, "model.pt"))
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


def seed_everything(args: RunArgs) -> None:
    """Threads and seeds (the same in every process: identical initial theta). One torch thread: the
    per-client batches are tiny, and it keeps every client's floats independent of the process that
    hosts it."""
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)


def finish_distributed(args: RunArgs) -> None:
    """Leave the process group together, at a barrier."""
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
    """Without torchrun: fork the `--num-workers` processes that host the clients; they form a gloo group on
    127.0.0.1. If one dies, the others are terminated and the job exits non-zero naming it. SIGTERM/SIGUSR1 are
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


if __name__ == "__main__":
    sys.exit(main(tyro.cli(RunArgs)))

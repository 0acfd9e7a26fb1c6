# docs: docs/fedpg.md | paper: https://arxiv.org/abs/2110.14074
"""Federated policy gradient: FedAvg (McMahan et al., 2017), FedPG-BR (Fan et al., 2021) and robust baselines.

Each round the server (rank 0) sends theta to the K clients; each samples trajectories in its own environments and
sends back only a model update, never an observation, action or reward. The server aggregates them: a sample-
weighted average (fedavg), a coordinate-wise median or trimmed mean, or FedPG-BR's Byzantine filter followed by its
variance-reduced (SCSG) inner loop on trajectories of its own. `--num-byzantine M` clients send corrupt updates.

  python algos/fedpg.py                                                 # 10 clients (fedavg), CartPole-v1
  python algos/fedpg.py --aggregator fedpg-br --num-byzantine 3 --attack sign-flip
  torchrun --standalone --nproc_per_node=2 algos/fedpg.py               # the same 10 clients on 2 ranks
"""
import ctypes
import hashlib
import json
import math
import os
import signal
import socket
import sys
import time
import types
import warnings
from dataclasses import asdict, dataclass, field
from typing import Literal, Optional, Tuple


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
import tyro  # noqa: E402


@dataclass
class Args:
    # --- common to every distrl file ---
    exp_name: str = "fedpg"  # the name of this experiment (part of the run name)
    seed: int = 1  # seed of the experiment (initial weights, Byzantine clients, env seeds, action sampling)
    torch_deterministic: bool = True  # kept for the common block: runs on CPU, whose kernels here are deterministic
    cuda: bool = False  # kept for the common block: clients run small policies on CPU; this flag is ignored
    track: bool = False  # log to Weights & Biases as well as TensorBoard
    wandb_project_name: str = "distrl"  # the wandb project name
    wandb_entity: Optional[str] = None  # the wandb entity (team)
    capture_video: bool = False  # not supported (vector-observation tasks only); kept for the common block
    save_model: bool = False  # write the final theta to runs/<run_name>/model.pt
    env_id: str = "CartPole-v1"  # the envpool environment id (vector observations: classic control, MuJoCo)
    total_timesteps: int = 1_500_000  # environment steps over all clients and the server (ends after that round)
    eval_episodes: int = 10  # episodes of the final greedy policy to evaluate at the end
    eval_every: int = 0  # also evaluate theta greedily every this many rounds (the papers' curves; 0: only at the end)
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
    # --- distributed ---
    num_workers: int = 0  # processes hosting the K clients here (0: min(K, available CPUs); under torchrun: ranks)
    env_threads: int = 1  # envpool threads per environment batch (small batches: 1)
    checkpoint_every: int = 0  # write runs/<run_name>/checkpoint.pt every this many rounds (0: on signals only)
    resume: bool = False  # continue from runs/<run_name>/checkpoint.pt when it exists
    # --- computed at run time ---
    world_size: int = field(default=1, init=False)
    rank: int = field(default=0, init=False)
    local_rank: int = field(default=0, init=False)
    run_name: str = field(default="", init=False)


def fail(arg: str, message: str) -> None:
    """Bad argument: one line naming it on stderr, exit code 2 (as argparse does)."""
    print(f"{os.path.basename(sys.argv[0])}: error: --{arg.replace('_', '-')}: {message}", file=sys.stderr)
    sys.exit(2)


def validate(args: Args) -> None:
    if not 0 <= args.seed < 2**29:  # env seeds add offsets (up to 10**9) to it and must stay 32-bit
        fail("seed", f"must be in [0, 2**29), got {args.seed}")
    for name in ["total_timesteps", "eval_episodes", "num_clients", "B", "b", "local_updates", "sigma", "env_threads"]:
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
    if not 0 <= args.trim_fraction < 0.5 or 2 * math.floor(args.trim_fraction * args.num_clients + 1e-9) >= args.num_clients:
        fail("trim_fraction", f"must be in [0, 0.5) and leave a client untrimmed, got {args.trim_fraction}")
    if args.aggregator == "fedpg-br" and args.local_updates != 1:
        fail("local_updates", "fedpg-br clients send one gradient per round; leave it at 1")
    if not 0 <= args.heterogeneity < 1 or (args.heterogeneity and (args.env_id != "CartPole-v1" or args.num_clients < 2)):
        fail("heterogeneity", f"must be in [0, 1); it varies CartPole-v1's pole over 2+ clients, got {args.heterogeneity}")
    if any(h <= 0 for h in args.hidden_sizes):
        fail("hidden_sizes", f"must be positive, got {args.hidden_sizes}")
    processes = int(os.environ["WORLD_SIZE"]) if "WORLD_SIZE" in os.environ else args.num_workers
    if "WORLD_SIZE" in os.environ and args.num_workers > 1 or processes > args.num_clients:
        fail("num_workers", f"{processes} processes for {args.num_clients} clients (under torchrun: leave it at 0)")
    if args.capture_video:  # kept in Args for the common block
        fail("capture_video", "not supported here (vector-observation tasks only)")
    if args.env_id not in envpool.list_all_envs():
        fail("env_id", f"'{args.env_id}' is not an envpool environment")
    spec = envpool.make_spec(args.env_id)
    obs_space, act_space = spec.observation_space, spec.action_space
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        fail("env_id", f"'{args.env_id}' has observation space {obs_space}; fedpg needs a flat Box")
    if not isinstance(act_space, (gym.spaces.Discrete, gym.spaces.Box)) or len(act_space.shape) > 1:
        fail("env_id", f"'{args.env_id}' has action space {act_space}; fedpg needs Discrete or 1-D Box")


# ----------------------------------------------------------------------------------------------- environment
def make_env(env_id: str, num_envs: int, seed: int, num_threads: int = 1, pole_scale: Optional[float] = None):
    """`num_envs` envs: envpool's (env i seeded with seed + i), or (pole_scale given) gymnasium's vectorized CartPole
    with a scaled pole (one generator seeded with seed draws every start state), since envpool's classic-control
    physics is fixed. Both autoreset on the next step."""
    if pole_scale is not None:
        from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
        envs = CartPoleVectorEnv(num_envs)
        envs.length *= pole_scale  # half the pole's length; the physics reads these two products too
        envs.polemass_length = envs.masspole * envs.length
        envs.reset = lambda reset=envs.reset: reset(seed=seed)
        return envs
    return envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, num_threads=num_threads,
                        thread_affinity_offset=-1)


def pole_scale(args: Args, client: int) -> Optional[float]:
    """Client k's pole-length factor 1 + h (2k / (K - 1) - 1), spread over [1 - h, 1 + h]; None without h."""
    if not args.heterogeneity:
        return None
    return 1.0 + args.heterogeneity * (2 * client / (args.num_clients - 1) - 1) if args.num_clients > 1 else 1.0


def client_env_seed(args: Args, round_: int, local_update: int, client: int) -> int:
    """Seed of client `client`'s B trajectories in local update `local_update` of round `round_`: tied to the
    client, never to the process that hosts it. The server's own trajectories start at seed + 10**9."""
    return args.seed + 2 * 10**6 + ((round_ * args.local_updates + local_update) * args.num_clients + client) * args.B


def byzantine_clients(seed: int, K: int, M: int) -> list:
    """The seeded choice of the M Byzantine clients among the K."""
    return sorted(np.random.default_rng([seed, 7]).choice(K, M, replace=False).tolist())


# ----------------------------------------------------------------------------------------------- networks
class Policy:
    """Stochastic tanh MLP on a flat parameter vector theta (what server and clients exchange): categorical for
    Discrete actions, diagonal Gaussian with state-independent log-std (theta's last entries) for Box actions."""

    def __init__(self, obs_dim: int, action_space, hidden_sizes=(16, 16)):
        self.continuous = isinstance(action_space, gym.spaces.Box)
        self.n_out = int(np.prod(action_space.shape)) if self.continuous else int(action_space.n)
        sizes = [obs_dim, *hidden_sizes, self.n_out]
        self.shapes = [(sizes[i + 1], sizes[i]) for i in range(len(sizes) - 1)]
        self.sizes = [n for o, i in self.shapes for n in (o * i, o)] + ([self.n_out] if self.continuous else [])
        self.num_params = sum(self.sizes)  # theta is the weights and biases of each layer (and the log-std), flat
        if self.continuous:
            self.low = torch.as_tensor(action_space.low, dtype=torch.float32)
            self.high = torch.as_tensor(action_space.high, dtype=torch.float32)

    def init_params(self) -> torch.Tensor:
        """Orthogonal weights (gain sqrt 2; 0.01 for the output layer), zero biases, log-std 0."""
        chunks = []
        for k, (o, i) in enumerate(self.shapes):
            w = torch.nn.init.orthogonal_(torch.empty(o, i), 0.01 if k == len(self.shapes) - 1 else math.sqrt(2))
            chunks += [w.reshape(-1), torch.zeros(o)]
        return torch.cat(chunks + ([torch.zeros(self.n_out)] if self.continuous else []))

    def forward(self, theta: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """theta [num_params], obs [N, obs_dim] -> logits or Gaussian means [N, n_out]."""
        h, offset = obs, 0
        for k, (o, i) in enumerate(self.shapes):
            h = torch.nn.functional.linear(h, theta[offset:offset + o * i].view(o, i), theta[offset + o * i:offset + o * i + o])
            offset += o * i + o
            h = torch.tanh(h) if k < len(self.shapes) - 1 else h
        return h

    def log_prob(self, theta: torch.Tensor, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        out = self.forward(theta, obs)
        if self.continuous:
            return torch.distributions.Normal(out, theta[-self.n_out:].exp().expand_as(out)).log_prob(actions).sum(-1)
        return torch.distributions.Categorical(logits=out).log_prob(actions)

    def sample(self, theta: torch.Tensor, obs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        out = self.forward(theta, obs)
        if self.continuous:
            return out + theta[-self.n_out:].exp() * torch.randn(out.shape, generator=generator)
        return torch.multinomial(torch.softmax(out, -1), 1, generator=generator).squeeze(-1)

    def greedy(self, theta: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        out = self.forward(theta, obs)
        return out if self.continuous else out.argmax(-1)


# ----------------------------------------------------------------------------------------------- algorithm
def trajectory_weights(rewards: torch.Tensor, valid: torch.Tensor, gamma: float) -> torch.Tensor:
    """Weights w_t [T, N] of N trajectories: the reward-to-go sum_{h >= t} gamma^(h - t) r_h, standardized over its
    own trajectory's steps (as the authors' code), 0 outside it (valid = 0): each depends on its trajectory alone."""
    G, running = torch.zeros_like(rewards), torch.zeros_like(rewards[0])
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = rewards[t] * valid[t] + gamma * running * valid[t]
        G[t] = running
    n = valid.sum(0).clamp(min=1)
    mean = (G * valid).sum(0) / n
    std = (((G - mean) ** 2 * valid).sum(0) / n).sqrt()
    return (G - mean) / (std + 1e-8) * valid


def policy_gradient(policy: Policy, theta: torch.Tensor, batch: dict, gamma: float) -> torch.Tensor:
    """The estimate g^ = sum_j sum_t grad log pi_theta(a_t | s_t) w_t / sum_j L_j (ascent direction): the mean over
    the batch's steps, as the authors' code; L_j is trajectory j's length."""
    th = theta.detach().requires_grad_()
    m = batch["valid"].bool()
    w = trajectory_weights(batch["rewards"], batch["valid"], gamma)[m]
    return torch.autograd.grad((policy.log_prob(th, batch["obs"][m], batch["actions"][m]) * w).sum() / m.sum(), th)[0]


def semi_stochastic_gradient(policy: Policy, theta_0, theta_n, mu, batch: dict, gamma: float):
    """FedPG-BR's inner-loop direction v_n = g^(theta_n) - g^_omega(theta_0) + mu on b trajectories sampled with
    theta_n, with importance weights omega_j = p(tau_j | theta_0) / p(tau_j | theta_n) = prod_t pi_theta_0(a_t|s_t) /
    pi_theta_n(a_t|s_t) (the dynamics cancel). g^ as policy_gradient's (a per-step mean); g^_omega weights trajectory
    j's steps by omega_j, over the same sum_j L_j steps (as the authors' code; see docs: not unbiased). Returns v_n,
    omega."""
    m = batch["valid"].bool()
    w = trajectory_weights(batch["rewards"], batch["valid"], gamma)
    th_n, th_0 = theta_n.detach().requires_grad_(), theta_0.detach().requires_grad_()
    lp_n, lp_0 = policy.log_prob(th_n, batch["obs"][m], batch["actions"][m]), policy.log_prob(th_0, batch["obs"][m], batch["actions"][m])
    log_ratio = torch.zeros(m.shape)
    log_ratio[m] = (lp_0 - lp_n).detach()
    omega = log_ratio.sum(0).exp()
    g_n = torch.autograd.grad((lp_n * w[m]).sum() / m.sum(), th_n)[0]
    g_0 = torch.autograd.grad((lp_0 * (omega * w)[m]).sum() / m.sum(), th_0)[0]
    return g_n - g_0 + mu, omega


def byzantine_filter(mu: torch.Tensor, B: int, sigma: float, delta: float, alpha: float):
    """FedPG-BR's filter (Algorithm 1) on the K gradients mu [K, D]. R1: T_mu = 2 sigma sqrt(V / B), V = 2 log(2K /
    delta); S = the gradients within T_mu of more than K/2 gradients (itself included); mu_mom = the member of S
    closest to S's mean; G = the gradients within T_mu of mu_mom. R2: if |G| < (1 - alpha) K, the same with radius
    2 sigma. Returns G's mask (all False if S is empty) and whether R2 was used."""
    K, mu = mu.shape[0], mu.double()
    T_mu = 2 * sigma * math.sqrt(2 * math.log(2 * K / delta) / B)
    dist_ = (mu[:, None, :] - mu[None, :, :]).norm(dim=-1)

    def keep(radius: float) -> torch.Tensor:
        S = ((dist_ <= radius).sum(1) > K / 2).nonzero().squeeze(1)
        if len(S) == 0:
            return torch.zeros(K, dtype=torch.bool)
        mu_mom = mu[S[(mu[S] - mu[S].mean(0)).norm(dim=1).argmin()]]
        return (mu - mu_mom).norm(dim=1) <= radius

    good = keep(T_mu)
    if good.sum() < (1 - alpha) * K:
        return keep(2 * sigma), True
    return good, False


def sample_N_t(rng: np.random.Generator, B: int, b: int) -> int:
    """N_t ~ Geom(B / (B + b)) as in SCSG: P(N_t = n) = (B / (B + b))^n b / (B + b) for n >= 0, mean B / b."""
    return int(rng.geometric(b / (B + b))) - 1  # numpy's geometric counts trials, from 1


def coordinate_median(u: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise median of the rows of u [K, D] (the mean of the two middle values when K is even)."""
    s, K = u.sort(0).values, u.shape[0]
    return s[K // 2] if K % 2 else (s[K // 2 - 1] + s[K // 2]) / 2


def trimmed_mean(u: torch.Tensor, fraction: float) -> torch.Tensor:
    """Coordinate-wise trimmed mean: drop the floor(fraction K) largest and smallest values of every coordinate."""
    k = math.floor(fraction * u.shape[0] + 1e-9)
    return u.sort(0).values[k:u.shape[0] - k].mean(0)


def clip_norm(v: torch.Tensor, max_norm: float) -> torch.Tensor:
    """v rescaled to norm max_norm if it is longer (max_norm 0: unchanged)."""
    n = float(v.norm())
    return v * (max_norm / n) if max_norm and n > max_norm else v


def corrupt(u: torch.Tensor, attack: str, generator: torch.Generator, sizes: list) -> torch.Tensor:
    """What a Byzantine client sends instead of u: sign-flip -2.5 u; random-noise u plus noise uniform in +-3 (max -
    min) of each parameter tensor's own entries (`sizes`: the tensors' lengths in u), as the authors' code;
    random-action changes the sampling, not u."""
    if attack == "sign-flip":
        return -2.5 * u
    if attack == "random-noise":
        return torch.cat([c + (torch.rand(c.shape, generator=generator) * 2 - 1) * 3 * (c.max() - c.min())
                          for c in u.split(sizes)])
    return u


# ----------------------------------------------------------------------------------------------- roles
def sample_trajectories(policy: Policy, theta, envs, num: int, max_steps: int, generator=None, mode="sample"):
    """One trajectory from a fresh reset in each of the `num` envs, stepped together (one batched forward pass per
    step) until every first episode has ended; later steps (envpool's reset step, the next episode) are masked out
    (valid = 0). Actions: sampled, greedy, or uniformly random (the random-action attack). Returns obs, actions,
    rewards, valid along time [T, num, ...]."""
    obs, _ = envs.reset()
    alive = np.ones(num, dtype=bool)
    buf = {"obs": [], "actions": [], "rewards": [], "valid": []}
    for _ in range(max_steps):
        o = torch.as_tensor(obs, dtype=torch.float32)
        with torch.no_grad():
            if mode == "random" and policy.continuous:
                a = policy.low + (policy.high - policy.low) * torch.rand((num, policy.n_out), generator=generator)
            elif mode == "random":
                a = torch.randint(policy.n_out, (num,), generator=generator)
            else:
                a = policy.sample(theta, o, generator) if mode == "sample" else policy.greedy(theta, o)
        act = torch.maximum(torch.minimum(a, policy.high), policy.low).numpy() if policy.continuous else a.numpy()
        obs, r, term, trunc, _ = envs.step(act)
        for key, value in zip(buf, (o, a, torch.as_tensor(r, dtype=torch.float32), torch.as_tensor(alive, dtype=torch.float32))):
            buf[key].append(value)
        alive &= ~(term | trunc)
        if not alive.any():
            break
    return {key: torch.stack(value) for key, value in buf.items()}


def client_update(args: Args, policy: Policy, theta, eta: float, round_: int, client: int, byzantine: bool,
                  max_steps: int):
    """One client's round: E local gradient-ascent steps from the global theta on its own trajectories, or (fedpg-br)
    its gradient at theta; corrupted if the client is Byzantine. Returns the update u (theta_k - theta, or fedpg-br's
    mu_k), its env steps and its trajectories' returns."""
    generator = torch.Generator().manual_seed(int(np.random.SeedSequence([args.seed, round_, client]).generate_state(1)[0]))
    theta_k, steps, returns = theta.clone(), 0, []
    for e in range(args.local_updates):
        envs = make_env(args.env_id, args.B, client_env_seed(args, round_, e, client), args.env_threads,
                        pole_scale(args, client))
        batch = sample_trajectories(policy, theta_k, envs, args.B, max_steps, generator,
                                    "random" if byzantine and args.attack == "random-action" else "sample")
        envs.close()
        steps, returns = steps + int(batch["valid"].sum()), returns + (batch["rewards"] * batch["valid"]).sum(0).tolist()
        g = policy_gradient(policy, theta_k, batch, args.gamma)
        if args.aggregator == "fedpg-br":
            u = g
        else:
            theta_k = theta_k + eta * clip_norm(g, args.max_grad_norm)
            u = theta_k - theta
    return (corrupt(u, args.attack, generator, policy.sizes) if byzantine else u), steps, returns


def server_update(args: Args, policy: Policy, theta, eta: float, u: torch.Tensor, n: torch.Tensor, round_: int,
                  server_trajectories: int, max_steps: int):
    """The K updates u [K, D] -> the next theta, and statistics. fedpg-br: the filter, mu_t = mean of the kept
    gradients, then N_t steps theta_{n+1} = theta_n + eta v_n, v_0 = mu_t (at theta_0 the mini-batch terms cancel,
    so none is sampled for it), v_n from b trajectories the server samples with theta_n."""
    info = {"kept": torch.ones(u.shape[0], dtype=torch.bool), "N_t": 0, "omega_max": 1.0, "r2": False,
            "server_trajectories": 0, "server_steps": 0}
    if args.aggregator == "fedavg":
        return theta + (n[:, None] * u).sum(0) / n.sum(), info  # n: each client's env steps (its samples)
    if args.aggregator == "median":
        return theta + coordinate_median(u), info
    if args.aggregator == "trimmed-mean":
        return theta + trimmed_mean(u, args.trim_fraction), info
    info["kept"], info["r2"] = byzantine_filter(u, args.B, args.sigma, args.delta, args.alpha)
    if not info["kept"].any():  # nothing passed the filter: no step this round
        return theta, info
    mu = u[info["kept"]].mean(0)
    rng = np.random.default_rng([args.seed, round_, 1])
    N_t = sample_N_t(rng, args.B, args.b)
    generator = torch.Generator().manual_seed(int(rng.integers(2**62)))
    theta_0, theta_n = theta, theta + eta * clip_norm(mu, args.max_grad_norm) if N_t > 0 else theta
    for _ in range(1, N_t):
        envs = make_env(args.env_id, args.b, args.seed + 10**9 + server_trajectories + info["server_trajectories"],
                        args.env_threads)
        batch = sample_trajectories(policy, theta_n, envs, args.b, max_steps, generator)
        envs.close()
        v, omega = semi_stochastic_gradient(policy, theta_0, theta_n, mu, batch, args.gamma)
        if not torch.isfinite(v).all():  # an importance weight overflowed float32: end the inner loop here
            break
        theta_n = theta_n + eta * clip_norm(v, args.max_grad_norm)
        info["omega_max"] = max(info["omega_max"], float(omega.max()))
        info["server_trajectories"] += args.b
        info["server_steps"] += int(batch["valid"].sum())
    info["N_t"] = N_t
    return theta_n, info


def evaluate(policy: Policy, theta, env_id: str, episodes: int, seed: int, max_steps: int):
    """Returns of `episodes` episodes of the greedy policy, one env per episode (no bias to short episodes)."""
    batch = sample_trajectories(policy, theta, make_env(env_id, episodes, seed), episodes, max_steps, mode="greedy")
    return (batch["rewards"] * batch["valid"]).sum(0).numpy()


STOP = {"signal": 0}  # the last SIGTERM/SIGUSR1 (SLURM preemption) this process received


def catch_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, lambda signum, frame: STOP.update(signal=signum))


def save_checkpoint(path: str, payload: dict) -> None:
    """Atomic: write a temporary file beside the target, then rename over it."""
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save(payload, tmp)
    os.replace(tmp, path)


def available_cpus() -> int:
    """CPUs this process may use (its affinity mask, which taskset, SLURM and containers set; not the machine's
    core count), shared among the ranks on this node (torchrun's LOCAL_WORLD_SIZE)."""
    return max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))  # Linux, as /proc


def setup_distributed(args: Args) -> None:
    """torchrun (or spawn_workers) sets RANK/LOCAL_RANK/WORLD_SIZE: join the gloo group. Alone: world size 1."""
    args.world_size = int(os.environ.get("WORLD_SIZE", "1"))
    args.rank, args.local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if args.world_size > 1:
        dist.init_process_group("gloo", init_method="env://")


def worker_entry(index: int, args: Args, num_workers: int, parent: int) -> None:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the parent, whatever kills it
    catch_signals()  # from the start: a signal while main() sets up still ends in a checkpoint
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)
    os.environ.update(RANK=str(index), LOCAL_RANK=str(index), WORLD_SIZE=str(num_workers),
                      LOCAL_WORLD_SIZE=str(num_workers))
    args.num_workers = 1
    sys.exit(main(args) or None)  # None: a clean exit with code 0


def spawn_workers(args: Args, num_workers: int) -> int:
    """Without torchrun: fork the worker processes that host the clients; they form a gloo group on 127.0.0.1. If
    one dies, the others are terminated and the job exits non-zero naming it. SIGTERM/SIGUSR1 are passed on."""
    with socket.socket() as s:  # a free port for the group's rendezvous (torch's TCPStore), not a protocol
        s.bind(("127.0.0.1", 0))
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
    procs = []  # a signal that comes before the workers exist is kept (STOP) and passed on once they do

    def forward(signum, frame=None):
        STOP.update(signal=signum)
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signum)
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, forward)
    ctx = mp.start_processes(worker_entry, args=(args, num_workers, os.getpid()), nprocs=num_workers, join=False,
                             start_method="fork")
    procs.extend(ctx.processes)
    if STOP["signal"]:
        forward(STOP["signal"])
    try:
        while not ctx.join(timeout=1.0):
            pass
    except (mp.ProcessExitedException, mp.ProcessRaisedException) as e:  # it died, or raised (then e has its traceback)
        print(f"{os.path.basename(sys.argv[0])}: error: worker {e.error_index} (pid {getattr(e, 'pid', '?')}): {e}; "
              "the other workers were stopped", file=sys.stderr)
        return 1
    return 0


def main(args: Args) -> int:
    warnings.filterwarnings("ignore", message=".*precision lowered by casting.*")  # envpool's spaces
    catch_signals()  # SIGTERM/SIGUSR1 (SLURM preemption) on any rank: checkpoint after the current round, exit 0
    validate(args)
    num_workers = args.num_workers or min(args.num_clients, available_cpus())
    if "WORLD_SIZE" not in os.environ and num_workers > 1:
        return spawn_workers(args, num_workers)
    setup_distributed(args)
    args.learning_rate = args.learning_rate or (2.0 if args.aggregator == "fedpg-br" else 8.0)
    rank, world, K = args.rank, args.world_size, args.num_clients
    args.run_name = f"{args.env_id}__{args.exp_name}__{args.seed}"
    run_dir = os.path.join("runs", args.run_name)
    ckpt_path = os.path.join(run_dir, "checkpoint.pt")
    torch.set_num_threads(1)  # tiny per-client batches; one thread keeps every client's floats host-independent

    spec = envpool.make_spec(args.env_id)
    threshold, max_steps = spec.reward_threshold, spec.config.max_episode_steps
    policy = Policy(spec.observation_space.shape[0], spec.action_space, args.hidden_sizes)
    D = policy.num_params
    torch.manual_seed(args.seed)
    theta = policy.init_params()
    byzantine = byzantine_clients(args.seed, K, args.num_byzantine)
    honest = torch.tensor([k not in byzantine for k in range(K)])
    per_rank = math.ceil(K / world)  # this process hosts a contiguous block of clients; blocks padded to one length
    mine = range(min(rank * per_rank, K), min((rank + 1) * per_rank, K))
    # The run's counters, all a resumed run needs besides theta (trajectories and random draws follow from (seed,
    # round)): kept_* sum the fractions of Byzantine and honest clients kept, recent holds [episodes, return sum] of
    # the last rounds' honest episodes, config what must not change across a resume.
    config = f"{args.env_id} {args.aggregator} K={K} M={args.num_byzantine} {args.attack} B={args.B} b={args.b} " \
             f"E={args.local_updates} h={args.heterogeneity} seed={args.seed} hidden={args.hidden_sizes}"
    state = dict(round=0, global_step=0, server_trajectories=0, wall_time_s=0.0, time_to_threshold_s=None,
                 threshold_step=None, threshold_trajectories=None, eval_threshold_trajectories=None, kept_byzantine=0.0,
                 kept_honest=0.0, recent=[], config=config, train_time_s=0.0)
    # Rank 0 reads the checkpoint and sends it to the other ranks: nodes need no shared filesystem.
    box = [torch.load(ckpt_path, weights_only=True) if args.resume and rank == 0 and os.path.exists(ckpt_path) else None]
    if world > 1:
        dist.broadcast_object_list(box, 0)
    if box[0] is not None:
        if box[0]["config"] != config:
            fail("resume", f"the checkpoint is of another run ({box[0]['config']}), not {config}")
        theta = box[0].pop("theta")
        state.update(box[0])

    writer = None
    if rank == 0:
        from torch.utils.tensorboard import SummaryWriter
        if args.track:
            import wandb
            wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True,
                       config=asdict(args), name=args.run_name, id=args.run_name, resume="allow")
        writer = SummaryWriter(run_dir, purge_step=state["global_step"] if box[0] is not None else None)
        writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in asdict(args).items()))
        writer.add_text("byzantine_clients", str(byzantine))
        print(f"{K} clients on {world} process(es); Byzantine clients ({args.attack}): {byzantine or 'none'}", flush=True)

    def checkpoint():
        save_checkpoint(ckpt_path, dict(state, theta=theta, wall_time_s=state["wall_time_s"] + time.time() - PROCESS_START,
                                        train_time_s=state["train_time_s"] + time.time() - train_start))

    def last20() -> tuple:  # mean return and count of the fewest latest whole rounds with at least 20 honest episodes
        count, total = 0, 0.0
        for n, r in reversed(state["recent"]):
            count, total = count + n, total + r
            if count >= 20:
                break
        return (total / count if count else float("nan")), count

    # What crosses the wire each round: theta down to every client; up from every client one row, its update and
    # META numbers (client id, env steps, number and sum of its episodes' returns, for the logs). Never
    # observations, actions or per-step rewards.
    META = 4
    bytes_down, bytes_up = D * 4, (D + META) * 4
    train_start, last_print, steps_at_start, sps = time.time(), 0.0, state["global_step"], 0.0
    while True:
        # One collective carries theta, eta_t and the stop decision from rank 0, and every rank's signal flag.
        head = torch.zeros(D + 3, dtype=torch.float64)
        if rank == 0:
            done = state["global_step"] / args.total_timesteps
            head[:D], head[D], head[D + 2] = theta, float(done >= 1), args.learning_rate * (1 - done if args.anneal_lr else 1)
        head[D + 1] = float(STOP["signal"] != 0)
        if world > 1:
            dist.all_reduce(head)
        theta, eta = head[:D].float(), float(head[D + 2])
        if head[D] > 0 or head[D + 1] > 0:
            break
        if rank == 0 and args.checkpoint_every and state["round"] % args.checkpoint_every == 0 and state["global_step"] > steps_at_start:
            checkpoint()
        t0, rows = time.time(), torch.zeros(per_rank, META + D)
        rows[:, 0] = -1  # padding rows
        for j, k in enumerate(mine):
            u, steps, rets = client_update(args, policy, theta, eta, state["round"], k, k in byzantine, max_steps)
            rows[j, :META], rows[j, META:] = torch.tensor([k, steps, len(rets), sum(rets)]), u
        client_time = time.time() - t0
        if world > 1:
            gathered = [torch.empty_like(rows) for _ in range(world)] if rank == 0 else None
            dist.gather(rows, gathered, dst=0)
            rows = torch.cat(gathered) if rank == 0 else rows
        state["round"] += 1
        if rank != 0:
            continue
        rows = rows[rows[:, 0] >= 0]
        assert torch.equal(rows[:, 0], torch.arange(K, dtype=torch.float32))
        t1 = time.time()
        theta, info = server_update(args, policy, theta, eta, rows[:, META:], rows[:, 1], state["round"] - 1,
                                    state["server_trajectories"], max_steps)
        server_time = time.time() - t1
        state["global_step"] += int(rows[:, 1].sum()) + info["server_steps"]
        trajectories = state["round"] * args.B * args.local_updates  # each client's, so far
        state["server_trajectories"] += info["server_trajectories"]
        kept_byzantine, kept_honest = float(info["kept"][~honest].float().mean()), float(info["kept"][honest].float().mean())
        state["kept_byzantine"] += kept_byzantine if byzantine else 0.0
        state["kept_honest"] += kept_honest
        round_return = float(rows[honest, 3].sum() / rows[honest, 2].sum())  # honest clients' episodes
        state["recent"] = state["recent"][-19:] + [[int(rows[honest, 2].sum()), float(rows[honest, 3].sum())]]
        recent_mean, recent_count = last20()
        if threshold is not None and state["time_to_threshold_s"] is None and recent_count >= 20 and recent_mean >= threshold:
            state.update(time_to_threshold_s=state["wall_time_s"] + time.time() - PROCESS_START,
                         threshold_step=state["global_step"], threshold_trajectories=trajectories)
        if args.eval_every and state["round"] % args.eval_every == 0:
            eval_return = float(evaluate(policy, theta, args.env_id, args.eval_episodes, args.seed + 10**6, max_steps).mean())
            writer.add_scalar("eval/round_return", eval_return, trajectories)
            if threshold is not None and state["eval_threshold_trajectories"] is None and eval_return >= threshold:
                state["eval_threshold_trajectories"] = trajectories
        now = time.time()
        sps = state["global_step"] / (state["train_time_s"] + now - train_start)  # whole run
        scalars = {"charts/episodic_return": round_return, "charts/SPS": sps, "charts/learning_rate": eta,
                   "charts/trajectories_per_client": trajectories, "losses/theta_norm": float(theta.norm()),
                   "losses/update_norm_median": float(rows[:, META:].norm(dim=1).median()),
                   "stats/bytes_per_client_up": bytes_up, "stats/bytes_per_client_down": bytes_down,
                   "stats/bytes_per_round": K * (bytes_up + bytes_down), "stats/client_time_s": client_time,
                   "stats/server_time_s": server_time, "stats/round": state["round"], "stats/kept_honest": kept_honest,
                   **({"stats/kept_byzantine": kept_byzantine} if byzantine else {}), "stats/N_t": info["N_t"],
                   "stats/omega_max": info["omega_max"], "stats/filter_r2": float(info["r2"]),
                   "stats/server_trajectories": state["server_trajectories"]}
        for key, value in scalars.items():
            writer.add_scalar(key, value, state["global_step"])
        if now - last_print > 2.0:
            last_print = now
            print(f"round {state['round']} global_step={state['global_step']} SPS={sps:.0f} trajectories/client="
                  f"{trajectories} return={round_return:.1f} kept={int(info['kept'].sum())}/{K}", flush=True)
    if head[D + 1] > 0:  # SIGTERM/SIGUSR1 on some rank (SLURM preemption): save, then exit cleanly
        if rank == 0:
            checkpoint()
            print(f"signal received: checkpoint of round {state['round']} written to {ckpt_path}; rerun with --resume")
    elif rank == 0:
        wall, rounds = state["train_time_s"] + time.time() - train_start, max(state["round"], 1)
        eval_returns = evaluate(policy, theta, args.env_id, args.eval_episodes, args.seed + 10**6, max_steps)
        for i, r in enumerate(eval_returns):
            writer.add_scalar("eval/episodic_return", r, i)
        summary = {"algo": "fedpg", "aggregator": args.aggregator, "env_id": args.env_id, "seed": args.seed,
                   "world_size": world, "num_clients": K, "num_byzantine": args.num_byzantine, "attack": args.attack,
                   "byzantine_clients": byzantine, "heterogeneity": args.heterogeneity, "learning_rate": args.learning_rate,
                   "global_step": state["global_step"], "rounds": state["round"],
                   "trajectories_per_client": state["round"] * args.B * args.local_updates, "server_trajectories": state["server_trajectories"],
                   "wall_time_s": state["wall_time_s"] + time.time() - PROCESS_START, "sps": state["global_step"] / wall,
                   "train_time_s": wall,
                   "eval_return_mean": float(np.mean(eval_returns)), "eval_return_std": float(np.std(eval_returns)),
                   "train_return_last20": last20()[0] if state["recent"] else None,
                   "time_to_threshold_s": state["time_to_threshold_s"], "threshold_step": state["threshold_step"],
                   "trajectories_per_client_to_threshold": state["threshold_trajectories"], "reward_threshold": threshold,
                   "trajectories_per_client_to_eval_threshold": state["eval_threshold_trajectories"],
                   "num_params": D, "bytes_per_client_per_round": bytes_up + bytes_down,
                   "kept_byzantine_mean": state["kept_byzantine"] / rounds if byzantine else None,
                   "kept_honest_mean": state["kept_honest"] / rounds,
                   "theta_sha256": hashlib.sha256(theta.numpy().tobytes()).hexdigest()}
        with open(os.path.join(run_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        if args.save_model:
            save_checkpoint(os.path.join(run_dir, "model.pt"), {"theta": theta})
        print(f"eval return {summary['eval_return_mean']:.1f} +- {summary['eval_return_std']:.1f}; time to threshold: "
              f"{state['time_to_threshold_s']}; summary in {run_dir}/summary.json", flush=True)
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

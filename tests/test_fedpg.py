"""Federated policy gradient: estimators, the Byzantine filter and the aggregators against slow references written
from the papers, FedAvg against the centralized update, process-count invariance, and whole runs."""

import math

import numpy as np
import pytest
import torch
from conftest import (
    LEARNED_FLOOR,
    SUMMARY_KEYS,
    assert_same_result,
    assert_solves,
    assert_video_of_the_first_eval_episode,
    check_ok,
    load_algo,
)

fp = load_algo("fedpg")
ENV = "CartPole-v1"
SPEC = fp.envpool.make_spec(ENV)


def policy_and_theta(seed=0, hidden=(8, 8), spec=SPEC):
    policy = fp.Policy(spec.observation_space.shape[0], spec.action_space, hidden)
    torch.manual_seed(seed)
    theta = policy.init_params()
    return policy, theta + 0.3 * torch.randn(theta.shape)  # away from the near-uniform initial policy


def batch_from_envs(policy, theta, num, seed, env_id=ENV, pole_scale=None, mode="sample"):
    envs = fp.make_env(env_id, num, seed, pole_scale=pole_scale)
    return fp.sample_trajectories(policy, theta, envs, num, 500, torch.Generator().manual_seed(seed), mode)


def trajectories(batch):
    """The batch as a list of trajectories: (obs, actions, rewards) of each column's valid steps."""
    out = []
    for j in range(batch["valid"].shape[1]):
        n = int(batch["valid"][:, j].sum())
        out.append((batch["obs"][:n, j], batch["actions"][:n, j], batch["rewards"][:n, j].tolist()))
    return out


def weights_reference(rewards, gamma):
    """Reward-to-go of every step of one trajectory, standardized over the trajectory (population std)."""
    G = [sum(gamma ** (h - t) * rewards[h] for h in range(t, len(rewards))) for t in range(len(rewards))]
    mean = sum(G) / len(G)
    std = math.sqrt(sum((g - mean) ** 2 for g in G) / len(G))
    return [(g - mean) / (std + 1e-8) for g in G]


def grad_log_prob(policy, theta, obs, action):
    th = theta.detach().clone().requires_grad_()
    lp = policy.log_prob(th, obs[None], action[None])[0]
    return torch.autograd.grad(lp, th)[0].double(), float(lp)


# ------------------------------------------------------------------------------------------ pure functions
def test_trajectory_weights_match_reference():
    rewards = torch.tensor([[1.0, 2.0, 0.5], [0.0, -1.0, 0.5], [3.0, 0.0, 0.5], [1.0, 0.0, 0.0]])
    valid = torch.tensor([[1.0, 1, 1], [1, 1, 1], [1, 0, 1], [1, 0, 0]])
    w = fp.trajectory_weights(rewards * valid, valid, 0.9)
    for j in range(3):
        n = int(valid[:, j].sum())
        np.testing.assert_allclose(
            w[:n, j].numpy(), weights_reference(rewards[:n, j].tolist(), 0.9), rtol=1e-5, atol=1e-6
        )
        assert (w[n:, j] == 0).all()


def test_trajectories_stop_at_the_first_episode_end_and_mask_the_rest():
    """Each column is one episode from its reset: valid is a prefix of ones, CartPole's reward is 1 on each valid
    step and 0 after (envpool's reset step and the next episode are masked), lengths are those of the episodes."""
    policy, theta = policy_and_theta()
    batch = batch_from_envs(policy, theta, 8, 3)
    v = batch["valid"]
    assert (v[1:] <= v[:-1]).all() and v[0].all()
    assert torch.equal(batch["rewards"] * v, v)
    returns, lengths = (batch["rewards"] * v).sum(0), v.sum(0)
    assert (returns == lengths).all() and lengths.max() == v.shape[0] and 1 <= lengths.min()


def g_sum(policy, theta, obs, act, rew, gamma=0.99):
    """sum_t grad log pi_theta(a_t | s_t) w_t over one trajectory, one step at a time."""
    w = weights_reference(rew, gamma)
    return sum(grad_log_prob(policy, theta, obs[t], act[t])[0] * w[t] for t in range(len(rew)))


def test_policy_gradient_matches_per_step_reference():
    """g^ = sum over trajectories and steps of grad log pi(a_t | s_t) w_t / the batch's steps."""
    policy, theta = policy_and_theta()
    batch = batch_from_envs(policy, theta, 4, 5)
    trajs = trajectories(batch)
    ref = sum(g_sum(policy, theta, *traj) for traj in trajs) / sum(len(t[2]) for t in trajs)
    np.testing.assert_allclose(fp.policy_gradient(policy, theta, batch, 0.99).numpy(), ref.numpy(), atol=1e-6)


def test_semi_stochastic_gradient_matches_reference():
    """v = sum_j sum_t [grad log pi_n w_t - omega_j grad log pi_0 w_t] / sum_j L_j + mu, omega_j = prod_t pi_0(a_t|s_t)
    / pi_n(a_t|s_t) (the per-step-mean form of the paper's 1/b sum_j [g(tau_j|theta_n) - omega_j g(tau_j|theta_0)])."""
    policy, theta_0 = policy_and_theta()
    theta_n = theta_0 + 0.05 * torch.randn(theta_0.shape, generator=torch.Generator().manual_seed(1))
    batch = batch_from_envs(policy, theta_n, 3, 9)
    mu = torch.randn(policy.num_params)
    g_n, g_0, steps, omegas = 0, 0, 0, []
    for obs, act, rew in trajectories(batch):
        ratio = math.prod(
            math.exp(
                grad_log_prob(policy, theta_0, obs[t], act[t])[1] - grad_log_prob(policy, theta_n, obs[t], act[t])[1]
            )
            for t in range(len(rew))
        )
        omegas.append(ratio)
        g_n, steps = g_n + g_sum(policy, theta_n, obs, act, rew), steps + len(rew)
        g_0 = g_0 + ratio * g_sum(policy, theta_0, obs, act, rew)
    v, omega = fp.semi_stochastic_gradient(policy, theta_0, theta_n, mu, batch, 0.99)
    np.testing.assert_allclose(omega.numpy(), omegas, rtol=1e-4)
    np.testing.assert_allclose(v.numpy(), ((g_n - g_0) / steps + mu.double()).numpy(), atol=1e-5)
    assert not np.allclose(omegas, 1.0)


def test_server_samples_b_trajectories_per_inner_step_after_the_first():
    """v_0 = mu (at theta_0 the mini-batch terms cancel): a round with N_t = 1 is the step theta + eta clip(mu) and
    samples nothing; in general the server samples b (N_t - 1) trajectories; N_t = 0 leaves theta."""
    policy, theta = policy_and_theta()
    args = fp.RunArgs(aggregator="fedpg-br", sigma=10.0)  # a radius that keeps every gradient
    u = 0.01 * torch.randn(10, policy.num_params, generator=torch.Generator().manual_seed(0))
    seen = set()
    for round_ in range(60):
        if seen == {0, 1, 2}:
            break
        new, info = fp.server_update(args, policy, theta, 2.0, u, torch.full((10,), 16.0), round_, 0, 500)
        N_t = info["N_t"]
        seen.add(min(N_t, 2))
        assert info["kept"].all() and info["server_trajectories"] == args.b * max(N_t - 1, 0)
        assert torch.equal(new, theta) == (N_t == 0)
        if N_t == 1:
            torch.testing.assert_close(new, theta + 2.0 * fp.clip_norm(u.mean(0), args.max_grad_norm))
    assert seen == {0, 1, 2}  # every case occurred


def test_N_t_follows_the_geometric_law_with_mean_B_over_b():
    rng = np.random.default_rng(0)
    draws = np.array([fp.sample_N_t(rng, 16, 4) for _ in range(40000)])
    gamma = 16 / 20
    assert draws.min() == 0 and abs(draws.mean() - 4) < 0.1
    for n in range(4):
        assert abs((draws == n).mean() - gamma**n * (1 - gamma)) < 0.01


def filter_reference(mus, B, sigma, delta, alpha):
    """Algorithm 1's filter, read literally, on a list of vectors: R1 with T_mu = 2 sigma sqrt(V / B), V = 2 log(2K /
    delta); R2 with radius 2 sigma when R1 keeps fewer than (1 - alpha) K."""
    K = len(mus)
    d = lambda x, y: math.sqrt(sum((a - b) ** 2 for a, b in zip(x, y, strict=True)))  # noqa: E731

    def rule(radius):
        S = [m for m in mus if sum(d(m, o) <= radius for o in mus) > K / 2]
        if not S:
            return [False] * K
        mean = [sum(c) / len(S) for c in zip(*S, strict=True)]
        mom = min(S, key=lambda m: d(m, mean))
        return [d(m, mom) <= radius for m in mus]

    good = rule(2 * sigma * math.sqrt(2 * math.log(2 * K / delta) / B))
    return (rule(2 * sigma), True) if sum(good) < (1 - alpha) * K else (good, False)


def test_filter_matches_reference_on_random_cases():
    """60 random cases (K = 1 to 11), covering R1 alone, R2, and an empty S (nothing kept)."""
    cases = set()
    for seed in range(60):
        g = torch.Generator().manual_seed(seed)
        K, D = int(torch.randint(1, 12, (1,), generator=g)), 5
        mus = torch.randn(D, generator=g) + torch.rand(1, generator=g) * torch.randn(K, D, generator=g)
        sigma = float(torch.rand(1, generator=g)) * 2
        kept, r2 = fp.byzantine_filter(mus, 16, sigma, 0.6, 0.4)
        ref, ref_r2 = filter_reference(mus.double().tolist(), 16, sigma, 0.6, 0.4)
        assert kept.tolist() == ref and r2 == ref_r2, seed
        cases.add("empty" if not any(ref) else "R2" if r2 else "R1")
    assert cases == {"R1", "R2", "empty"}


def test_filter_keeps_honest_and_rejects_sign_flipped_and_noisy_gradients():
    """7 honest gradients (a common direction plus estimation noise), 2 sign-flipped (-2.5x), 1 with large noise."""
    g = torch.Generator().manual_seed(0)
    true = torch.randn(50, generator=g)
    honest = true + 0.05 * torch.randn(7, 50, generator=g)  # honest pairs 0.39-0.57 apart
    mus = torch.cat([honest, -2.5 * honest[:2], true + 10 * torch.randn(1, 50, generator=g)])
    kept, r2 = fp.byzantine_filter(mus, 16, 0.5, 0.6, 0.4)  # T_mu = 0.66
    assert kept.tolist() == [True] * 7 + [False] * 3 and not r2
    assert kept.tolist() == filter_reference(mus.double().tolist(), 16, 0.5, 0.6, 0.4)[0]
    kept, r2 = fp.byzantine_filter(mus, 16, 0.3, 0.6, 0.4)  # T_mu = 0.40 keeps too few (R1): R2's 2 sigma = 0.6 does
    assert r2 and kept.tolist() == [True] * 7 + [False] * 3


def test_robust_aggregators_match_numpy():
    u = torch.randn(7, 20, generator=torch.Generator().manual_seed(0))
    np.testing.assert_allclose(fp.coordinate_median(u).numpy(), np.median(u.numpy(), 0), rtol=1e-6)
    np.testing.assert_allclose(fp.coordinate_median(u[:6]).numpy(), np.median(u[:6].numpy(), 0), rtol=1e-6)
    s = np.sort(u.numpy(), 0)
    np.testing.assert_allclose(fp.trimmed_mean(u, 0.3).numpy(), s[2:5].mean(0), rtol=1e-6)
    torch.testing.assert_close(fp.trimmed_mean(u, 0.0), u.mean(0))


def test_attacks():
    u = torch.randn(30)
    g = torch.Generator().manual_seed(0)
    u[20:] *= 100  # a second parameter tensor on another scale: the noise follows each tensor's own range
    assert torch.equal(fp.corrupt(u, "sign-flip", g, [20, 10]), -2.5 * u)
    noise = fp.corrupt(u, "random-noise", g, [20, 10]) - u
    for part, c in zip(noise.split([20, 10]), u.split([20, 10]), strict=True):
        span = float(c.max() - c.min())
        assert part.abs().max() <= 3 * span and part.abs().max() > span
    assert torch.equal(fp.corrupt(u, "random-action", g, [20, 10]), u)  # that attack acts on the sampling
    policy, theta = policy_and_theta()
    theta[-2:] = torch.tensor([-20.0, 20.0])  # output biases: the policy pushes right (action 1) in every state
    honest = fp.client_update(fp.RunArgs(B=32), policy, theta, 0.0, 0, 0, False, 500)
    byzantine = fp.client_update(fp.RunArgs(B=32, attack="random-action"), policy, theta, 0.0, 0, 0, True, 500)
    assert np.mean(honest[2]) < 11 < 16 < np.mean(byzantine[2])  # always right falls at once; random lasts ~22 steps
    batch = batch_from_envs(policy, theta, 64, 1, mode="random")
    assert abs(float(batch["actions"][batch["valid"].bool()].float().mean()) - 0.5) < 0.05


def test_byzantine_clients_are_a_seeded_choice():
    assert fp.byzantine_clients(1, 10, 3) == fp.byzantine_clients(1, 10, 3)
    assert len(set(fp.byzantine_clients(1, 10, 3))) == 3 and fp.byzantine_clients(1, 10, 0) == []
    assert len({tuple(fp.byzantine_clients(seed, 10, 3)) for seed in range(20)}) > 10  # the seed decides


def test_heterogeneous_clients_have_other_pole_lengths():
    args = fp.Args(heterogeneity=0.5)
    assert [round(fp.pole_scale(args, k), 6) for k in (0, 9)] == [0.5, 1.5]
    assert fp.pole_scale(fp.Args(), 3) is None
    short, long_ = fp.make_env(ENV, 2, 0, pole_scale=0.5), fp.make_env(ENV, 2, 0, pole_scale=1.5)
    o1, o2 = short.reset()[0], long_.reset()[0]
    assert np.array_equal(o1, o2)  # same seed, same start
    for _ in range(5):
        o1, o2 = short.step(np.zeros(2, dtype=np.int64))[0], long_.step(np.zeros(2, dtype=np.int64))[0]
    assert not np.allclose(o1, o2) and short.length == 0.25 and short.polemass_length == pytest.approx(0.025)


def test_fedavg_with_one_local_step_equals_the_centralized_update_on_the_pooled_batch():
    """K clients, E = 1, plain SGD (no clipping), full participation, weights by samples: the average of the client
    models is theta + eta * (gradient of the mean over all K batches' steps)."""
    policy, theta = policy_and_theta()
    args = fp.RunArgs(num_clients=3, max_grad_norm=0.0, B=4)
    eta, rows, batches = 0.5, [], []
    for k in range(3):
        u, steps, _ = fp.client_update(args, policy, theta, eta, 0, k, False, 500)
        rows.append((u, steps))
        gen = torch.Generator().manual_seed(int(np.random.SeedSequence([args.seed, 0, k]).generate_state(1)[0]))
        envs = fp.make_env(ENV, args.B, fp.client_env_seed(args, 0, 0, k))
        batches.append(fp.sample_trajectories(policy, theta, envs, args.B, 500, gen))
    new, _ = fp.server_update(
        args,
        policy,
        theta,
        eta,
        torch.stack([r[0] for r in rows]),
        torch.tensor([float(r[1]) for r in rows]),
        0,
        0,
        500,
    )
    T = max(b["valid"].shape[0] for b in batches)
    pad = lambda x: torch.cat([x, x.new_zeros((T - x.shape[0], *x.shape[1:]))])  # noqa: E731
    pooled = {key: torch.cat([pad(b[key]) for b in batches], 1) for key in batches[0]}
    assert int(pooled["valid"].sum()) == sum(r[1] for r in rows)
    central = theta + eta * fp.policy_gradient(policy, theta, pooled, args.gamma)
    torch.testing.assert_close(new, central, rtol=0, atol=1e-6)
    assert not torch.allclose(new, theta, atol=1e-4)


def test_gaussian_policy_log_prob_and_sampling():
    spec = fp.envpool.make_spec("Pendulum-v1")
    policy, theta = policy_and_theta(spec=spec)
    obs = torch.randn(5, 3)
    a = policy.sample(theta, obs, torch.Generator().manual_seed(0))
    mean, std = policy.forward(theta, obs), theta[-1].exp()
    ref = (-((a - mean) ** 2) / (2 * std**2) - std.log() - 0.5 * math.log(2 * math.pi)).sum(-1)
    torch.testing.assert_close(policy.log_prob(theta, obs, a), ref)
    many = policy.sample(theta, obs[:1].expand(20000, 3), torch.Generator().manual_seed(1))
    assert abs(float(many.mean() - mean[0, 0])) < 0.03 and abs(float(many.std() - std)) < 0.03
    spec = fp.envpool.make_spec(ENV)
    policy, theta = policy_and_theta(spec=spec)
    o = torch.randn(1, 4)
    freq = policy.sample(theta, o.expand(20000, 4), torch.Generator().manual_seed(1)).float().mean()
    assert abs(float(freq) - float(policy.log_prob(theta, o, torch.ones(1, dtype=torch.long)).exp())) < 0.02


# ------------------------------------------------------------------------------------------ whole runs
def test_smoke_torchrun_two_clients(runner):
    check_ok(
        runner.run(
            "fedpg",
            "--num-clients",
            2,
            "--total-timesteps",
            3000,
            "--eval-episodes",
            2,
            "--save-model",
            "--capture-video",
            nproc=2,
        )
    )
    s = runner.summary(ENV, "fedpg")
    assert SUMMARY_KEYS <= s.keys() and s["algo"] == "fedpg" and s["world_size"] == 2 and s["global_step"] >= 3000
    assert s["num_params"] == (4 * 16 + 16) + (16 * 16 + 16) + (16 * 2 + 2)  # the 16-16 MLP on CartPole
    assert s["bytes_per_client_per_round"] == 4 * (2 * 386 + 4)  # theta down; update and 4 numbers up
    assert (runner.run_dir(ENV, "fedpg") / "model.pt").exists()
    assert_video_of_the_first_eval_episode(runner.run_dir(ENV, "fedpg"))  # the server evaluates


@pytest.mark.learning
def test_learns_cartpole_with_a_short_budget(runner):
    """A third of the defaults' budget (conventions §9): with --total-timesteps 500000 the final evaluation reached
    LEARNED_FLOOR on every one of 10 seeds (494-500 on the AMD EPYC; `python benchmark/run.py learning_proofs`,
    learning_proofs_short_cartpole.json). One of seeds 1-3 must reach it."""
    assert_solves(runner, "fedpg", "--total-timesteps", 500_000, threshold=LEARNED_FLOOR)


@pytest.mark.learning
def test_fedpg_br_learns_cartpole_with_3_of_10_sign_flipping_clients(runner):
    """The same budget with FedPG-BR against 3 of 10 sign-flipping clients: 224-500 over 10 seeds (the same run)."""
    args = ["--aggregator", "fedpg-br", "--num-byzantine", 3, "--attack", "sign-flip", "--total-timesteps", 500_000]
    assert_solves(runner, "fedpg", *args, threshold=LEARNED_FLOOR)


@pytest.mark.parametrize(
    "extra",
    [
        ["--aggregator", "fedpg-br", "--num-byzantine", 3, "--attack", "random-noise"],
        ["--aggregator", "median", "--heterogeneity", 0.5, "--local-updates", 2],
        ["--aggregator", "trimmed-mean", "--num-byzantine", 2, "--attack", "random-action"],
    ],
    ids=["fedpg-br", "median-heterogeneous", "trimmed-mean"],
)
def test_result_does_not_depend_on_the_process_count(runner, extra):
    """The same K clients hosted by 1, 3 and 2 (torchrun) processes give the same bits: clients' seeds and random
    draws follow the client index and round, never the process that hosts the client."""
    budget = ["--total-timesteps", 20_000, *extra]
    check_ok(runner.run("fedpg", *budget, "--exp-name", "one", "--num-workers", 1))
    check_ok(runner.run("fedpg", *budget, "--exp-name", "three", "--num-workers", 3))
    check_ok(runner.run("fedpg", *budget, "--exp-name", "two", nproc=2))
    one = runner.summary(ENV, "one")
    assert one["rounds"] >= 2 and runner.summary(ENV, "three")["world_size"] == 3
    assert_same_result(one, runner.summary(ENV, "three"))
    assert_same_result(one, runner.summary(ENV, "two"))


def test_byzantine_clients_are_logged_and_filtered(runner):
    check_ok(
        runner.run(
            "fedpg",
            "--aggregator",
            "fedpg-br",
            "--num-byzantine",
            3,
            "--attack",
            "random-noise",
            "--total-timesteps",
            60_000,
            "--eval-every",
            1,
        )
    )
    s = runner.summary(ENV, "fedpg")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(runner.run_dir(ENV, "fedpg")))
    events.Reload()
    evals = events.Scalars("eval/round_return")  # --eval-every 1: one greedy evaluation per round
    assert [e.step for e in evals] == [16 * (r + 1) for r in range(s["rounds"])]
    reached = [e.step for e in evals if e.value >= 475]
    assert s["trajectories_per_client_to_eval_threshold"] == (reached[0] if reached else None)
    assert s["byzantine_clients"] == fp.byzantine_clients(1, 10, 3) and s["kept_byzantine_mean"] == 0.0
    assert s["kept_honest_mean"] > 0.5 and s["server_trajectories"] > 0


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "Hopper-v4"])
def test_continuous_actions_run(runner, env_id):
    check_ok(
        runner.run(
            "fedpg",
            "--env-id",
            env_id,
            "--num-clients",
            2,
            "--aggregator",
            "fedpg-br",
            "--total-timesteps",
            3000,
            "--eval-episodes",
            1,
        )
    )
    assert runner.summary(env_id, "fedpg")["global_step"] >= 3000


def test_resume_refuses_a_checkpoint_of_another_configuration(runner):
    check_ok(runner.run("fedpg", "--total-timesteps", 10_000, "--checkpoint-every", 1, "--eval-episodes", 1))
    proc = runner.run("fedpg", "--total-timesteps", 20_000, "--resume", "--aggregator", "median", "--num-workers", 2)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "--resume" in lines[0], proc.stderr
    assert "--aggregator fedavg (now --aggregator median)" in lines[0], lines[0]

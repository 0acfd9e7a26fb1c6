"""ES: the estimator and its parts against slow references, worker-count invariance, and whole runs."""

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import (
    ROOT,
    SUMMARY_KEYS,
    assert_same_result,
    assert_solves,
    assert_video_of_the_first_eval_episode,
    check_ok,
    load_algo,
)

es = load_algo("es")
ENV = "CartPole-v1"


# ------------------------------------------------------------------------------------------ pure functions
def centered_ranks_reference(values):
    """Rank of each value = number of smaller values + (number of equal others) / 2; scaled to [-0.5, 0.5]."""
    n = len(values)
    return [(sum(w < v for w in values) + (sum(w == v for w in values) - 1) / 2) / (n - 1) - 0.5 for v in values]


@pytest.mark.parametrize("seed", [0, 1])
def test_centered_ranks_match_reference(seed):
    x = np.random.default_rng(seed).integers(0, 6, size=(7, 2)).astype(float)  # many ties
    np.testing.assert_allclose(es.centered_ranks(x).ravel(), centered_ranks_reference(list(x.ravel())))
    np.testing.assert_allclose(es.centered_ranks(np.array([3.0, 1.0, 2.0])), [0.5, -0.5, 0.0])
    assert es.centered_ranks(x).sum() == pytest.approx(0.0)


def test_centered_ranks_of_one_value_or_a_constant_fitness_are_zero():
    """The docstring's promise: a constant fitness gives all-zero weights, a single value included (it used to
    give NaN: its rank over size - 1 was 0 / 0)."""
    assert es.centered_ranks(np.array([7.0])).tolist() == [0.0]
    assert es.centered_ranks(np.array([[3.0]])).shape == (1, 1)
    assert not es.centered_ranks(np.full(5, 2.0)).any()


def test_antithetic_pairs_cancel_a_constant_fitness():
    noise = es.noise_table(0, 10_000)
    shaped = es.centered_ranks(np.full((16, 2), 500.0))
    g = es.es_gradient(noise, list(range(0, 1600, 100)), shaped[:, 0] - shaped[:, 1], 50)
    assert torch.count_nonzero(g) == 0


def test_estimator_points_along_the_true_gradient_of_a_quadratic():
    """F(theta) = -|theta - target|^2: the ES estimate (raw and rank-shaped) has a high cosine with
    -2(theta - target)."""
    dim, pairs, sigma = 20, 1000, 0.05
    noise = es.noise_table(3, 200_000)
    rng = np.random.default_rng(0)
    theta, target = torch.zeros(dim), torch.as_tensor(rng.normal(size=dim), dtype=torch.float32)
    indices = rng.integers(0, noise.numel() - dim + 1, size=pairs)
    eps = torch.stack([noise[i : i + dim] for i in indices])
    fitness = lambda p: -((p - target) ** 2).sum(-1)  # noqa: E731
    returns = torch.stack([fitness(theta + sigma * eps), fitness(theta - sigma * eps)], 1).numpy()
    true_grad = -2 * (theta - target)
    for weights in [returns[:, 0] - returns[:, 1], es.centered_ranks(returns)[:, 0] - es.centered_ranks(returns)[:, 1]]:
        g = es.es_gradient(noise, indices, weights, dim)
        assert torch.nn.functional.cosine_similarity(g, true_grad, dim=0) > 0.9
    # and the raw estimator is unbiased with the right scale: sum_i (F+ - F-) eps_i / (2n) ~ sigma * grad, with a
    # relative error of about sqrt(dim / pairs) = 0.14
    raw = es.es_gradient(noise, indices, returns[:, 0] - returns[:, 1], dim)
    assert (raw / sigma - true_grad).norm() / true_grad.norm() < 0.3


def test_es_gradient_equals_a_weighted_sum_of_noise_slices():
    noise = es.noise_table(1, 1000)
    indices, weights = [5, 300, 7], np.array([0.5, -1.0, 0.25])
    expected = sum(w * noise[i : i + 10] for i, w in zip(indices, weights, strict=True)) / 6
    torch.testing.assert_close(es.es_gradient(noise, indices, weights, 10), expected)


def test_update_applies_weight_decay():
    """With a constant fitness the estimate is zero and the step is Adam's step on l2_coeff * theta: it shrinks
    theta."""
    args = es.Args(l2_coeff=0.005)
    theta = torch.ones(10)
    optimizer = torch.optim.Adam([theta], lr=args.learning_rate, eps=1e-8)
    gnorm = es.es_update(theta, optimizer, es.noise_table(0, 100), [0, 10], np.ones((2, 2)), args)
    assert gnorm == 0.0
    torch.testing.assert_close(theta, torch.ones(10) - args.learning_rate)  # Adam's first step has magnitude lr


def test_observation_statistics():
    obs = torch.tensor([[1.0, 2.0], [3.0, 6.0]], dtype=torch.float64)
    stat = torch.cat([obs.sum(0), (obs**2).sum(0), torch.tensor([2.0])])
    mean, std = es.obs_mean_std(stat, 2)
    torch.testing.assert_close(mean, torch.tensor([2.0, 4.0]))
    torch.testing.assert_close(std, torch.tensor([1.0, 2.0]))


def test_batched_policy_matches_one_network_per_individual():
    import gymnasium as gym

    policy = es.Policy(4, gym.spaces.Discrete(3), (8, 5))
    g = torch.Generator().manual_seed(0)
    params = torch.stack([policy.init_params(g) + 0.3 * torch.randn(policy.num_params, generator=g) for _ in range(6)])
    obs = torch.randn(6, 4, generator=g)
    out = policy.forward(params, obs)
    for p in range(6):
        offset, h = 0, obs[p]
        for k, (o, i) in enumerate(policy.shapes):
            w, b = params[p, offset : offset + o * i].view(o, i), params[p, offset + o * i : offset + o * i + o]
            offset += o * i + o
            h = w @ h + b
            h = torch.tanh(h) if k < len(policy.shapes) - 1 else h
        torch.testing.assert_close(out[p], h)
    np.testing.assert_array_equal(policy.act(params, obs), out.argmax(-1).numpy())


def test_noise_table_is_identical_across_processes():
    """A fresh process with other thread settings builds the same table from the same seed."""
    code = (
        "import sys, hashlib, torch; sys.path.insert(0, 'tests'); from conftest import load_algo; "
        "torch.set_num_threads(2); "
        "print(hashlib.sha256(load_algo('es').noise_table(7, 2**20).numpy().tobytes()).hexdigest())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    ).stdout.strip()
    torch.set_num_threads(1)
    assert out == hashlib.sha256(es.noise_table(7, 2**20).numpy().tobytes()).hexdigest()


def test_noise_indices_depend_on_seed_and_generation_only():
    a = es.sample_noise_indices(1, 3, 24, 10_000, 100)
    assert np.array_equal(a, es.sample_noise_indices(1, 3, 24, 10_000, 100))
    assert not np.array_equal(a, es.sample_noise_indices(1, 4, 24, 10_000, 100))
    assert a.min() >= 0 and a.max() <= 10_000 - 100


# ------------------------------------------------------------------------------------------ whole runs
def test_smoke_torchrun_two_workers(runner):
    check_ok(
        runner.run("es", "--total-timesteps", 2000, "--eval-episodes", 2, "--save-model", "--capture-video", nproc=2)
    )
    s = runner.summary(ENV, "es")
    assert SUMMARY_KEYS <= s.keys() and s["algo"] == "es" and s["world_size"] == 2 and s["global_step"] >= 2000
    assert s["bytes_per_generation"] == 24 * (7 + 2 * 4) * 8 < s["gradient_bytes"]  # 24 pairs, CartPole: 4 features
    assert (runner.run_dir(ENV, "es") / "model.pt").exists()
    assert_video_of_the_first_eval_episode(runner.run_dir(ENV, "es"))  # rank 0 evaluates


@pytest.mark.learning
def test_learns_cartpole_with_defaults(runner):
    assert_solves(runner, "es")


def test_result_does_not_depend_on_worker_count(runner):
    """The same seed with 1 worker and with 2 spawned workers gives the same bits."""
    budget = ["--total-timesteps", 60_000]
    check_ok(runner.run("es", *budget, "--exp-name", "one"))
    one = runner.summary(ENV, "one")
    check_ok(runner.run("es", *budget, "--exp-name", "two", "--num-workers", 2))
    two = runner.summary(ENV, "two")
    assert two["world_size"] == 2
    assert_same_result(one, two)


def test_a_worker_without_pairs_runs_and_changes_nothing(runner):
    """7 workers share the default 24 pairs in blocks of 4: the last worker gets none (envpool refuses an empty
    batch, so it must not make one) and the result is still that of 1 worker."""
    budget = ["--total-timesteps", 12_000]
    check_ok(runner.run("es", *budget, "--exp-name", "one"))
    check_ok(runner.run("es", *budget, "--exp-name", "seven", "--num-workers", 7))
    assert_same_result(runner.summary(ENV, "one"), runner.summary(ENV, "seven"))


def test_mujoco_continuous_actions_run(runner):
    check_ok(
        runner.run(
            "es",
            "--env-id",
            "Hopper-v4",
            "--total-timesteps",
            500,
            "--population-size",
            4,
            "--eval-episodes",
            1,
            "--adaptive-cap",
        )
    )
    assert runner.summary("Hopper-v4", "es")["global_step"] >= 500

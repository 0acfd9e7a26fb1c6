"""Deep GA: the seed-list encoding, selection and the elite against slow references, worker-count invariance,
and whole runs."""

import hashlib

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import (
    SUMMARY_KEYS,
    assert_same_result,
    assert_solves,
    assert_video_of_the_first_eval_episode,
    check_ok,
    load_algo,
)

ga = load_algo("ga")
ENV = "CartPole-v1"
SIGMA = 0.05


@pytest.fixture(scope="module")
def setup():
    policy = ga.Policy(4, gym.spaces.Discrete(2), (16, 16))
    return policy, ga.noise_table(0, 2**16)


# ------------------------------------------------------------------------------------------ pure functions
def test_params_from_seed_list_equal_step_by_step_mutation(setup):
    policy, noise = setup
    seeds = [12345, 7, 900, 31, 4000]
    theta = policy.init_params(torch.Generator().manual_seed(12345))
    for offset in seeds[1:]:  # the slow way: mutate one generation at a time, writing the noise out in full
        eps = torch.tensor([noise[offset + k].item() for k in range(policy.num_params)])
        theta = theta + SIGMA * eps
    assert torch.equal(ga.params_from_seeds(policy, noise, seeds, SIGMA), theta)
    # and one cached mutation of the parent gives the same bits as decoding the whole chain
    parent = ga.params_from_seeds(policy, noise, seeds[:-1], SIGMA)
    assert torch.equal(ga.mutate(parent, noise, seeds[-1], SIGMA), theta)


def test_different_seeds_give_different_individuals(setup):
    policy, noise = setup
    assert not torch.equal(
        ga.params_from_seeds(policy, noise, [1], SIGMA), ga.params_from_seeds(policy, noise, [2], SIGMA)
    )
    assert not torch.equal(
        ga.params_from_seeds(policy, noise, [1, 5], SIGMA), ga.params_from_seeds(policy, noise, [1, 6], SIGMA)
    )


def test_encoding_grows_by_one_seed_per_generation(setup):
    policy, noise = setup
    parents = None
    for generation in range(5):
        individuals = ga.make_generation(parents, 1, generation, 12, noise.numel(), policy.num_params)
        assert len(individuals) == (12 if generation == 0 else 11)
        assert all(len(ind) == generation + 1 for ind in individuals)
        if generation:  # every child is a parent's seed list plus one mutation offset
            assert all(ind[:-1] in parents for ind in individuals)
            assert all(0 <= ind[-1] <= noise.numel() - policy.num_params for ind in individuals)
        fitness = np.random.default_rng(generation).normal(size=len(individuals))
        elite = ga.elite_candidates(individuals, fitness, None, 3)[0]
        parents = ga.next_parents(individuals, fitness, elite, 4)
    assert ga.make_generation(parents, 1, 5, 12, noise.numel(), 10) == ga.make_generation(
        parents, 1, 5, 12, noise.numel(), 10
    )


def test_truncation_selection_and_elite_candidates():
    individuals = [[0], [1], [2], [3], [4], [5]]
    fitness = np.array([1.0, 5.0, 3.0, 5.0, 0.0, 2.0])
    # by fitness descending, ties by index: 1, 3, 2, 5, 0, 4
    assert ga.elite_candidates(individuals, fitness, None, 3) == [[1], [3], [2]]
    assert ga.elite_candidates(individuals, fitness, [9, 9], 3) == [[9, 9], [1], [3]]
    assert ga.next_parents(individuals, fitness, [9, 9], 3) == [[9, 9], [1], [3]]
    assert ga.next_parents(individuals, fitness, [3], 3) == [[3], [1], [2]]  # the elite appears once


def test_the_elite_is_the_best_candidate_mean_and_a_tie_keeps_the_previous_one():
    """ga_update: the candidate with the best mean over its E episodes becomes the elite, unchanged (the same
    seed list), and leads the next parents; a previous elite (candidate 0) that ties keeps its place."""
    args = ga.Args(elite_episodes=2, truncation=3)
    individuals = [[5, 1], [5, 2], [5, 3], [5, 4]]
    fitness = np.array([1.0, 4.0, 3.0, 2.0])
    candidates = [[5], [5, 2], [5, 3]]  # the previous elite first, then the generation's best two
    for returns, elite in [([9, 9, 10, 8, 1, 2], [5]), ([1, 2, 9, 9, 8, 8], [5, 2]), ([1, 2, 3, 4, 5, 6], [5, 3])]:
        progress = {}
        best = ga.ga_update(progress, individuals, fitness, candidates, np.array(returns, dtype=float), args)
        assert progress["elite"] == elite == candidates[best]
        assert progress["elite_score"] == max(np.reshape(returns, (3, 2)).mean(1))
        assert progress["parents"][0] == elite and len(progress["parents"]) == 3


def test_a_runs_elite_decodes_to_its_final_weights(runner):
    """A run's elite (summary: its seed list) decodes to the final weights."""
    check_ok(runner.run("ga", "--total-timesteps", 150_000, "--eval-episodes", 2, "--exp-name", "a"))
    a = runner.summary(ENV, "a")
    policy = ga.Policy(4, gym.spaces.Discrete(2), (64, 64))
    theta = ga.params_from_seeds(policy, ga.noise_table(1 + 2**32, 2**24), a["elite_seeds"], ga.Args().sigma)
    assert hashlib.sha256(theta.numpy().tobytes()).hexdigest() == a["theta_sha256"]
    assert 1 <= len(a["elite_seeds"]) <= a["generations"]


# ------------------------------------------------------------------------------------------ whole runs
def test_smoke_torchrun_two_workers(runner):
    check_ok(
        runner.run(
            "ga",
            "--total-timesteps",
            2000,
            "--population-size",
            8,
            "--truncation",
            3,
            "--elite-candidates",
            2,
            "--elite-episodes",
            3,
            "--eval-episodes",
            2,
            "--save-model",
            "--capture-video",
            nproc=2,
        )
    )
    s = runner.summary(ENV, "ga")
    assert SUMMARY_KEYS <= s.keys() and s["algo"] == "ga" and s["world_size"] == 2 and s["global_step"] >= 2000
    # per generation after the first: 7 mutants and 2 x 3 elite episodes, each table padded to 2 equal blocks
    assert s["bytes_per_generation"] == (8 + 6) * 24 < s["parameter_bytes"]
    assert torch.load(runner.run_dir(ENV, "ga") / "model.pt", weights_only=True)["seeds"] == s["elite_seeds"]
    assert_video_of_the_first_eval_episode(runner.run_dir(ENV, "ga"))  # rank 0 evaluates the elite


@pytest.mark.learning
def test_learns_cartpole_with_defaults(runner):
    assert_solves(runner, "ga")


def test_result_does_not_depend_on_worker_count(runner):
    budget = ["--total-timesteps", 60_000]
    check_ok(runner.run("ga", *budget, "--exp-name", "one"))
    one = runner.summary(ENV, "one")
    check_ok(runner.run("ga", *budget, "--exp-name", "two", "--num-workers", 2))
    two = runner.summary(ENV, "two")
    assert two["world_size"] == 2
    assert_same_result(one, two)


@pytest.mark.parametrize("obs_dim,actions", [(4, 2), (11, 3)])  # CartPole, Hopper-v4
def test_an_individual_gets_the_same_bits_alone_and_in_a_batch(obs_dim, actions):
    """A worker's block can be one row: the policy must give that row the bits it gets among others (baddbmm
    alone takes another kernel: before the fix 144 of these 150 comparisons differed in the low bits)."""
    space = ga.gym.spaces.Discrete(actions) if obs_dim == 4 else ga.gym.spaces.Box(-1, 1, (actions,))
    policy, g = ga.Policy(obs_dim, space), torch.Generator().manual_seed(0)
    for _ in range(50):
        params, obs = torch.randn(5, policy.num_params, generator=g) * 0.1, torch.randn(5, obs_dim, generator=g)
        alone = policy.forward(params[:1], obs[:1])[0]
        for n in (2, 3, 5):
            assert torch.equal(alone, policy.forward(params[:n], obs[:n])[0])


def test_one_row_blocks_and_empty_workers_change_nothing(runner):
    """4 workers: the 13 individuals split 4, 4, 4, 1 (a one-row block, which baddbmm alone computes with other
    low bits) and the 6 elite episodes 2, 2, 2, 0 (an empty worker); the result is that of 1 worker."""
    small = [
        "--total-timesteps",
        8_000,
        "--population-size",
        13,
        "--truncation",
        3,
        "--elite-candidates",
        2,
        "--elite-episodes",
        3,
    ]
    check_ok(runner.run("ga", *small, "--exp-name", "one"))
    check_ok(runner.run("ga", *small, "--exp-name", "four", "--num-workers", 4))
    assert_same_result(runner.summary(ENV, "one"), runner.summary(ENV, "four"))


def test_elite_episodes_obey_the_episode_cap(runner):
    """A CartPole episode lasts at least 8 steps, so with a cap of 5 every episode, mutant or elite, is 5 steps."""
    check_ok(
        runner.run(
            "ga",
            "--total-timesteps",
            1_000,
            "--population-size",
            8,
            "--truncation",
            2,
            "--elite-candidates",
            2,
            "--elite-episodes",
            2,
            "--episode-cap",
            5,
            "--eval-episodes",
            1,
        )
    )
    s = runner.summary(ENV, "ga")
    assert s["elite_score"] == 5.0 and s["global_step"] % 5 == 0  # the elite's mean return is its mean length


def test_mujoco_continuous_actions_run(runner):
    check_ok(
        runner.run(
            "ga",
            "--env-id",
            "Hopper-v4",
            "--total-timesteps",
            500,
            "--population-size",
            4,
            "--truncation",
            2,
            "--elite-candidates",
            2,
            "--elite-episodes",
            2,
            "--eval-episodes",
            1,
        )
    )
    assert runner.summary("Hopper-v4", "ga")["global_step"] >= 500

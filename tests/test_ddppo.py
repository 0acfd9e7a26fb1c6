"""DD-PPO: pure functions against slow references, the all-reduced update, preemption, and whole runs."""

import math
import os
import shutil
import subprocess
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import (
    SUMMARY_KEYS,
    algo_command,
    assert_same_result,
    assert_solves,
    assert_video_of_the_first_eval_episode,
    check_ok,
    child_env,
    decoded_frame_shapes,
    free_port,
    load_algo,
)

ddppo = load_algo("ddppo")
ENV = "CartPole-v1"


# ------------------------------------------------------------------------------------------ pure functions
def gae_reference(rewards, values, next_value, terminations, dones, gamma, lam):
    """Straight from the definition: A_t = sum_l (gamma*lam)^l delta_{t+l}, summed until the episode ends,
    with delta_t = r_t + gamma * V(s_{t+1}) * (1 - terminated_t) - V(s_t). One env and one t at a time."""
    T, N = rewards.shape
    v_next = torch.cat([values[1:], next_value[None]], 0)
    delta = rewards + gamma * v_next * (1 - terminations) - values
    adv = torch.zeros(T, N, dtype=torch.float64)
    for n in range(N):
        for t in range(T):
            total = 0.0
            for k in range(T - t):
                total += (gamma * lam) ** k * delta[t + k, n].item()
                if dones[t + k, n]:
                    break
            adv[t, n] = total
    return adv


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_matches_reference(seed):
    g = torch.Generator().manual_seed(seed)
    T, N = 12, 5
    rewards, values, next_value = (
        torch.randn(T, N, generator=g),
        torch.randn(T, N, generator=g),
        torch.randn(N, generator=g),
    )
    terminations = (torch.rand(T, N, generator=g) < 0.15).float()
    truncations = (torch.rand(T, N, generator=g) < 0.1).float() * (1 - terminations)
    dones = torch.clamp(terminations + truncations, max=1)
    assert terminations.sum() > 0 and truncations.sum() > 0
    adv, ret = ddppo.compute_gae(rewards, values, next_value, terminations, dones, 0.97, 0.9)
    ref = gae_reference(rewards, values, next_value, terminations, dones, 0.97, 0.9)
    torch.testing.assert_close(adv.double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ret, adv + values)


def test_gae_lambda_one_is_discounted_return_minus_value():
    # lambda = 1, one episode that terminates at the last step: A_t = sum_k gamma^k r_{t+k} - V(s_t).
    T, gamma = 6, 0.9
    rewards, values = torch.arange(1.0, T + 1)[:, None], torch.linspace(-1, 1, T)[:, None]
    terms = torch.zeros(T, 1)
    terms[-1] = 1
    adv, _ = ddppo.compute_gae(rewards, values, torch.tensor([123.0]), terms, terms.clone(), gamma, 1.0)
    expected = [sum(gamma**k * rewards[t + k, 0].item() for k in range(T - t)) - values[t, 0].item() for t in range(T)]
    torch.testing.assert_close(adv[:, 0], torch.tensor(expected))


def test_ppo_loss_clips_ratio():
    agent = ddppo.Agent((4,), ddppo.gym.spaces.Discrete(2))
    obs, actions = torch.randn(64, 4), torch.randint(0, 2, (64,))
    with torch.no_grad():
        _, logprob, _, value = agent.get_action_and_value(obs, actions)
    args = ddppo.Args(norm_adv=False, ent_coef=0.0, clip_coef=0.2)
    mb = {
        "obs": obs,
        "actions": actions,
        "logprobs": logprob - 1.0,  # ratio = e > 1 + clip everywhere
        "values": value,
        "advantages": torch.ones(64),
        "returns": value,
    }
    _, stats = ddppo.ppo_loss(agent, mb, args)
    # positive advantage, ratio above 1 + eps: the clipped term -(1 + eps) * A is the max, so pg_loss = -1.2
    assert stats[0].item() == pytest.approx(-1.2, abs=1e-5)
    assert stats[4].item() == 1.0  # every sample clipped


def test_gaussian_logprob_and_entropy_match_torch_normal():
    agent = ddppo.Agent((3,), ddppo.gym.spaces.Box(-1, 1, (2,)))
    with torch.no_grad():
        agent.actor_logstd.copy_(torch.tensor([-0.5, 0.3]))
    obs, actions = torch.randn(10, 3), torch.randn(10, 2)
    _, logprob, entropy, _ = agent.get_action_and_value(obs, actions)
    dist_ = torch.distributions.Normal(agent.actor(obs), agent.actor_logstd.exp())
    torch.testing.assert_close(logprob, dist_.log_prob(actions).sum(-1))
    torch.testing.assert_close(entropy, dist_.entropy().sum(-1))


def test_flattened_parameters_are_views_that_backward_fills():
    torch.manual_seed(0)
    agent = ddppo.Agent((4,), ddppo.gym.spaces.Discrete(2))
    before = {k: v.clone() for k, v in agent.state_dict().items()}
    flat = ddppo.flatten_parameters(agent)
    grad = flat.grad
    assert all(torch.equal(before[k], v) for k, v in agent.state_dict().items())  # values kept
    assert flat.numel() == grad.numel() == sum(p.numel() for p in agent.parameters())
    _, logprob, _, value = agent.get_action_and_value(torch.randn(8, 4), torch.randint(0, 2, (8,)))
    (logprob.mean() + value.mean()).backward()
    assert grad.abs().sum() > 0 and torch.equal(grad, torch.cat([p.grad.reshape(-1) for p in agent.parameters()]))
    with torch.no_grad():
        flat.add_(1.0)  # written through to every parameter
    assert all(torch.equal(before[k] + 1, v) for k, v in agent.state_dict().items())


# ------------------------------------------------------------------------------------------ all-reduced update
def make_batch(n, seed):
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(n, 4, generator=g),
        "actions": torch.randint(0, 2, (n,), generator=g),
        "logprobs": -torch.rand(n, generator=g) - 0.3,
        "values": torch.randn(n, generator=g),
        "advantages": torch.randn(n, generator=g),
        "returns": torch.randn(n, generator=g),
    }


def update_worker(rank, world, port, out_dir, sizes, minibatches, epochs):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    agent = ddppo.Agent((4,), ddppo.gym.spaces.Discrete(2))
    optimizer = ddppo.make_optimizer(ddppo.Args(learning_rate=1e-2), ddppo.flatten_parameters(agent))
    full = make_batch(sum(sizes), seed=7)
    lo = sum(sizes[:rank])
    mine = {k: v[lo : lo + sizes[rank]] for k, v in full.items()}
    args = ddppo.Args(norm_adv=False, num_minibatches=minibatches, update_epochs=epochs)
    ddppo.ppo_update(agent, optimizer, mine, args, torch.Generator().manual_seed(rank), world)
    torch.save(agent.state_dict(), os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def spawn(worker, world, tmp_path, *args, timeout=60):
    """Run worker(rank, world, port, out_dir, *args) on `world` gloo ranks; returns what each saved to rank<r>.pt."""
    ctx = mp.start_processes(
        worker, args=(world, free_port(), str(tmp_path), *args), nprocs=world, join=False, start_method="spawn"
    )
    end = time.time() + timeout
    while not ctx.join(timeout=max(0.1, end - time.time())):
        if time.time() > end:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"{worker.__name__} deadlocked on {world} ranks with {args}")
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(world)]


def advantage_worker(rank, world, port, out_dir, sizes):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    full = make_batch(sum(sizes), seed=3)["advantages"] * 5 + 2
    mine = full[sum(sizes[:rank]) : sum(sizes[: rank + 1])]
    torch.save({"adv": ddppo.normalized_advantages(mine, world)}, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def test_advantages_are_normalized_with_statistics_over_all_ranks(tmp_path):
    """habitat-lab's form: one mean and std over every rank's advantages, however unequal (even empty) the parts."""
    sizes = [40, 0, 88]
    parts = spawn(advantage_worker, 3, tmp_path, sizes)
    full = make_batch(sum(sizes), seed=3)["advantages"] * 5 + 2
    union = torch.cat([p["adv"] for p in parts])
    torch.testing.assert_close(union, (full - full.mean()) / (full.std() + 1e-8), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ddppo.normalized_advantages(full, 1), union, rtol=1e-5, atol=1e-5)


def spawn_update(tmp_path, sizes, minibatches, epochs):
    return spawn(update_worker, len(sizes), tmp_path, sizes, minibatches, epochs)


def test_allreduced_update_equals_single_process_update_on_union(tmp_path):
    """One update on 2 ranks with equal batches A and B == the single-process update on A u B."""
    states = spawn_update(tmp_path, [64, 64], minibatches=1, epochs=3)
    torch.manual_seed(0)
    agent = ddppo.Agent((4,), ddppo.gym.spaces.Discrete(2))
    optimizer = ddppo.make_optimizer(ddppo.Args(learning_rate=1e-2), ddppo.flatten_parameters(agent))
    before = {k: v.clone() for k, v in agent.state_dict().items()}
    args = ddppo.Args(norm_adv=False, num_minibatches=1, update_epochs=3)
    ddppo.ppo_update(agent, optimizer, make_batch(128, seed=7), args, torch.Generator().manual_seed(0), 1)
    for k, v in agent.state_dict().items():
        torch.testing.assert_close(states[0][k], v, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(states[1][k], states[0][k], rtol=0, atol=0)
    assert any(not torch.equal(before[k], v) for k, v in agent.state_dict().items())


def test_preempted_ranks_with_unequal_batches_do_not_deadlock(tmp_path):
    """After preemption ranks hold different amounts of data (even fewer samples than minibatches); the fixed
    number of minibatches keeps the collectives matched and the replicas identical."""
    states = spawn_update(tmp_path, [3, 40, 512], minibatches=4, epochs=2)
    for k in states[0]:
        assert torch.equal(states[0][k], states[1][k]) and torch.equal(states[0][k], states[2][k])


def test_rollout_is_preempted_once_quorum_of_ranks_finished():
    args = ddppo.Args(local_num_envs=4, num_steps=20, sync_frac=0.6, min_rollout_frac=0.25)
    args.world_size = 3  # quorum: ceil(0.6 * 3) = 2 finished ranks
    spec = ddppo.envpool.make_spec(ENV)
    agent = ddppo.Agent(spec.observation_space.shape, spec.action_space)
    envs = ddppo.make_env(ENV, 4, 0)
    obs, _ = envs.reset()

    def fresh():
        state = {
            "obs": torch.as_tensor(obs),
            "valid": torch.ones(4),
            "prev_done": ddppo.np.zeros(4, bool),
            "ep_return": ddppo.np.zeros(4),
            "ep_length": ddppo.np.zeros(4),
            "finished": [],
        }
        buf = {k: torch.zeros(20, 4) for k in ["logprobs", "values", "rewards", "terms", "dones", "valid"]}
        buf.update(obs=torch.zeros(20, 4, 4), actions=torch.zeros(20, 4, dtype=torch.long))
        return state, buf

    store = dist.HashStore()
    state, buf = fresh()
    assert ddppo.collect_rollout(agent, envs, state, buf, args, None, store, 0) == 20
    assert int(store.add("ddppo/finished/0", 0)) == 1  # a full rollout counts itself as finished
    store.add("ddppo/finished/1", 2)  # two other ranks already finished update 1
    state, buf = fresh()
    assert ddppo.collect_rollout(agent, envs, state, buf, args, None, store, 1) == math.ceil(0.25 * 20)
    assert int(store.add("ddppo/finished/1", 0)) == 2  # a preempted rank does not count itself


# ------------------------------------------------------------------------------------------ normalization
SCALES, OFFSETS = torch.tensor([1.0, 10.0, 0.1]), torch.tensor([5.0, -3.0, 100.0])


def fake_rollout(T, N, seed):
    """A rollout as collect_rollout leaves it: the step after an episode end is envpool's reset step (invalid,
    reward 0). Observations of very different scales and offsets."""
    g = torch.Generator().manual_seed(seed)
    dones = (torch.rand(T, N, generator=g) < 0.2).float()
    valid = torch.cat([torch.ones(1, N), 1 - dones[:-1]])
    buf = {
        "obs": torch.randn(T, N, 3, generator=g) * SCALES + OFFSETS,
        "dones": dones,
        "valid": valid,
        "rewards": (torch.randn(T, N, generator=g) * 3 + 1) * valid,
    }
    return buf


def return_scaler_reference(rollouts, gamma, clip):
    """Reward scaling from its definition, one env and one step at a time: R <- gamma R + r, reset to 0 after an
    episode end; after each rollout, its rewards are divided by the std of every valid R seen so far."""
    N = rollouts[0]["rewards"].shape[1]
    running, seen, scaled = [0.0] * N, [], []
    for buf in rollouts:
        for t in range(buf["rewards"].shape[0]):
            for n in range(N):
                running[n] = gamma * running[n] + buf["rewards"][t, n].item()
                if buf["valid"][t, n]:
                    seen.append(running[n])
                if buf["dones"][t, n]:
                    running[n] = 0.0
        scaled.append(np.clip(buf["rewards"].double().numpy() / np.sqrt(np.var(seen) + 1e-8), -clip, clip))
    return scaled, np.var(seen)


def valid_obs(rollouts):
    return np.concatenate([b["obs"][b["valid"].bool()].double().numpy() for b in rollouts])


def normalized_agent(**kwargs):
    return ddppo.Agent((3,), ddppo.gym.spaces.Box(-1, 1, (2,)), norm_obs=True, norm_reward=True, **kwargs)


def run_normalizers(agent, rollouts, args, world):
    """What main does with each rollout: update the statistics (return stats at once, obs stats after the update)."""
    state, scaled = {"ret_acc": torch.zeros(rollouts[0]["rewards"].shape[1])}, []
    for buf in rollouts:
        rewards, obs_stats = ddppo.update_normalizers(agent, buf, buf["rewards"].shape[0], state, args, world)
        agent.obs_rms.load(*obs_stats)
        scaled.append(rewards)
    return scaled


def test_running_mean_var_equals_numpy_over_everything_seen():
    rollouts = [fake_rollout(7, 4, seed) for seed in range(5)]
    agent = normalized_agent()
    run_normalizers(agent, rollouts, ddppo.Args(), 1)
    ref = valid_obs(rollouts)
    assert agent.obs_rms.count.item() == len(ref)
    np.testing.assert_allclose(agent.obs_rms.mean.numpy(), ref.mean(0), rtol=1e-10)
    np.testing.assert_allclose(agent.obs_rms.var.numpy(), ref.var(0), rtol=1e-8)


@pytest.mark.parametrize("module", ["ddppo", "impala", "seed"])  # the same text in the three files
def test_merged_moments_of_ranks_equal_statistics_of_the_union(module):
    """What the all-reduce computes: moments of each rank's rows summed, then one merge, equals the statistics of
    the union; an empty batch changes nothing."""
    m = load_algo(module)
    a, b = fake_rollout(6, 3, 0), fake_rollout(9, 2, 1)
    mean, var, count = torch.zeros(3).double(), torch.ones(3).double(), torch.zeros(()).double()
    for _ in range(2):  # twice: the second merge has a non-trivial running mean as its shift
        summed = sum(m.rms_moments(r["obs"], r["valid"].reshape(-1), mean) for r in (a, b))
        mean, var, count = m.rms_merge(mean, var, count, summed)
    ref = np.concatenate([valid_obs([a, b])] * 2)
    np.testing.assert_allclose(mean.numpy(), ref.mean(0), rtol=1e-10)
    np.testing.assert_allclose(var.numpy(), ref.var(0), rtol=1e-8)
    assert count.item() == len(ref)
    same = m.rms_merge(mean, var, count, m.rms_moments(a["obs"], torch.zeros(18), mean))
    assert all(torch.equal(x, y) for x, y in zip(same, (mean, var, count), strict=True))


def test_reward_scaler_matches_slow_reference():
    rollouts = [fake_rollout(8, 3, seed) for seed in range(4)]
    agent, args = normalized_agent(), ddppo.Args(gamma=0.9, clip_reward=1.0)
    scaled = run_normalizers(agent, rollouts, args, 1)
    ref, ref_var = return_scaler_reference(rollouts, 0.9, 1.0)
    for ours, theirs in zip(scaled, ref, strict=True):
        np.testing.assert_allclose(ours.double().numpy(), theirs, rtol=1e-5, atol=1e-6)
    assert any((np.abs(r) == 1.0).any() for r in ref) and any((np.abs(r) < 1.0).any() for r in ref)  # clip exercised
    np.testing.assert_allclose(agent.return_rms.var.item(), ref_var, rtol=1e-6)


def normalizer_worker(rank, world, port, out_dir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    agent = normalized_agent()
    run_normalizers(agent, [fake_rollout(5 + rank, 3, 10 * u + rank) for u in range(3)], ddppo.Args(), world)
    torch.save(agent.state_dict(), os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def test_statistics_are_identical_on_all_ranks_and_cover_the_union(tmp_path):
    states = spawn(normalizer_worker, 2, tmp_path)
    rms_keys = [k for k in states[0] if "_rms." in k]
    assert len(rms_keys) == 6 and all(torch.equal(states[0][k], states[1][k]) for k in rms_keys)
    per_rank = [[fake_rollout(5 + r, 3, 10 * u + r) for u in range(3)] for r in range(2)]
    ref = valid_obs(per_rank[0] + per_rank[1])
    np.testing.assert_allclose(states[0]["obs_rms.mean"].numpy(), ref.mean(0), rtol=1e-10)
    np.testing.assert_allclose(states[0]["obs_rms.var"].numpy(), ref.var(0), rtol=1e-8)
    returns = []  # every valid discounted return of both ranks
    for rollouts in per_rank:
        agent = normalized_agent()
        run_normalizers(agent, rollouts, ddppo.Args(), 1)
        returns.append((agent.return_rms.count.item(), agent.return_rms.mean.item(), agent.return_rms.var.item()))
    (n0, m0, v0), (n1, m1, v1) = returns
    mean = (n0 * m0 + n1 * m1) / (n0 + n1)
    var = (n0 * (v0 + (m0 - mean) ** 2) + n1 * (v1 + (m1 - mean) ** 2)) / (n0 + n1)
    assert states[0]["return_rms.count"].item() == n0 + n1
    np.testing.assert_allclose(states[0]["return_rms.var"].item(), var, rtol=1e-6)


def test_statistics_survive_a_checkpoint_and_normalize_observations(tmp_path):
    agent = normalized_agent(clip_obs=3.0)
    run_normalizers(agent, [fake_rollout(6, 4, s) for s in range(2)], ddppo.Args(), 1)
    optimizer = ddppo.make_optimizer(ddppo.Args(), ddppo.flatten_parameters(agent))
    checkpoint = {
        **ddppo.new_progress(ddppo.run_config(ddppo.Args())),
        "model": agent.state_dict(),
        "optimizer": optimizer.state_dict(),
    }
    ddppo.save_checkpoint(str(tmp_path / "c.pt"), checkpoint)
    restored = normalized_agent(clip_obs=3.0)
    restored.load_state_dict(torch.load(tmp_path / "c.pt", weights_only=True)["model"])
    for k, v in agent.state_dict().items():
        assert torch.equal(restored.state_dict()[k], v), k
    obs = torch.randn(50, 3) * 20 * SCALES + OFFSETS
    expected = ((obs.double() - agent.obs_rms.mean) / torch.sqrt(agent.obs_rms.var + 1e-8)).clamp(-3, 3).float()
    torch.testing.assert_close(restored.features(obs), expected)
    assert (expected.abs() == 3).any() and (expected.abs() < 3).any()


def test_evaluation_uses_frozen_statistics():
    spec = ddppo.envpool.make_spec("Pendulum-v1")
    agent = ddppo.Agent(spec.observation_space.shape, spec.action_space, norm_obs=True, clip_obs=5.0)
    agent.obs_rms.load(torch.full((3,), 1e3), torch.full((3,), 4.0), torch.tensor(7.0))
    before = {k: v.clone() for k, v in agent.state_dict().items()}
    seen = []
    agent.actor.register_forward_pre_hook(lambda module, inputs: seen.append(inputs[0].clone()))
    ddppo.evaluate(agent, "Pendulum-v1", 2, 0, "cpu")
    assert len(seen) == 200 and all((x == -5.0).all() for x in seen)  # |obs| <= 8: (obs - 1000) / 2 clips to -5
    assert all(torch.equal(before[k], v) for k, v in agent.state_dict().items())


# ------------------------------------------------------------------------------------------ whole runs
SMALL = ["--total-timesteps", 4096, "--local-num-envs", 8, "--eval-episodes", 3]


def test_smoke_single_process(runner):
    check_ok(runner.run("ddppo", *SMALL, "--save-model", "--capture-video"))
    s = runner.summary(ENV, "ddppo")
    assert SUMMARY_KEYS <= s.keys() and s["algo"] == "ddppo" and s["world_size"] == 1
    assert s["global_step"] == 4096 and s["sps"] > 0 and s["eval_return_mean"] > 0
    assert not any("_rms." in k for k in load_weights(runner.run_dir(ENV, "ddppo") / "model.pt"))  # Discrete: off
    assert_video_of_the_first_eval_episode(runner.run_dir(ENV, "ddppo"))


def test_smoke_torchrun_two_ranks(runner):
    proc = runner.run("ddppo", *SMALL, nproc=2)
    check_ok(proc)
    s = runner.summary(ENV, "ddppo")
    assert s["world_size"] == 2 and s["global_step"] > 0 and s["eval_return_mean"] > 0


def test_preemption_cuts_ranks_end_to_end(runner):
    """3 ranks pinned to one CPU (so they take turns on it, on any machine) with a quorum of one
    (ceil(0.3 x 3) = 1): once the first rank has finished its rollout the others stop at their next step past the
    minimum, so ranks are really cut (with 2 ranks and the default 0.6 the quorum is both ranks and nothing is
    ever preempted). The logged fractions show it, and the run still ends normally with all ranks in step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args = [
        "--total-timesteps",
        3 * 8 * 64 * 20,
        "--local-num-envs",
        8,
        "--num-steps",
        64,
        "--sync-frac",
        0.3,
        "--eval-episodes",
        1,
    ]
    cpu = str(min(os.sched_getaffinity(0)))
    check_ok(
        subprocess.run(
            ["taskset", "-c", cpu, *algo_command("ddppo", args, nproc=3)],
            cwd=runner.cwd,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
    )
    assert runner.summary(ENV, "ddppo")["world_size"] == 3
    events = EventAccumulator(str(runner.run_dir(ENV, "ddppo")), size_guidance={"scalars": 0})
    events.Reload()
    rollout = [e.value for e in events.Scalars("stats/rollout_frac")]
    preempted = [e.value for e in events.Scalars("stats/preempted_ranks_frac")]
    assert len(rollout) == 20 and min(rollout) >= 0.25  # never below --min-rollout-frac
    assert np.mean(rollout) < 1.0 and max(preempted) > 0, (rollout, preempted)


TINY = ["--local-num-envs", 2, "--num-steps", 8, "--total-timesteps", 64, "--eval-episodes", 1]


def test_smoke_atari_cnn_with_a_video_of_the_screen(runner):
    """The Nature-CNN / uint8 path runs end to end (no learning claimed), and the evaluation episode's video has
    the screen's size (a Pong game lasts until one side has 21 points: hundreds of agent steps at the least)."""
    check_ok(runner.run("ddppo", "--env-id", "Pong-v5", *TINY, "--capture-video"))
    s = runner.summary("Pong-v5", "ddppo")
    assert s["global_step"] == 64 and math.isfinite(s["eval_return_mean"]) and s["time_to_threshold_s"] is None
    shapes = decoded_frame_shapes(runner.run_dir("Pong-v5", "ddppo") / "videos" / "eval_episode0.mp4")
    assert len(shapes) > 100 and set(shapes) == {(210, 160, 3)}


def test_smoke_mujoco_gaussian(runner):
    """The continuous Gaussian path runs end to end (no learning claimed)."""
    check_ok(runner.run("ddppo", "--env-id", "HalfCheetah-v4", *TINY))
    s = runner.summary("HalfCheetah-v4", "ddppo")
    assert s["global_step"] == 64 and math.isfinite(s["eval_return_mean"]) and s["time_to_threshold_s"] is None


def test_mujoco_statistics_saved_with_the_model_and_restored_on_resume(runner):
    """HalfCheetah has Box actions: observation and reward normalization are on by default. model.pt holds the
    statistics, and a run resumed from the checkpoint the whole run wrote at update 2 of 4 continues them (its
    episodes restart, so it is not bitwise the whole run)."""
    env = "HalfCheetah-v4"
    args = [
        "--env-id",
        env,
        "--local-num-envs",
        8,
        "--num-steps",
        64,
        "--total-timesteps",
        2048,
        "--checkpoint-every",
        2,
        "--eval-episodes",
        1,
        "--save-model",
    ]
    check_ok(runner.run("ddppo", *args, "--exp-name", "whole"))
    whole = runner.summary(env, "whole")
    assert SUMMARY_KEYS <= whole.keys() and whole["global_step"] == 2048 and math.isfinite(whole["eval_return_mean"])
    model = load_weights(runner.run_dir(env, "whole") / "model.pt")
    # every step was valid: HalfCheetah's episodes last 1000 steps, more than the 256 each env took
    assert model["obs_rms.count"].item() == model["return_rms.count"].item() == 2048
    assert model["obs_rms.mean"].shape == (17,) and (model["obs_rms.var"] != 1).all() and model["return_rms.var"] != 1
    (runner.run_dir(env, "cut")).mkdir(parents=True)
    shutil.copy(runner.run_dir(env, "whole") / "checkpoint.pt", runner.run_dir(env, "cut") / "checkpoint.pt")
    check_ok(runner.run("ddppo", *args, "--exp-name", "cut", "--resume"))
    resumed = load_weights(runner.run_dir(env, "cut") / "model.pt")
    assert runner.summary(env, "cut")["global_step"] == 2048
    assert resumed["obs_rms.count"].item() == resumed["return_rms.count"].item() == 2048  # 1024 restored + 1024


@pytest.mark.learning
def test_learns_cartpole_with_defaults(runner):
    assert_solves(runner, "ddppo")


def load_weights(path):
    return torch.load(path, weights_only=True)


def assert_same_weights(a, b):
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_same_seed_same_result_and_checkpoints_do_not_change_training(runner):
    """Two runs of one seed end with the same summary and weights, bit for bit, though the second checkpoints every
    2 updates (32 steps, far shorter than a solved episode): the envs keep running across checkpoints."""
    args = ["--total-timesteps", 60 * 256, "--save-model", "--eval-episodes", 2]
    check_ok(runner.run("ddppo", *args, "--exp-name", "plain"))
    check_ok(runner.run("ddppo", *args, "--exp-name", "ckpt", "--checkpoint-every", 2))
    assert_same_result(runner.summary(ENV, "plain"), runner.summary(ENV, "ckpt"))
    assert_same_weights(
        load_weights(runner.run_dir(ENV, "plain") / "model.pt"), load_weights(runner.run_dir(ENV, "ckpt") / "model.pt")
    )

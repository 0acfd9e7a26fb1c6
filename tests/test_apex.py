"""Ape-X (algos/apex.py): the pure functions against slow references written from the papers (the epsilon_i
schedule, n-step targets, double-Q TD errors, the sum tree and proportional prioritized replay), the actors'
blocks and learning with the defaults; and the smoke/torchrun/determinism/failure runs of Ape-X and R2D2
(algos/r2d2.py, which runs on the same actors, replay and links)."""

import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import (
    LAUNCH_KEYS,
    LEARNED_FLOOR,
    ROOT,
    SUMMARY_KEYS,
    assert_solves,
    assert_video_of_the_first_eval_episode,
    check_ok,
    load_algo,
    run_whole_and_kill_at_first_checkpoint,
    start_actor,
    updates_allowed,
)

apex = load_algo("apex")
FAST = ["--total-timesteps", 6144, "--learning-starts", 1024]  # whole blocks (8 x 16 steps) on 1 and 2 actors


def transition_fields(obs_shape=(4,), dtype=torch.float32) -> dict:
    """One transition's fields as the replay stores them (shape and dtype)."""
    return {
        "obs": torch.zeros(obs_shape, dtype=dtype),
        "next_obs": torch.zeros(obs_shape, dtype=dtype),
        "actions": torch.zeros((), dtype=torch.long),
        "returns": torch.zeros(()),
        "discounts": torch.zeros(()),
    }


def test_epsilon_schedule():
    """epsilon_i = epsilon^(1 + alpha i / (N - 1)) (paper, Section 4): 0.4 for i = 0, 0.4^8 for i = N - 1."""
    eps = apex.epsilons(0.4, 7.0, 8)
    assert eps[0] == pytest.approx(0.4) and eps[-1] == pytest.approx(0.4**8)
    for i in range(8):
        assert eps[i] == pytest.approx(0.4 ** (1 + 7 * i / 7))
    assert apex.epsilons(0.4, 7.0, 1).tolist() == [0.4]
    assert np.all(np.diff(apex.epsilons(0.3, 5.0, 16)) < 0)


def n_step_reference(r, term, done, gamma, n):
    """Straight from the definition, one window at a time: add gamma^k r_{s+k} until n steps are summed or the
    episode ends at s+k; bootstrap with gamma^m from x_{s+m} unless the episode terminated (a truncation does)."""
    L, N = r.shape
    G, disc, boot = np.zeros((L - n + 1, N)), np.zeros((L - n + 1, N)), np.zeros((L - n + 1, N), dtype=int)
    for e in range(N):
        for s in range(L - n + 1):
            total, m = 0.0, n
            for k in range(n):
                total += gamma**k * r[s + k, e]
                if done[s + k, e]:
                    m = k + 1
                    break
            G[s, e], boot[s, e] = total, s + m
            disc[s, e] = 0.0 if term[s + m - 1, e] else gamma**m
    return G, disc, boot


def random_steps(seed, L=30, N=5):
    """[L, N] steps with terminations, truncations and envpool's reset steps (reward 0 after every end)."""
    rng = np.random.default_rng(seed)
    done = rng.random((L, N)) < 0.15
    done[1:] &= ~done[:-1]  # the step after an end is the reset step: never an end itself
    term = done & (rng.random((L, N)) < 0.5)
    r = rng.normal(size=(L, N))
    r[1:][done[:-1]] = 0.0
    assert term.any() and (done & ~term).any()
    return r, term * 1.0, done * 1.0


@pytest.mark.parametrize("n", [1, 3, 5])
def test_n_step_targets_match_reference(n):
    for seed in range(4):
        r, term, done = random_steps(seed)
        G, disc, boot = apex.n_step_targets(r, term, done, 0.97, n)
        G_ref, disc_ref, boot_ref = n_step_reference(r, term, done, 0.97, n)
        np.testing.assert_allclose(G, G_ref, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(disc, disc_ref, rtol=1e-12)
        np.testing.assert_array_equal(boot, boot_ref)


def test_dueling_double_q_td_errors():
    """Q = V + A - mean A; delta = G + discount Q_target(x', argmax_a Q_online(x', a)) - Q_online(x, a), one sample
    at a time, and the online network's argmax is used even where the target network would pick another action."""
    torch.manual_seed(0)
    online, target = apex.QNetwork((4,), 3), apex.QNetwork((4,), 3)
    B = 16
    obs, next_obs = torch.randn(B, 4), torch.randn(B, 4)
    actions, G, disc = torch.randint(0, 3, (B,)), torch.randn(B), torch.rand(B)
    delta, q_sa = apex.td_errors(online, target, obs, actions, G, disc, next_obs)
    with torch.no_grad():
        h = online.torso(obs)
        adv = online.advantage(h)
        torch.testing.assert_close(online(obs), online.value(h) + adv - adv.mean(1, keepdim=True))
        differs = 0
        for i in range(B):
            a_star = int(online(next_obs[i : i + 1]).argmax())
            differs += a_star != int(target(next_obs[i : i + 1]).argmax())
            y = G[i] + disc[i] * target(next_obs[i : i + 1])[0, a_star]
            assert delta[i].item() == pytest.approx((y - online(obs[i : i + 1])[0, actions[i]]).item(), abs=1e-5)
    assert differs > 0  # the case that tells double Q from plain Q occurred
    weights = torch.rand(B)
    batch = {"obs": obs, "next_obs": next_obs, "actions": actions, "returns": G, "discounts": disc}
    loss, abs_td = apex.apex_loss(online, target, batch, weights)
    d = delta.detach()
    huber = torch.where(d.abs() < 1, 0.5 * d**2, d.abs() - 0.5)
    assert loss.item() == pytest.approx((weights * huber).mean().item(), rel=1e-5)
    torch.testing.assert_close(abs_td, d.abs())
    loss.backward()  # the target is a constant: no gradient reaches the target network
    assert all(p.grad is None for p in target.parameters()) and all(p.grad is not None for p in online.parameters())
    # the gradient is the reference loss's: per sample, a constant target y_i minus Q_online(x_i, a_i)
    terms = []
    for i in range(B):
        with torch.no_grad():
            a_star = online(next_obs[i : i + 1]).argmax()
            y = G[i] + disc[i] * target(next_obs[i : i + 1])[0, a_star]
        d_i = y - online(obs[i : i + 1])[0, actions[i]]
        terms.append(weights[i] * torch.where(d_i.abs() < 1, 0.5 * d_i**2, d_i.abs() - 0.5))
    reference = torch.autograd.grad(torch.stack(terms).mean(), list(online.parameters()))
    for param, expected in zip(online.parameters(), reference, strict=True):
        torch.testing.assert_close(param.grad, expected, rtol=1e-4, atol=1e-6)


def test_sum_tree_sampling_frequencies_match_priorities():
    """Chi-square test of 200k draws over 300 leaves with random priorities (df = 299: mean 299, sd 24.5); a tree
    that descends the wrong way, is off by one or keeps stale sums scores in the thousands."""
    rng = np.random.default_rng(0)
    tree, p = apex.SumTree(300), rng.random(300) ** 3 + 1e-3
    tree.update(np.arange(300), p)
    draws = 200_000
    leaves = tree.find(rng.random(draws) * tree.total())
    counts = np.bincount(leaves, minlength=tree.size)
    assert counts[300:].sum() == 0
    expected = draws * p / p.sum()
    chi2 = ((counts[:300] - expected) ** 2 / expected).sum()
    assert chi2 < 299 + 6 * np.sqrt(2 * 299), chi2
    # the same after changing a third of the priorities (sums must be refreshed all the way up)
    changed = rng.choice(300, 100, replace=False)
    p[changed] = rng.random(100) * 5
    tree.update(changed, p[changed])
    counts = np.bincount(tree.find(rng.random(draws) * tree.total()), minlength=300)[:300]
    expected = draws * p / p.sum()
    assert ((counts - expected) ** 2 / expected).sum() < 299 + 6 * np.sqrt(2 * 299)


def test_sum_tree_inner_nodes_and_fifo_eviction():
    """After many inserts past capacity (FIFO) and priority updates, every inner node is the sum (min) of its
    children, the total is the sum of the live transitions' p^alpha, and the oldest transitions were evicted."""
    replay, rng, live = (
        apex.PrioritizedReplay(100, transition_fields(), 0.6, 1e-6, torch.device("cpu")),
        np.random.default_rng(1),
        {},
    )
    for block in range(13):
        k = int(rng.integers(1, 30))
        td = torch.rand(k) * 3
        obs = torch.full((k, 4), float(block))
        replay.add(
            {
                "obs": obs,
                "next_obs": obs,
                "actions": torch.zeros(k, dtype=torch.long),
                "returns": torch.zeros(k),
                "discounts": torch.zeros(k),
            },
            td,
        )
        for j in range(k):
            live[(replay.pos - k + j) % 100] = (block, (td[j].item() + 1e-6) ** 0.6)
        idx = rng.integers(0, replay.size, 10)
        new = torch.rand(10)
        replay.update_priorities(idx, new)
        for i, v in zip(idx, new.tolist(), strict=True):
            live[int(i)] = (live[int(i)][0], (v + 1e-6) ** 0.6)
    tree = replay.tree
    inner = np.arange(1, tree.size)
    np.testing.assert_allclose(tree.sum[inner], tree.sum[2 * inner] + tree.sum[2 * inner + 1], rtol=1e-12)
    np.testing.assert_array_equal(tree.min[inner], np.minimum(tree.min[2 * inner], tree.min[2 * inner + 1]))
    assert replay.size == 100 and tree.total() == pytest.approx(sum(p for _, p in live.values()), rel=1e-10)
    assert tree.min[1] == pytest.approx(min(p for _, p in live.values()))
    for i, (block, _) in live.items():  # the data is the newest written to each slot
        assert replay.data["obs"][i, 0].item() == block


def test_importance_weights_match_reference():
    """w_i = (N P(i))^-beta / max_j (N P(j))^-beta over the N stored transitions, P(i) = p_i^alpha / sum p^alpha;
    and a stratified batch holds one draw per slice of the total priority."""
    replay = apex.PrioritizedReplay(64, transition_fields(), 0.6, 1e-6, torch.device("cpu"))
    td = torch.rand(50) * 2
    replay.add(
        {
            "obs": torch.randn(50, 4),
            "next_obs": torch.randn(50, 4),
            "actions": torch.zeros(50, dtype=torch.long),
            "returns": torch.arange(50.0),
            "discounts": torch.zeros(50),
        },
        td,
    )
    P = (td.double().numpy() + 1e-6) ** 0.6
    P = P / P.sum()
    w_all = (50 * P) ** -0.5
    idx, batch, w = replay.sample(32, 0.5, np.random.default_rng(0))
    np.testing.assert_allclose(w.numpy(), w_all[idx] / w_all.max(), rtol=1e-5)
    # the batch, gathered into one buffer for one host-to-device copy, holds the sampled rows as they are stored
    for key, value in replay.data.items():
        assert batch[key].dtype == value.dtype and torch.equal(batch[key], value[torch.from_numpy(idx)])
    assert torch.equal(batch["returns"], torch.as_tensor(idx, dtype=torch.float32))  # the rows of the sampled leaves
    cdf = np.concatenate([[0], np.cumsum(P)])
    slice_of = np.floor(cdf[idx] * 32 + 1e-9)  # the slice each drawn leaf starts in is at most its own slice
    assert np.all(slice_of <= np.arange(32)) and np.all(np.floor(cdf[idx + 1] * 32 - 1e-9) >= np.arange(32))


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_learner_samples_with_the_papers_constant_beta(fraction):
    """The Ape-X paper keeps the importance-sampling exponent at 0.4 throughout (no annealing to 1): the learner
    asks the replay for weights with --beta at any point of the run."""
    fields = {key: torch.zeros(()) for key in ("returns", "discounts")}
    fields.update(obs=torch.zeros(4), next_obs=torch.zeros(4), actions=torch.zeros((), dtype=torch.long))
    replay = apex.PrioritizedReplay(64, fields, 0.6, 1e-6, torch.device("cpu"))
    replay.add({key: torch.rand((40,) + value.shape).to(value.dtype) for key, value in fields.items()}, torch.rand(40))
    asked = []
    sample = replay.sample
    replay.sample = lambda batch_size, beta, rng: asked.append(beta) or sample(batch_size, beta, rng)
    args = apex.RunArgs(batch_size=8, total_timesteps=1000)
    q_net, target_net = apex.QNetwork((4,), 2), apex.QNetwork((4,), 2)
    flat = apex.flatten_parameters(q_net)
    optimizer = torch.optim.Adam([flat], lr=1e-3)
    progress = apex.new_progress(apex.run_config(args))
    progress["global_step"] = int(fraction * args.total_timesteps)
    apex.learner_step(
        args, q_net, target_net, optimizer, replay, np.random.default_rng(0), progress, apex.new_stats(progress)
    )
    assert asked == [args.beta] == [0.4]


def test_replay_takes_an_empty_block_and_clamps_at_the_total():
    """A block whose windows all start on reset steps adds nothing; a draw at the very top of the total priority
    (where float sums can overshoot the written leaves) still lands on a written transition."""
    replay = apex.PrioritizedReplay(16, transition_fields(), 0.6, 1e-6, torch.device("cpu"))
    empty = {
        "obs": torch.zeros(0, 4),
        "next_obs": torch.zeros(0, 4),
        "actions": torch.zeros(0, dtype=torch.long),
        "returns": torch.zeros(0),
        "discounts": torch.zeros(0),
    }
    replay.add(empty, torch.zeros(0))
    assert replay.size == 0 and replay.tree.total() == 0
    replay.add({k: torch.ones((5,) + v.shape[1:], dtype=v.dtype) for k, v in empty.items()}, torch.rand(5))
    assert replay.size == 5
    leaves = replay.tree.find(np.array([np.nextafter(replay.tree.total(), 0)]))
    assert leaves[0] <= 4
    idx, _, _ = replay.sample(8, 0.4, np.random.default_rng(0))
    assert idx.max() <= 4


def short_episodes(module, monkeypatch, max_episode_steps: int) -> None:
    """The actor's envs (forked after this) truncate episodes at max_episode_steps, so that truncations, not only
    terminations, go through a real actor."""
    make_env = module.make_env
    monkeypatch.setattr(module, "make_env", lambda *a, **kw: make_env(*a, max_episode_steps=max_episode_steps, **kw))


def test_actor_blocks_are_n_step_transitions_of_one_stream(monkeypatch):
    """A real actor (CartPole: reward 1 per step, random actions, episodes truncated at 20 steps) over shared
    buffers: every valid window's n-step return and discount follow from its episode end, consecutive windows
    continue one another across blocks (x' of a window that did not end is x of the window n steps later), reset
    steps are invalid windows, a terminated window has discount 0 and a truncated one bootstraps (gamma^m from the
    final observation), and the actor's priorities are |delta| of its own network."""
    # epsilon 1: random actions, whose episodes end both ways
    # (a greedy random network's mostly end one way)
    args = apex.RunArgs(num_envs=3, block_length=5, n_step=3, num_actors=1, deterministic=True, epsilon=1.0)
    args.total_actors, gamma, T, N, n, max_steps = 1, args.gamma, 5, 3, 3, 20
    spec = apex.envpool.make_spec(args.env_id)
    torch.manual_seed(0)
    net = apex.QNetwork(spec.observation_space.shape, 2, hidden=args.hidden_size)
    short_episodes(apex, monkeypatch, max_steps)
    actor, buffers, store, free_q, full_q = start_actor(apex, args, spec, net)
    try:
        windows = []
        for b in range(60):
            k = full_q.get(timeout=30)
            assert buffers["meta"][k].tolist() == [max(b - 1, 0), 0, b]
            blk = {key: v[k].clone() for key, v in buffers.items()}
            if b >= 1:  # the version block b + 1 waits for
                store.publish(apex.flat_params(net), b)
            free_q.put(k)
            windows += [
                {
                    key: blk[key].view(T, N, *blk[key].shape[1:])[t]
                    for key in ("obs", "next_obs", "actions", "returns", "discounts", "priorities", "valid")
                }
                for t in range(T)
            ]
            delta, _ = apex.td_errors(
                net, net, blk["obs"], blk["actions"], blk["returns"], blk["discounts"], blk["next_obs"]
            )
            torch.testing.assert_close(blk["priorities"], delta.abs().detach())
        ended = terminated = truncated = invalid = 0
        length = [0] * N  # steps of each env's episode so far, up to and including window s
        for s, w in enumerate(windows[:-n]):
            for e in range(N):
                if not w["valid"][e]:
                    invalid += 1
                    length[e] = 0
                    continue
                length[e] += 1
                m = next((k + 1 for k in range(n) if windows[s + k + 1]["valid"][e] == 0), n)
                assert w["returns"][e].item() == pytest.approx(sum(gamma**k for k in range(m)), rel=1e-6)
                if m == n and windows[s + n]["valid"][e]:  # the bootstrap state is the window n steps later's start
                    assert torch.equal(w["next_obs"][e], windows[s + n]["obs"][e])
                    assert w["discounts"][e].item() == pytest.approx(gamma**n)
                elif m < n:  # x' is the final observation, which the window at s + m (a reset step) starts from
                    assert torch.equal(w["next_obs"][e], windows[s + m]["obs"][e]) and not windows[s + m]["valid"][e]
                    ended += 1
                    episode_steps = length[e] + m - 1
                    assert episode_steps <= max_steps
                    if w["discounts"][e].item() == 0.0:
                        terminated += 1
                    else:  # only a truncation bootstraps, and CartPole truncates at max_steps only
                        assert w["discounts"][e].item() == pytest.approx(gamma**m) and episode_steps == max_steps
                        truncated += 1
        assert ended > 0 and terminated > 0 and truncated > 0 and invalid > 0, (terminated, truncated)
    finally:
        actor.kill()
        actor.join()


ALGOS = ["apex", "r2d2"]  # R2D2 runs on Ape-X's actors, replay and links: the runs below are shared


@pytest.mark.parametrize("name", ALGOS)
def test_smoke_two_actors(runner, name):
    check_ok(runner.run(name, *FAST, "--num-actors", 2, "--eval-episodes", 3, "--capture-video"))
    s = runner.summary("CartPole-v1", name)
    assert SUMMARY_KEYS <= s.keys() and s["algo"] == name and s["num_actors"] == 2
    assert 6144 <= s["global_step"] < 6144 + 2 * 1024 and s["learner_updates"] == updates_allowed(
        name, s["global_step"], 1024
    )
    assert s["policy_lag_mean"] > 0  # actors fill blocks ahead of the learner's updates
    assert s["replay_inserts_per_s"] > 0 and s["replay_samples_per_s"] > 0
    assert_video_of_the_first_eval_episode(runner.run_dir("CartPole-v1", name))


# summary.json's keys that time the run
TIMING = LAUNCH_KEYS | {"replay_inserts_per_s", "replay_samples_per_s", "learner_updates_per_s", "learner_compute_s"}


@pytest.mark.parametrize("name", ALGOS)
def test_torchrun_two_ranks_deterministic_is_bitwise(runner, name):
    """Rank 0: learner, replay and one local actor; rank 1: a remote actor shipping its blocks through gloo. In the
    deterministic mode two runs end with the same weights. (The default mode's two-rank run to its end is the
    elastic-restart test's, tests/reliability/test_killed.py.)"""
    for exp in ("a", "b"):
        check_ok(runner.run(name, *FAST, "--num-actors", 1, "--deterministic", "--exp-name", exp, nproc=2))
    a, b = runner.summary("CartPole-v1", "a"), runner.summary("CartPole-v1", "b")
    assert a["world_size"] == 2 and a["total_actors"] == 2 and a["global_step"] >= 6144
    assert {k: v for k, v in a.items() if k not in TIMING} == {k: v for k, v in b.items() if k not in TIMING}


# The learner process's side of the end of a run: its actors are killed (one of them perhaps mid-put, holding the full
# queue's lock), then a remote actor's bridge puts its last block; the process must still exit. Without
# cancel_join_thread its exit waited for that put to reach the pipe, for ever: a likely cause of the hang of Ape-X's
# two-rank test once in CI, after the summary (not caught in the act).
END_OF_RUN = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("m", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
args = m.RunArgs(num_actors=1)
m.agree_on_actors(args, 0, 0)
env_spec = m.envpool.make_spec(args.env_id)
flat = m.flat_params(m.make_network(args, env_spec))
buffers = m.block_buffers(args, env_spec, args.num_buffers)
store = m.ParameterStore(flat.numel())
store.publish(flat, 0)
control = {}
actors, _, free_q, full_q = m.start_actors(args, env_spec, {}, buffers, store, control, m.Heartbeats(1))
index = full_q.get(timeout=30)
# the lock an actor's queue thread holds while it writes (CPython's multiprocessing.Queue._wlock)
fork = m.mp.get_context("fork")
got = fork.Event()
holder = fork.Process(target=lambda: (full_q._wlock.acquire(), got.set(), time.sleep(60)), daemon=True)
holder.start()
assert got.wait(30)
m.stop_actors(actors + [holder], control)
full_q.put(index)
print("exiting", flush=True)
"""


@pytest.mark.parametrize("name", ALGOS)
def test_the_learner_exits_when_a_killed_actor_held_a_queue_lock(name):
    command = [sys.executable, "-c", END_OF_RUN, str(ROOT / "algos" / f"{name}.py")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "exiting" in done.stdout, done.stderr[-2000:]


@pytest.mark.learning
def test_learns_cartpole_with_a_short_budget(runner):
    """15% of the defaults' budget (conventions §9): with --total-timesteps 60000 the final evaluation reached
    LEARNED_FLOOR on every one of 10 seeds (116-438 on the AMD EPYC; `python benchmark/run.py learning_proofs`,
    learning_proofs_short_cartpole.json, docs/apex.md), far above a policy that learned nothing (a random one averages
    about 22). One of seeds 1-3 must reach it. Whether the full 400k-step runs end solved is the final-eval
    benchmark's question."""
    assert_solves(runner, "apex", "--total-timesteps", 60_000, threshold=LEARNED_FLOOR)


@pytest.mark.parametrize("cpus", [1, 2, 3, 16])
def test_default_actor_count_fits_any_core_count(monkeypatch, cpus):
    m = load_algo("apex")
    monkeypatch.setattr(m, "available_cpus", lambda: cpus)
    assert m.default_num_actors(m.RunArgs()) == max(1, cpus - 1)
    m.validate(m.RunArgs(deterministic=True))


# --restart-every (rounds of 2 blocks), --checkpoint-every (updates), --buffer-size: the first checkpoint comes at a
# restart point some rounds before the end (Ape-X: round 16 of 48; R2D2: round 12 of about 28)
RESTARTS = {"apex": [8, 300, 20000], "r2d2": [4, 100, 2000]}


@pytest.mark.parametrize("name", ALGOS)
def test_deterministic_mode_resumed_at_a_restart_point_is_bitwise_the_uninterrupted_run(runner, name):
    """With --restart-every: a run killed (no checkpoint of its own) and resumed from its last periodic checkpoint,
    written at a restart point with the replay in it, ends with the uninterrupted run's summary (less timing;
    params_sha256 is its weights), bit for bit. (So two runs of the deterministic mode with two local actors end
    alike; the mode without restart points is the torchrun test's above.)"""
    every, checkpoint_every, buffer_size = RESTARTS[name]
    args = ["--deterministic", "--num-actors", 2, "--total-timesteps", 12288, "--learning-starts", 1024]
    args += ["--buffer-size", buffer_size, "--restart-every", every, "--checkpoint-every", checkpoint_every]
    saved = run_whole_and_kill_at_first_checkpoint(runner, name, args)
    assert saved["round"] > 0 and saved["round"] % every == 0 and saved["replay"]["size"] > 0
    resumed = runner.run(name, *args, "--exp-name", "cut", "--resume")
    check_ok(resumed)
    steps = [int(step) for step in re.findall(r"global_step=(\d+)", resumed.stdout)]
    assert steps[0] > saved["global_step"], resumed.stdout[:500]  # resumed, not anew
    whole, cut = runner.summary("CartPole-v1", "whole"), runner.summary("CartPole-v1", "cut")
    assert {k: v for k, v in whole.items() if k not in TIMING} == {k: v for k, v in cut.items() if k not in TIMING}


@pytest.mark.parametrize("name", ["apex", "r2d2"])
def test_sum_tree_and_replay_refuse_what_they_cannot_hold(name):
    """A capacity below 1, a negative or NaN priority, and a draw from an empty replay raise a clear error (the
    empty replay used to return index -1 with infinite weights)."""
    module = load_algo(name)
    for capacity in (0, -5):
        with pytest.raises(ValueError, match="capacity must be positive"):
            module.SumTree(capacity)
    tree = module.SumTree(8)
    for priority in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="non-negative"):
            tree.update(np.array([2]), np.array([priority]))
    tree.update(np.array([2]), np.array([0.0]))
    assert tree.total() == 0.0
    fields = {"obs": torch.zeros(4)}
    replay = module.PrioritizedReplay(16, fields, 0.6, 1e-6, torch.device("cpu"))
    with pytest.raises(ValueError, match="empty replay"):
        replay.sample(4, 0.4, np.random.default_rng(0))

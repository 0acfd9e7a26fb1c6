"""algos/a3c.py: n-step returns, loss and shared optimizers against slow references written from the paper;
shared state across processes; runs as a user launches them."""

import math
import multiprocessing

import numpy as np
import pytest
import torch
from conftest import (
    SUMMARY_KEYS,
    assert_bad_argument,
    assert_solves,
    assert_video_of_the_first_eval_episode,
    check_ok,
    load_algo,
)

a3c = load_algo("a3c")
FAST = ["--total-timesteps", 4000, "--eval-episodes", 2]


# ------------------------------------------------------------------------------------------ pure functions
def nstep_reference(rewards, values, bootstrap, terms, dones, gamma):
    """Algorithm S3 of the paper, step by step per env: R <- V(s_T) (0 if terminal), then R <- r_i + gamma R going
    back. An episode that ends inside the segment restarts R there: 0 after a termination, V of the final
    observation (the next step's input, or the bootstrap at the end) after a truncation."""
    T, N = rewards.shape
    out = np.zeros((T, N))
    for n in range(N):
        for t in range(T):
            ret, discount = 0.0, 1.0
            for k in range(t, T):
                ret += discount * rewards[k, n]
                v_next = bootstrap[n] if k == T - 1 else values[k + 1, n]
                if terms[k, n]:
                    break
                if dones[k, n] or k == T - 1:
                    ret += discount * gamma * v_next
                    break
                discount *= gamma
            out[t, n] = ret
    return out


@pytest.mark.parametrize("seed", range(5))
def test_nstep_returns_match_reference(seed):
    g = np.random.default_rng(seed)
    T, N, gamma = 7, 5, 0.9
    rewards, values, bootstrap = g.normal(size=(T, N)), g.normal(size=(T, N)), g.normal(size=N)
    terms = g.random((T, N)) < 0.2
    dones = terms | (g.random((T, N)) < 0.2)  # truncations too
    rewards[1:][dones[:-1]] = 0.0  # envpool's reset step after an end: reward 0 (it is masked out of the loss)
    t = lambda x: torch.as_tensor(x, dtype=torch.float64)  # noqa: E731
    ours = a3c.nstep_returns(t(rewards), t(values), t(bootstrap), t(terms), t(dones), gamma)
    np.testing.assert_allclose(
        ours.numpy(), nstep_reference(rewards, values, bootstrap, terms, dones, gamma), rtol=1e-12, atol=1e-12
    )


def test_nstep_return_without_episode_end_is_discounted_sum():
    r = torch.tensor([[1.0], [2.0], [3.0]])
    zeros = torch.zeros(3, 1)
    R = a3c.nstep_returns(r, zeros, torch.tensor([10.0]), zeros, zeros, 0.5)
    assert R[:, 0].tolist() == [1 + 0.5 * 2 + 0.25 * 3 + 0.125 * 10, 2 + 0.5 * 3 + 0.25 * 10, 3 + 0.5 * 10]


def test_loss_matches_hand_computation():
    torch.manual_seed(0)
    agent = a3c.Agent((3,), a3c.gym.spaces.Discrete(2))
    T, N = 4, 3
    seg = {
        "obs": torch.randn(T, N, 3),
        "actions": torch.randint(0, 2, (T, N)),
        "state": agent.initial_state(N),
        "valid": torch.tensor([[1.0, 1, 1], [1, 0, 1], [1, 1, 1], [0, 1, 1]]),
    }
    returns = torch.randn(T, N)
    args = a3c.Args(ent_coef=0.01, vf_coef=0.5)
    loss, (pg, vl, ent) = a3c.a3c_loss(agent, seg, returns, args)
    terms = {"pg": 0.0, "v": 0.0, "ent": 0.0}
    with torch.no_grad():
        for t in range(T):
            for n in range(N):
                if not seg["valid"][t, n]:
                    continue
                x = seg["obs"][t, n]
                p = torch.softmax(agent.actor(x), -1)
                v = agent.critic(x)[0]
                a = seg["actions"][t, n]
                terms["pg"] -= math.log(p[a]) * float(returns[t, n] - v)
                terms["v"] += 0.5 * float(returns[t, n] - v) ** 2
                terms["ent"] -= float((p * p.log()).sum())
    n = float(seg["valid"].sum())
    assert pg.item() == pytest.approx(terms["pg"] / n, rel=1e-5)
    assert vl.item() == pytest.approx(float(terms["v"]) / n, rel=1e-5)
    assert ent.item() == pytest.approx(terms["ent"] / n, rel=1e-5)
    assert loss.item() == pytest.approx((terms["pg"] + 0.5 * float(terms["v"]) - 0.01 * terms["ent"]) / n, rel=1e-5)


def test_gaussian_logprob_and_entropy_match_torch():
    agent = a3c.Agent((3,), a3c.gym.spaces.Box(-1, 1, (2,)))
    with torch.no_grad():
        agent.actor_logstd.copy_(torch.tensor([0.3, -0.7]))
    out, actions = torch.randn(5, 2), torch.randn(5, 2)
    logp, ent = agent.logprob_entropy(out, actions)
    ref = torch.distributions.Normal(out, agent.actor_logstd.exp())
    torch.testing.assert_close(logp, ref.log_prob(actions).sum(-1))
    torch.testing.assert_close(ent, ref.entropy().sum(-1))


def test_shared_rmsprop_matches_the_papers_update():
    """theta <- theta - lr dtheta / sqrt(g + eps), g <- alpha g + (1 - alpha) dtheta^2, elementwise in plain Python."""
    g = np.random.default_rng(0)
    theta = torch.tensor(g.normal(size=6))
    optimizer = a3c.SharedRMSprop([theta], 0.01, 0.99, 0.1)
    ref_theta, ref_g = list(theta.tolist()), [0.0] * 6
    for _ in range(4):
        theta.grad = torch.tensor(g.normal(size=6))
        optimizer.step()
        for i in range(6):
            ref_g[i] = 0.99 * ref_g[i] + 0.01 * float(theta.grad[i]) ** 2
            ref_theta[i] -= 0.01 * float(theta.grad[i]) / math.sqrt(ref_g[i] + 0.1)
    np.testing.assert_allclose(theta.numpy(), ref_theta, rtol=1e-12)
    np.testing.assert_allclose(optimizer.state[theta]["square_avg"].numpy(), ref_g, rtol=1e-12)


def test_shared_adam_with_its_state_made_up_front_is_torch_adam_bitwise():
    """SharedAdam creates Adam's state at construction (to share it before the fork) as torch would at step 1."""
    torch.manual_seed(0)
    theta = torch.randn(10)
    ref = theta.clone()
    shared = a3c.SharedAdam([theta], 3e-3, eps=1e-5)
    adam = torch.optim.Adam([ref], lr=3e-3, eps=1e-5)
    for _ in range(5):
        theta.grad = torch.randn(10)
        ref.grad = theta.grad.clone()
        shared.step()
        adam.step()
    assert torch.equal(theta, ref)
    assert all(torch.equal(shared.state[theta][k], adam.state[ref][k]) for k in adam.state[ref])


# ------------------------------------------------------------------------------------------ shared state
def _apply_step(flat, optimizer, counter):
    torch.set_num_threads(1)  # as the workers do: a forked child must not reuse the parent's thread pool
    flat.grad = torch.ones_like(flat)
    optimizer.step()
    a3c.count(counter, 5)


@pytest.mark.parametrize("name", ["SharedRMSprop", "SharedAdam"])
def test_a_step_in_one_process_is_seen_by_another(name):
    """The model and the optimizer state live in shared memory, also after a restore (load_state_dict replaces the
    state tensors, share_memory moves them): a worker's in-place step reaches the parent's agent and optimizer."""
    agent = a3c.Agent((4,), a3c.gym.spaces.Discrete(2))
    flat = a3c.flatten_parameters(agent)
    optimizer = getattr(a3c, name)([flat], 0.1)
    optimizer.load_state_dict(getattr(a3c, name)([flat.clone()], 0.1).state_dict())
    a3c.share_memory(flat, optimizer)
    before = [p.detach().clone() for p in agent.parameters()]
    ctx = multiprocessing.get_context("fork")
    counter = ctx.Array("q", [0, 0])
    p = ctx.Process(target=_apply_step, args=(flat, optimizer, counter))
    p.start()
    p.join(timeout=30)
    assert p.exitcode == 0 and list(counter) == [5, 1]
    state = optimizer.state[flat]
    # the optimizer state moved in the child, and so did the parent's parameters
    assert torch.all(state["square_avg" if name == "SharedRMSprop" else "exp_avg_sq"] > 0)
    assert all(not torch.equal(a, b) for a, b in zip(before, agent.parameters(), strict=True))


def _count_many(counter, n):
    for _ in range(n):
        a3c.count(counter, 3)


def test_shared_counter_is_exact_under_concurrency():
    ctx = multiprocessing.get_context("fork")
    counter = ctx.Array("q", [0, 0])
    procs = [ctx.Process(target=_count_many, args=(counter, 20000)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert list(counter) == [4 * 20000 * 3, 4 * 20000]


def test_lstm_state_restarts_after_a_reset_step():
    torch.manual_seed(0)
    agent = a3c.Agent((4,), a3c.gym.spaces.Discrete(2), use_lstm=True)
    obs = torch.randn(3, 2, 4)
    valid = torch.tensor([[1.0, 1.0], [0.0, 1.0], [1.0, 1.0]])  # env 0: step 1 is a reset step
    out, _, _ = agent(obs, valid, torch.randn(2, 2, 64))
    fresh, _, _ = agent(obs[2:, :1], torch.ones(1, 1), agent.initial_state(1))
    torch.testing.assert_close(out[2, 0], fresh[0, 0])


@pytest.mark.parametrize("cpus", [1, 2, 3, 4, 16])
def test_default_worker_count_is_the_affinity_mask_capped_at_4(monkeypatch, cpus):
    monkeypatch.setattr(a3c.os, "sched_getaffinity", lambda pid: set(range(cpus)))
    assert a3c.default_num_workers() == min(cpus, 4)


# ------------------------------------------------------------------------------------------ runs
def test_smoke_two_workers(runner):
    check_ok(runner.run("a3c", *FAST, "--num-workers", 2, "--capture-video"))
    s = runner.summary("CartPole-v1", "a3c")
    assert SUMMARY_KEYS <= s.keys() and s["algo"] == "a3c" and s["num_workers"] == 2
    assert s["global_step"] >= 4000 and s["updates"] * 5 * 8 == s["global_step"]  # the counter lost nothing
    assert_video_of_the_first_eval_episode(runner.run_dir("CartPole-v1", "a3c"))


@pytest.mark.parametrize(
    "extra",
    [
        ["--use-lstm"],
        ["--optimizer", "rmsprop"],
        ["--env-id", "Pendulum-v1"],
        ["--env-id", "Pendulum-v1", "--use-lstm"],
    ],
    ids=["lstm", "rmsprop", "gaussian", "gaussian-lstm"],
)
def test_variants_run(runner, extra):
    check_ok(runner.run("a3c", *FAST, "--num-workers", 2, *extra))


def test_image_network_shapes():
    agent = a3c.Agent((4, 84, 84), a3c.gym.spaces.Discrete(6), use_lstm=True)
    out, values, state = agent(
        torch.zeros(2, 3, 4, 84, 84, dtype=torch.uint8), torch.ones(2, 3), agent.initial_state(3)
    )
    assert out.shape == (2, 3, 6) and values.shape == (2, 3) and state.shape == (2, 3, 256)


@pytest.mark.learning
def test_learns_cartpole_with_defaults(runner):
    assert_solves(runner, "a3c")


def test_one_worker_is_bitwise_repeatable(runner):
    args = ["--num-workers", 1, "--total-timesteps", 12000, "--eval-episodes", 2, "--save-model"]
    for name in ("a", "b"):
        check_ok(runner.run("a3c", *args, "--exp-name", name))
    wa, wb = (torch.load(runner.run_dir("CartPole-v1", n) / "model.pt", weights_only=True) for n in ("a", "b"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    sa, sb = runner.summary("CartPole-v1", "a"), runner.summary("CartPole-v1", "b")
    assert sa["eval_return_mean"] == sb["eval_return_mean"] and sa["train_return_last20"] == sb["train_return_last20"]


def test_torchrun_is_refused_with_one_line(runner):
    """A3C is one node by design (docs: IMPALA and DD-PPO for many): a rank started by torchrun exits 2 naming the
    flag that spawns workers instead, before anything starts."""
    import subprocess
    import sys

    from conftest import ALGOS, child_env

    proc = subprocess.run(
        [sys.executable, str(ALGOS / "a3c.py")],
        cwd=runner.cwd,
        capture_output=True,
        text=True,
        env=dict(child_env(), WORLD_SIZE="2", RANK="0", LOCAL_RANK="0"),
        timeout=60,
    )
    assert_bad_argument(proc, "num-workers", runner.cwd)

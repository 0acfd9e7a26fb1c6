"""IMPALA (algos/impala.py). The pure functions (V-trace, loss, networks) are the same text in
algos/seed.py, so their tests run on both files; tests/test_seed.py covers what differs."""

import json
import queue
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from conftest import (
    LAUNCH_KEYS,
    LEARNED_FLOOR,
    SUMMARY_KEYS,
    assert_solves,
    assert_video_of_the_first_eval_episode,
    check_ok,
    load_algo,
    run_whole_and_kill_at_first_checkpoint,
)

impala = load_algo("impala")
BOTH = [impala, load_algo("seed")]
FAST = ["--total-timesteps", 12800]  # whole updates of the default batch (32 x 20 steps) on 1 and 2 ranks


def vtrace_reference(blp, tlp, r, v, boot, term, done, valid, gamma, rho_bar, c_bar, lam):
    """Straight from the paper's definition (Eq. 1), one (s, env) at a time:
    v_s = V(x_s) + sum_{t >= s} gamma^(t-s) (prod_{i=s}^{t-1} c_i) rho_t (r_t + gamma V(x_{t+1}) - V(x_t)),
    the sum ending with the unroll or at the step where the episode ends (no bootstrap after a termination)."""
    T, B = r.shape
    ratio = np.exp(tlp - blp)
    rho, c = np.minimum(rho_bar, ratio), lam * np.minimum(c_bar, ratio)
    V = np.concatenate([v, boot[None]])
    vs, adv = v.copy(), np.zeros_like(r)
    for b in range(B):
        for s in range(T):
            if not valid[s, b]:
                continue
            for t in range(s, T):
                vs[s, b] += (
                    gamma ** (t - s)
                    * np.prod(c[s:t, b])
                    * rho[t, b]
                    * (r[t, b] + gamma * (1 - term[t, b]) * V[t + 1, b] - V[t, b])
                )
                if done[t, b]:
                    break
    VS = np.concatenate([vs, boot[None]])
    for b in range(B):
        for s in range(T):
            adv[s, b] = rho[s, b] * (r[s, b] + gamma * (1 - term[s, b]) * VS[s + 1, b] - v[s, b])
    return vs, adv


def random_unroll(seed, T=12, B=6, on_policy=False):
    """Random [T, B] inputs with episode ends (some terminated, some truncated) and envpool's reset steps."""
    rng = np.random.default_rng(seed)
    done = rng.random((T, B)) < 0.2
    term = done & (rng.random((T, B)) < 0.5)
    valid = np.ones((T, B))
    valid[1:][done[:-1]] = 0
    blp = rng.normal(size=(T, B))
    tlp = blp.copy() if on_policy else blp + 0.5 * rng.normal(size=(T, B))
    assert done.any() and term.any() and (done & ~term).any()
    return [
        blp,
        tlp,
        rng.normal(size=(T, B)),
        rng.normal(size=(T, B)),
        rng.normal(size=B),
        term * 1.0,
        done * 1.0,
        valid,
    ]


@pytest.mark.parametrize("algo", BOTH, ids=["impala", "seed"])
@pytest.mark.parametrize(
    "gamma,rho_bar,c_bar,lam", [(0.99, 1.0, 1.0, 1.0), (0.9, 0.8, 0.5, 0.95), (0.95, 2.0, 1.5, 1.0)]
)
def test_vtrace_matches_reference(algo, gamma, rho_bar, c_bar, lam):
    for seed in range(3):
        inputs = random_unroll(seed)
        vs, adv = algo.vtrace(*[torch.as_tensor(x) for x in inputs], gamma, rho_bar, c_bar, lam)
        ref_vs, ref_adv = vtrace_reference(*inputs, gamma, rho_bar, c_bar, lam)
        np.testing.assert_allclose(vs.numpy(), ref_vs, rtol=1e-10, atol=1e-10)
        valid = inputs[-1]
        np.testing.assert_allclose(adv.numpy() * valid, ref_adv * valid, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("algo", BOTH, ids=["impala", "seed"])
def test_vtrace_on_policy_is_n_step_return(algo):
    """pi = mu, rho_bar = c_bar = lambda = 1: v_s is the bootstrapped n-step return to the unroll's end or the
    episode's end (bootstrapping from the final observation's value after a truncation, not after termination)."""
    gamma = 0.97
    blp, tlp, r, v, boot, term, done, valid = random_unroll(7, on_policy=True)
    vs, _ = algo.vtrace(*[torch.as_tensor(x) for x in (blp, tlp, r, v, boot, term, done, valid)], gamma)
    T, B = r.shape
    V = np.concatenate([v, boot[None]])
    for b in range(B):
        for s in range(T):
            if not valid[s, b]:
                assert vs[s, b] == pytest.approx(v[s, b])
                continue
            ret, t = 0.0, s
            while True:
                ret += gamma ** (t - s) * r[t, b]
                if done[t, b] or t == T - 1:
                    ret += gamma ** (t - s + 1) * V[t + 1, b] * (1 - term[t, b])
                    break
                t += 1
            assert vs[s, b].item() == pytest.approx(ret, abs=1e-10)


@pytest.mark.parametrize("algo", BOTH, ids=["impala", "seed"])
@pytest.mark.parametrize("network,obs_shape", [("mlp", (4,)), ("nature", (4, 84, 84)), ("resnet", (4, 84, 84))])
def test_networks_and_lstm_reset(algo, network, obs_shape):
    """Shapes for every torso; with an LSTM, one pass over [T, N] equals stepping one step at a time, and the
    state after a reset step (valid = 0) is zero, so an episode's outputs do not depend on the one before."""
    torch.manual_seed(0)
    agent = algo.Agent(obs_shape, 6, network, use_lstm=True)
    T, N = 5, 3
    obs = torch.randint(0, 255, (T, N) + obs_shape).float()
    valid = torch.ones(T, N)
    valid[2, 1] = 0
    with torch.no_grad():
        logits, values, state = agent(obs, valid, agent.initial_state(N))
        assert logits.shape == (T, N, 6) and values.shape == (T, N)
        s = agent.initial_state(N)
        for t in range(T):
            lt, _, s = agent(obs[t : t + 1], valid[t : t + 1], s)
            torch.testing.assert_close(lt[0], logits[t])
        fresh, _, _ = agent(obs[3:, 1:2], torch.ones(2, 1), agent.initial_state(1))
        torch.testing.assert_close(fresh[:, 0], logits[3:, 1])


def test_loss_gradient_signs():
    """The V-trace policy gradient raises the log-probability of actions with positive advantage."""
    torch.manual_seed(0)
    agent = impala.Agent((4,), 2)
    args = impala.Args()
    T, B = 4, 3
    batch = {
        "obs": torch.randn(T + 1, B, 4),
        "actions": torch.zeros(T, B, dtype=torch.long),
        "logits": torch.zeros(T, B, 2),
        "state": agent.initial_state(B),
        "rewards": torch.full((T, B), 10.0),
        "terms": torch.zeros(T, B),
        "dones": torch.zeros(T, B),
        "valid": torch.ones(T, B),
    }
    args.vf_coef, args.ent_coef = 0.0, 0.0
    before = torch.log_softmax(agent(batch["obs"], torch.ones(T + 1, B), batch["state"])[0], -1)[..., 0].mean()
    loss, _ = impala.impala_loss(agent, batch, args)
    loss.backward()
    with torch.no_grad():
        for p in agent.parameters():
            p -= 0.1 * p.grad
    after = torch.log_softmax(agent(batch["obs"], torch.ones(T + 1, B), batch["state"])[0], -1)[..., 0].mean()
    assert after > before


@pytest.mark.parametrize("algo", BOTH, ids=["impala", "seed"])
def test_bf16_runs_the_network_in_bfloat16_and_the_loss_in_float32(algo):
    """--bf16: the learner's convolutions run in bfloat16, the loss and the float32 weights' gradients stay close
    to the float32 loss's (bfloat16 keeps about 3 significant digits)."""
    torch.manual_seed(0)
    agent = algo.Agent((4, 84, 84), 6)
    T, B = 5, 2
    batch = {
        "obs": torch.randint(0, 256, (T + 1, B, 4, 84, 84), dtype=torch.uint8),
        "actions": torch.randint(0, 6, (T, B)),
        "logits": torch.randn(T, B, 6),
        "state": agent.initial_state(B),
        "rewards": torch.randn(T, B),
        "terms": torch.zeros(T, B),
        "dones": torch.zeros(T, B),
        "valid": torch.ones(T, B),
    }
    conv_dtypes = []
    agent.torso[0].register_forward_hook(lambda module, inputs, output: conv_dtypes.append(output.dtype))
    results = {}
    for bf16 in (False, True):
        args = algo.Args(bf16=bf16)
        agent.zero_grad()
        loss, losses = algo.impala_loss(agent, batch, args)
        loss.backward()
        results[bf16] = (loss.detach(), losses, agent.torso[0].weight.grad.clone())
    assert conv_dtypes == [torch.float32, torch.bfloat16]
    assert results[True][0].dtype == results[True][1].dtype == torch.float32
    torch.testing.assert_close(results[True][0], results[False][0], rtol=0.05, atol=0.02)
    torch.testing.assert_close(results[True][1], results[False][1], rtol=0.05, atol=0.02)
    cosine = torch.nn.functional.cosine_similarity(results[True][2].flatten(), results[False][2].flatten(), dim=0)
    assert cosine > 0.99


def filled_unroll_buffers(algo, num_buffers: int = 5):
    """unroll_buffers of Pong-like sizes, shrunk (frames of 4 x 7 x 7 bytes: spans that end off any 64-byte
    boundary), filled with random values."""
    args = algo.Args(num_envs=3, unroll_length=4)
    spec = SimpleNamespace(observation_space=SimpleNamespace(shape=(4, 7, 7)), action_space=SimpleNamespace(n=6))
    buffers = algo.unroll_buffers(args, spec, num_buffers, state_width=5)
    generator = torch.Generator().manual_seed(0)
    for buffer in buffers.values():
        if buffer.is_floating_point():
            buffer.copy_(torch.randn(buffer.shape, generator=generator))
        else:
            buffer.copy_(torch.randint(0, 200, buffer.shape, generator=generator))
    return buffers


@pytest.mark.parametrize("algo", BOTH, ids=["impala", "seed"])
def test_take_batch_gives_each_unroll_as_indexing_the_buffers_does(algo):
    """take_batch packs the learner's tensors into one buffer for one host-to-device copy: each comes out as
    buffer[index] laid out [T, K*N], the bookkeeping too; the buffers go back to the free queue."""
    buffers = filled_unroll_buffers(algo)
    free_q = queue.Queue()
    indices = [3, 0, 4]
    batch, returns, versions, finished = algo.take_batch(buffers, indices, free_q, "cpu")
    index = torch.tensor(indices)
    for key in algo.LEARNER_KEYS:
        assert batch[key].dtype == buffers[key].dtype
        torch.testing.assert_close(batch[key], buffers[key][index].transpose(0, 1).flatten(1, 2), rtol=0, atol=0)
    torch.testing.assert_close(returns, buffers["returns"][index].transpose(0, 1).flatten(1, 2), rtol=0, atol=0)
    assert versions.tolist() == buffers["meta"][index][:, 0].tolist()
    episodes = [buffers[key][index].transpose(0, 1).flatten().tolist() for key in ["ep_return", "ep_length"]]
    assert finished == list(zip(*episodes, strict=True)) and list(free_q.queue) == indices


@pytest.mark.parametrize("algo", BOTH, ids=["impala", "seed"])
@pytest.mark.parametrize("use_lstm", [False, True])
def test_compiled_loss_equals_the_eager_loss(algo, use_lstm):
    """--compile's loss, traced by torch.compile (the aot_eager backend: the same graph and autograd, run by eager
    kernels, so the test builds no C++), gives the eager loss and gradient, and a second batch needs no
    recompilation."""
    torch.manual_seed(0)
    agent = algo.Agent((4,), 2, use_lstm=use_lstm)
    flat = algo.flatten_parameters(agent)
    args = algo.Args()
    torch._dynamo.reset()
    compiled = torch.compile(algo.impala_loss, backend="aot_eager", fullgraph=True)
    for seed in (1, 2):
        blp, _, rewards, _, _, terms, dones, valid = (torch.tensor(x, dtype=torch.float32) for x in random_unroll(seed))
        T, B = rewards.shape
        batch = {
            "obs": torch.randn(T + 1, B, 4),
            "actions": torch.randint(0, 2, (T, B)),
            "logits": torch.stack([blp, torch.zeros(T, B)], -1),
            "state": torch.randn_like(agent.initial_state(B)),
            "rewards": rewards,
            "terms": terms,
            "dones": dones,
            "valid": valid,
        }
        results = []
        # the second batch must reuse the first one's graph
        with torch._dynamo.config.patch(error_on_recompile=seed > 1):
            for loss_function in (algo.impala_loss, compiled):
                flat.grad.zero_()
                loss, losses = loss_function(agent, batch, args)
                loss.backward()
                results.append((loss.detach(), losses.detach(), flat.grad.clone()))
        for eager, traced in zip(*results, strict=True):
            torch.testing.assert_close(traced, eager)


# stands in for torch.compile in the child process: it records what was compiled and how often it was called
RECORDING_COMPILE = """
import atexit, json, os, torch
calls = {}
def recording_compile(function, **options):
    calls[function.__name__] = 0
    def compiled(*args, **kwargs):
        calls[function.__name__] += 1
        return function(*args, **kwargs)
    return compiled
torch.compile = recording_compile
atexit.register(lambda: open(os.environ["COMPILE_RECORD"], "w").write(json.dumps(calls)))
"""


@pytest.mark.parametrize("name", ["impala", "seed"])
def test_compile_flag_hands_the_compiled_loss_to_every_learner_step(runner, monkeypatch, tmp_path, name):
    """--compile: main compiles impala_loss once and every update's learner step calls the compiled function. The
    child's torch.compile is a recorder (a sitecustomize on PYTHONPATH), so the test compiles nothing."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(RECORDING_COMPILE)
    monkeypatch.setenv("PYTHONPATH", str(hook))
    monkeypatch.setenv("COMPILE_RECORD", str(tmp_path / "compiled.json"))
    check_ok(runner.run(name, "--total-timesteps", 12800, "--num-actors", 2, "--compile", "--exp-name", name))
    defaults = load_algo(name).Args()
    updates = 12800 // (defaults.batch_size * defaults.unroll_length)
    assert json.loads((tmp_path / "compiled.json").read_text()) == {"impala_loss": updates}
    assert runner.summary("CartPole-v1", name)["global_step"] == 12800


def actor_harness(args, num_buffers: int, free: int, actors: int):
    """Real actor processes over shared buffers, as main sets them up: `free` buffers start free; version 0
    published. Returns (agent, buffers, store, free_q, full_q, processes)."""
    args.unrolls_per_batch = args.batch_size // args.num_envs
    spec = impala.envpool.make_spec(args.env_id)
    agent = impala.Agent(spec.observation_space.shape, spec.action_space.n)
    buffers = impala.unroll_buffers(args, spec, num_buffers, 0)
    store = impala.ParameterStore(sum(p.numel() for p in agent.parameters()))
    store.publish(impala.flat_params(agent), 0)
    ctx = mp.get_context("fork")
    free_q, full_q = ctx.Queue(maxsize=num_buffers), ctx.Queue(maxsize=num_buffers)
    for k in range(free):
        free_q.put(k)
    heartbeats = impala.Heartbeats(actors)
    schedule = impala.Schedule(args, 0)
    procs = [
        ctx.Process(
            target=impala.actor_loop, args=(i, args, buffers, store, free_q, full_q, schedule, heartbeats), daemon=True
        )
        for i in range(actors)
    ]
    for p in procs:
        p.start()
    return agent, buffers, store, free_q, full_q, procs


def test_shared_memory_handover_exactly_once_and_bounded():
    """Two real actor processes fill 6 shared buffers; the consumer checks that every actor's unrolls arrive once
    each and in sequence, that x_T of one unroll is x_0 of the next (no buffer was overwritten while in use), and
    that the queues never hold more indices than there are buffers."""
    args = impala.RunArgs(num_envs=4, unroll_length=5, batch_size=8, num_actors=2)
    _, buffers, _, free_q, full_q, actors = actor_harness(args, 6, free=6, actors=2)
    try:
        seen, last_obs = {0: [], 1: []}, {}
        for _ in range(60):
            k = full_q.get(timeout=30)
            assert full_q.qsize() + free_q.qsize() <= 6
            version, actor, sequence = buffers["meta"][k].tolist()
            assert version == 0
            seen[actor].append(sequence)
            if actor in last_obs:
                assert torch.equal(buffers["obs"][k, 0], last_obs[actor])
            last_obs[actor] = buffers["obs"][k, -1].clone()
            # the reward scaler's statistic: R_t = gamma R_{t-1} + r_t along each env, 0 after an episode end
            r, d, R = (buffers[key][k].double() for key in ("rewards", "dones", "returns"))
            torch.testing.assert_close(R[1:], args.gamma * (1 - d[:-1]) * R[:-1] + r[1:], rtol=1e-6, atol=1e-4)
            free_q.put(k)
        for actor, sequences in seen.items():
            assert sequences == list(range(len(sequences))) and sequences, (actor, sequences)
    finally:
        for p in actors:
            p.kill()
            p.join()


def test_actor_fetches_parameters_after_waiting_for_a_buffer():
    """Default mode: an actor held up by backpressure (no free buffer) must start its next unroll with the
    parameters published while it waited, not with those it had before."""
    args = impala.RunArgs(num_envs=2, unroll_length=3, batch_size=2, num_actors=1)
    agent, buffers, store, free_q, full_q, (actor,) = actor_harness(args, 2, free=1, actors=1)
    try:
        first = full_q.get(timeout=30)
        assert buffers["meta"][first][0] == 0
        time.sleep(1.0)  # the actor now waits for a free buffer
        store.publish(impala.flat_params(agent) + 1.0, 1)
        free_q.put(1)
        assert buffers["meta"][full_q.get(timeout=30)][0] == 1  # version 1: fetched after the wait
    finally:
        actor.kill()
        actor.join()


def test_smoke_two_actors(runner):
    check_ok(runner.run("impala", *FAST, "--num-actors", 2, "--eval-episodes", 3, "--capture-video"))
    s = runner.summary("CartPole-v1", "impala")
    assert SUMMARY_KEYS <= s.keys() and s["algo"] == "impala" and s["num_actors"] == 2
    assert s["global_step"] == 12800 and s["policy_lag_mean"] >= 0
    assert_video_of_the_first_eval_episode(runner.run_dir("CartPole-v1", "impala"))


def test_torchrun_two_ranks(runner):
    check_ok(runner.run("impala", *FAST, "--num-actors", 1, nproc=2))
    s = runner.summary("CartPole-v1", "impala")
    assert s["world_size"] == 2 and s["global_step"] == 12800


@pytest.mark.learning
def test_learns_cartpole_with_a_short_budget(runner):
    """Under a third of the defaults' budget (conventions §9): with --total-timesteps 250000 the final evaluation
    reached LEARNED_FLOOR on every one of 10 seeds (222-500, 4 of them 500, on the AMD EPYC; `python
    benchmark/run.py learning_proofs`, learning_proofs_impala_cartpole.json). One of seeds 1-3 must reach it. Whether
    the defaults end solved is the final-eval benchmark's question (docs/impala.md)."""
    assert_solves(runner, "impala", "--total-timesteps", 250_000, threshold=LEARNED_FLOOR)


@pytest.mark.parametrize("cpus", [1, 2, 3, 4, 16])
def test_default_actor_count_fits_any_core_count(monkeypatch, cpus):
    """--num-actors 0: one per CPU; with --deterministic, a count that divides the unrolls of a batch, so that the
    mode runs with its other flags at their defaults on any machine."""
    m = load_algo("impala")
    monkeypatch.setattr(m, "available_cpus", lambda: cpus)
    assert m.default_num_actors(m.RunArgs()) == cpus
    for num_envs, batch_size in [(8, 8), (4, 8), (8, 32), (4, 24)]:
        args = m.RunArgs(deterministic=True, num_envs=num_envs, batch_size=batch_size)
        actors, unrolls = m.default_num_actors(args), batch_size // num_envs
        assert 1 <= actors <= min(cpus, unrolls) and unrolls % actors == 0
        m.validate(args)  # would exit 2 if the count did not divide


def test_default_mode_runs_more_actors_than_a_batch_has_unrolls(runner):
    """6 actors for the 4 unrolls of a default batch (32 env unrolls, 8 envs an actor), as many-core machines get."""
    check_ok(runner.run("impala", "--num-actors", 6, "--total-timesteps", 3200, "--eval-episodes", 1))
    assert runner.summary("CartPole-v1", "impala")["num_actors"] == 6


def test_deterministic_mode_runs_with_defaults(runner):
    check_ok(runner.run("impala", "--deterministic", "--total-timesteps", 3200))
    m = load_algo("impala")
    assert runner.summary("CartPole-v1", "impala")["num_actors"] == m.default_num_actors(m.RunArgs(deterministic=True))


def test_deterministic_mode_is_bitwise(runner):
    args = ["--deterministic", "--num-envs", 4, "--num-actors", 2, "--total-timesteps", 12000, "--save-model"]
    check_ok(runner.run("impala", *args, "--exp-name", "a"))
    check_ok(runner.run("impala", *args, "--exp-name", "b", "--checkpoint-every", 3))  # checkpoints change nothing
    a, b = runner.summary("CartPole-v1", "a"), runner.summary("CartPole-v1", "b")
    assert {k: v for k, v in a.items() if k not in LAUNCH_KEYS} == {k: v for k, v in b.items() if k not in LAUNCH_KEYS}
    updates = 12000 // (impala.Args().batch_size * 20)
    assert a["policy_lag_mean"] == pytest.approx((updates - 1) / updates)  # one update old, except the first
    wa = torch.load(runner.run_dir("CartPole-v1", "a") / "model.pt", weights_only=True)
    wb = torch.load(runner.run_dir("CartPole-v1", "b") / "model.pt", weights_only=True)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_deterministic_mode_resumed_at_a_restart_point_is_bitwise_the_uninterrupted_run(runner):
    """A run killed (no checkpoint of its own) and resumed from its last periodic checkpoint, at a restart point,
    ends with the uninterrupted run's summary (less timing; params_sha256 is its weights), bit for bit."""
    every = 10
    args = ["--deterministic", "--num-envs", 4, "--num-actors", 2, "--total-timesteps", 32000]
    args += ["--restart-every", every, "--checkpoint-every", every]
    update = run_whole_and_kill_at_first_checkpoint(runner, "impala", args)["update"]
    assert update % every == 0 and update < 32000 // 640
    resumed = runner.run("impala", *args, "--exp-name", "cut", "--resume")
    check_ok(resumed)
    assert f"update {update + 1}/50 " in resumed.stdout.splitlines()[0], resumed.stdout[:500]  # resumed, not anew
    whole, cut = runner.summary("CartPole-v1", "whole"), runner.summary("CartPole-v1", "cut")
    assert {k: v for k, v in whole.items() if k not in LAUNCH_KEYS} == {
        k: v for k, v in cut.items() if k not in LAUNCH_KEYS
    }
    # one update old, but for the first round after the start and after each restart point
    assert whole["policy_lag_mean"] == pytest.approx((50 - 5) / 50)

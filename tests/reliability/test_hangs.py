"""A worker or rank that hangs without dying (SIGSTOP) ends the job within a bounded time (docs/conventions.md §8):
the ranks waiting on a stopped rank fail once --collective-timeout has passed, and the launcher (torchrun's agent,
or the file's own parent) then ends the rest; a learner notices a silent local actor (A3C's parent, a silent
worker) after --actor-timeout (--worker-timeout) and ends the job naming it."""

import os
import signal
import subprocess
import time
from types import SimpleNamespace

import pytest
import torch
from conftest import (
    algo_command,
    alive,
    child_env,
    free_port,
    kill_one_worker,
    load_algo,
    session_members,
    signal_once_training,
    wait_for,
)

TIMEOUT = 5  # --collective-timeout of these runs, in seconds
# the files that fork their own workers; the file's parent gives them 2 s after one fails, then SIGTERM, 2 s more,
# then SIGKILL (a stopped worker needs it)
FORKED = ["es", "fedpg", "ga"]
GRACE = 4
LONG = ["--env-id", "CartPole-v1", "--total-timesteps", 10**8, "--collective-timeout", TIMEOUT]
# CPU seconds every worker has used before one is stopped: past its start-up (a stopped worker that has not yet
# given a sign of life gets 5 x the timeout; the run's event file alone comes before the actors' first steps)
BUSY_S = 0.5


@pytest.mark.parametrize("name", FORKED)
def test_a_stopped_worker_ends_the_job(runner, name):
    proc = runner.start(name, *LONG, "--num-workers", 2)
    kill_one_worker(
        proc,
        f"{name}.py",
        lambda: list(runner.cwd.glob("runs/*/events.*")),
        signal_number=signal.SIGSTOP,
        busy_s=BUSY_S,
        within=TIMEOUT + GRACE + 10,
    )


def start_ranks(runner, name: str, args: list, world_size: int = 2) -> list:
    """The ranks of a torchrun job without torchrun's agent: `python algos/<name>.py` once per rank, with the
    variables torchrun sets. The agent would end the job once a rank fails, after a 30 s grace for the stopped
    rank (measured by hand under torchrun: docs/reliability.md); what the file itself must do is fail the ranks
    left waiting, which this shows without the grace."""
    port = free_port()
    ranks = []
    for rank in range(world_size):
        env = child_env()
        env.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            WORLD_SIZE=str(world_size),
            LOCAL_WORLD_SIZE=str(world_size),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
        )
        command = algo_command(name, args)
        ranks.append(
            subprocess.Popen(
                command,
                cwd=runner.cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        )
    return ranks


@pytest.mark.parametrize("name", ["ddppo", "apex"])  # Ape-X stands for the remote actors of SEED and R2D2
def test_a_stopped_rank_fails_the_rank_waiting_for_it(runner, name):
    """Rank 1 stopped (DD-PPO: a rank of the all-reduce; Ape-X: a node of remote actors): rank 0 ends non-zero
    within --collective-timeout + 10 s, and none of its own processes outlives it."""
    rank0, rank1 = start_ranks(runner, name, LONG)
    try:
        stop = lambda: os.kill(rank1.pid, signal.SIGSTOP)  # noqa: E731
        out, seconds, own = signal_once_training(runner, rank0, stop, timeout=TIMEOUT + 30)
        assert seconds < TIMEOUT + 10, f"rank 0 took {seconds:.1f} s"
        assert rank0.returncode != 0, out[-2000:]
        assert wait_for(lambda: not alive(own), 5), f"left behind: {alive(own)}"
    finally:
        for rank in (rank0, rank1):
            try:
                os.killpg(rank.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            rank.wait()


# name -> the flag that bounds a local actor's (A3C: worker's) silence, and the flag for two of them
LOCAL = {
    "a3c": ("--worker-timeout", "--num-workers"),
    "apex": ("--actor-timeout", "--num-actors"),
    "impala": ("--actor-timeout", "--num-actors"),
    "r2d2": ("--actor-timeout", "--num-actors"),
    "seed": ("--actor-timeout", "--num-actors"),
}


@pytest.mark.parametrize("name", sorted(LOCAL))
def test_a_stopped_local_actor_ends_the_job_naming_it(runner, name):
    timeout_flag, count_flag = LOCAL[name]
    args = ["--env-id", "CartPole-v1", "--total-timesteps", 10**8, timeout_flag, TIMEOUT, count_flag, 2]
    proc = runner.start(name, *args)
    out = kill_one_worker(
        proc,
        f"{name}.py",
        lambda: list(runner.cwd.glob("runs/*/events.*")),
        signal_number=signal.SIGSTOP,
        busy_s=BUSY_S,
        within=TIMEOUT + 10,
    )
    assert f"silent for {TIMEOUT} s (stopped or hung)" in out, out[-2000:]


# -------------------------------------------------------------------------------------- start-up: a longer grace
# An actor or worker that has not yet shown a sign of life builds its envs and network (slow where many start on
# few cores): it has STARTUP_GRACE times the timeout; once it has beaten, asked or said "ready", the timeout.


class Clock:
    """Stands in for a module's `time`: monotonic() reads `now`."""

    def __init__(self, now: float):
        self.now = now

    def monotonic(self) -> float:
        return self.now


@pytest.mark.parametrize("name", ["apex", "impala", "r2d2"])
def test_heartbeats_give_an_actor_its_start_up_grace_before_the_first_beat_and_the_timeout_after(name, monkeypatch):
    module = load_algo(name)
    clock = Clock(100.0)
    monkeypatch.setattr(module, "time", clock)
    grace = module.Heartbeats.STARTUP_GRACE * 10.0
    beats = module.Heartbeats(2)
    # actor 0 beats at every look (4 s apart), actor 1 never does: it is reported only once the grace is over
    while clock.now <= 100.0 + grace:
        beats.beat(0)
        assert beats.silent_actor(10.0) is None, clock.now
        clock.now += 4.0
    assert beats.silent_actor(10.0) == (1, f"not started after {grace:g} s, 5 x --actor-timeout")
    # a beat, then silence: the timeout
    beats = module.Heartbeats(1)
    beats.beat(0)
    for _ in range(2):
        clock.now += 4.0
        assert beats.silent_actor(10.0) is None
    clock.now += 4.0
    assert beats.silent_actor(10.0) == (0, "silent for 10 s")


def test_a3c_waits_for_its_workers_ready_within_the_start_up_grace(monkeypatch):
    import queue
    from types import SimpleNamespace

    a3c = load_algo("a3c")
    messages = queue.Queue()
    messages.put(("ready", 0, None))
    workers = [SimpleNamespace(pid=11, exitcode=None), SimpleNamespace(pid=12, exitcode=None)]
    # receive() waits 0.2 s per pass: a timeout of 0.5 s keeps the parent's looks under half of it
    started = time.monotonic()
    expected = r"worker 1 \(pid 12\) not started after 2.5 s, 5 x --worker-timeout \(stopped or hung\)"
    with pytest.raises(a3c.WorkerDied, match=expected):
        a3c.wait_until_ready(messages, workers, timeout=0.5)
    assert 2.5 <= time.monotonic() - started < 5.0
    messages.put(("ready", 1, None))
    messages.put(("ready", 0, None))
    a3c.wait_until_ready(messages, workers, timeout=0.5)  # both ready: returns
    # a pause of the parent's own (the job suspended) starts the count again: a 100 s jump, then 2 s more
    clock = Clock(1000.0)
    monkeypatch.setattr(a3c, "time", clock)

    def receive(messages, workers):
        clock.now += 100.0 if clock.now == 1000.0 else 0.2
        if clock.now > 1102.0:
            return [("ready", 0, None)]
        return []

    monkeypatch.setattr(a3c, "receive", receive)
    a3c.wait_until_ready(messages, workers[1:], timeout=0.5)


def test_seed_ends_the_job_when_an_actor_never_asks_within_the_start_up_grace():
    import threading

    seed = load_algo("seed")
    # the loop looks every 0.2 s at most; a pause of over half the timeout would restart the count
    args = seed.RunArgs(num_actors=2, actor_timeout=0.5)
    args.total_actors = 2
    spec = seed.envpool.make_spec(args.env_id)
    agent = seed.Agent(spec.observation_space.shape, spec.action_space.n, args.network, args.use_lstm, True)
    slots = seed.actor_slots(args, spec, 2)
    unroll_queue = seed.UnrollQueue(args, spec, 4, agent.initial_state(1).shape[-1])
    pipes = [seed.mp.get_context("fork").Pipe() for _ in range(2)]
    control = {"version": 0, "stats": {"inference_batch_mean": [], "inference_latency_ms": [], "actor_wait_ms": []}}
    started = time.monotonic()
    inference = seed.start_inference(args, agent, threading.Lock(), slots, pipes, unroll_queue, control, 0)
    inference.join(timeout=10)
    assert not inference.is_alive()
    assert control["error"] == (0, "not started after 2.5 s, 5 x --actor-timeout (stopped or hung)")
    assert 2.5 <= time.monotonic() - started < 5.0


def test_seed_names_the_actor_it_lost_a_local_one_by_its_pid_a_remote_one_by_its_rank():
    import queue
    from types import SimpleNamespace

    seed = load_algo("seed")
    args = seed.RunArgs(num_actors=2)
    args.unrolls_per_batch = 1
    actors = [SimpleNamespace(pid=11, exitcode=None), SimpleNamespace(pid=12, exitcode=None)]
    inference = SimpleNamespace(is_alive=lambda: True)
    # actor 2 is the first remote one: rank 1's
    for actor, expected in [(1, r"^actor 1 \(pid 12\) silent for 5 s"), (2, r"^remote actor 2 \(rank 1\) silent")]:
        control = {"error": (actor, "silent for 5 s (stopped or hung)")}
        with pytest.raises(seed.ActorDied, match=expected):
            seed.next_batch(args, queue.Queue(), actors, inference, control)


@pytest.mark.parametrize("name", ["a3c", "apex", "impala", "r2d2", "seed"])
def test_an_error_after_the_actors_started_ends_the_run_at_once_with_none_left(runner, name):
    """The learner fails once its actors run (here its event file cannot be made: a file stands where the run's
    folder goes; a replay too large for memory fails at the same place in Ape-X and R2D2). The actors ignore the
    SIGTERM that the interpreter's exit sends them, so unless the learner kills them the exit waits for ever
    (Ape-X, IMPALA, R2D2 and SEED did, until the start-up after start_actors moved into the `try` that stops
    them)."""
    (runner.cwd / "runs").mkdir()
    (runner.cwd / "runs" / "CartPole-v1__blocked__1").write_text("")
    proc = runner.start(name, "--env-id", "CartPole-v1", "--exp-name", "blocked", "--total-timesteps", 10**6)
    try:
        output, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the run was still going 30 s after its start: its exit waits on actors left running")
    assert proc.returncode != 0
    assert "FileExistsError: [Errno 17] File exists: 'runs/CartPole-v1__blocked__1'" in output
    assert wait_for(lambda: not session_members(proc.pid), 5), f"left running: {session_members(proc.pid)}"


class SecondStartFails:
    """A fork context whose processes sleep (whatever their target) and whose second start raises `error`, as a
    fork refused for lack of memory or a second Ctrl-C during the forks would."""

    def __init__(self, error: BaseException):
        self.fork = torch.multiprocessing.get_context("fork")
        self.error = error
        self.started = []

    def __getattr__(self, name):
        return getattr(self.fork, name)

    def Process(self, target, args, daemon):
        process = self.fork.Process(target=time.sleep, args=(60,), daemon=daemon)
        start = process.start

        def start_or_fail():
            if self.started:
                raise self.error
            start()
            self.started.append(process)

        process.start = start_or_fail
        return process


# each file's start of its actors (A3C: workers), with arguments enough to reach the forks
START_ACTORS = {
    "a3c": lambda m: m.start_workers(SimpleNamespace(num_workers=3), None, None, None, None, 0),
    "apex": lambda m: m.start_actors(SimpleNamespace(num_buffers=4, num_actors=3, world_size=1), *[{}] * 6),
    "impala": lambda m: m.start_actors(SimpleNamespace(num_actors=3), {}, None, 4, None, None),
    "r2d2": lambda m: m.start_actors(SimpleNamespace(num_buffers=4, num_actors=3, world_size=1), *[{}] * 6),
    "seed": lambda m: m.start_actors(SimpleNamespace(num_actors=3, total_actors=3), {}, 0),
}


@pytest.mark.parametrize(
    "error", [OSError(12, "Cannot allocate memory"), KeyboardInterrupt()], ids=["oserror", "ctrl-c"]
)
@pytest.mark.parametrize("name", sorted(START_ACTORS))
def test_an_error_while_the_actors_start_kills_those_already_started(name, error, monkeypatch):
    """The actors forked before a failing one are killed and reaped, and the error goes on: otherwise they would
    run on, unknown to the learner's `finally`, and the interpreter's exit would wait for them for ever."""
    module = load_algo(name)
    context = SecondStartFails(error)
    monkeypatch.setattr(module.mp, "get_context", lambda method: context)
    try:
        with pytest.raises(type(error)):
            START_ACTORS[name](module)
        assert len(context.started) == 1
        assert context.started[0].exitcode == -signal.SIGKILL
    finally:
        for process in context.started:
            process.kill()
            process.join()

"""Ctrl-C (SIGINT to the whole foreground process group, as a terminal sends it) and SIGTERM to the launcher alone
(as `kill PID` or a scheduler sends it) stop every file cleanly: a checkpoint at the end of the current update, exit
0 within 10 s, no process left behind, nothing left in /dev/shm (docs/conventions.md §8). So does a signal during
start-up, once the run has done its first update. A checkpoint is refused for a run with another value of a flag
that defines it, and taken by a resume that changes only how the work is spread and how long the run goes: the run
trains on from the checkpoint's counters, or, given a budget already spent, only evaluates with the checkpoint's
weights (the case of a signal during the last update). Where no episode spans the cut (ES, the GA, federated PG) a
run resumed after SIGTERM ends as the uninterrupted run, bit for bit."""

import contextlib
import json
import os
import re
import signal
import threading
import time

import pytest
import torch
from conftest import (
    assert_same_result,
    check_ok,
    command_line_args,
    descendants,
    load_algo,
    progress_of,
    session_members,
    shared_memory_left,
    signal_once_training,
    updates_allowed,
    wait_for,
)

ALGOS = ["a3c", "apex", "ddppo", "es", "fedpg", "ga", "impala", "r2d2", "seed"]
# the files that fork workers, with two of them (the others run actors or ranks by default)
EXTRA = {"es": ["--num-workers", 2], "ga": ["--num-workers", 2], "fedpg": ["--num-workers", 2]}
# a flag that defines the run (its run_config), with a value other than the default, where a file has no
# --learning-rate
OTHER_FLAG = {"ga": ["--sigma", 0.5]}
# flags a resume may change (left out of run_config): how many processes and threads share the work, timeouts
SPREAD = {
    "a3c": ["--num-workers", 1],
    "ddppo": ["--env-threads", 2, "--collective-timeout", 60],
    "es": ["--num-workers", 1],
    "fedpg": ["--num-workers", 1],
    "ga": ["--num-workers", 1],
}


@contextlib.contextmanager
def forever_run(runner, name: str, *args):
    """A run of `name` on CartPole with no end in sight, in a session of its own (killed whole on the way out), with
    `args` (default: EXTRA's)."""
    args = args or EXTRA.get(name, [])
    proc = runner.start(name, "--env-id", "CartPole-v1", "--total-timesteps", 10**8, *args)
    try:
        yield proc
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def assert_stopped_cleanly(runner, proc, out: str, shared_memory_before: set) -> None:
    """Exit 0 after writing a checkpoint, no process of the job's session left, nothing new in /dev/shm."""
    assert proc.returncode == 0, out[-2000:]
    assert "signal received: checkpoint" in out, out[-2000:]
    assert list(runner.cwd.glob("runs/*/checkpoint.pt"))
    assert wait_for(lambda: not session_members(proc.pid), 5), f"left behind: {session_members(proc.pid)}"
    assert not shared_memory_left(shared_memory_before)


@pytest.mark.parametrize("name", ALGOS)
def test_ctrl_c_and_then_sigterm_each_end_in_a_checkpoint_that_a_resume_goes_on_from(runner, name, capsys):
    """Ctrl-C stops the run. Its checkpoint is refused for a run with another value of a flag that defines it, and
    resumed with other process and thread counts and timeouts: the run trains on from the checkpoint's counters
    (each progress line past its step), until SIGTERM to the launcher alone stops it as Ctrl-C did, with whole-run
    times (the first segment's included). Resumed once more with a budget already spent, it only evaluates: the
    case of a signal during the last update."""
    shared_memory_before = set(os.listdir("/dev/shm"))
    with forever_run(runner, name) as proc:
        out, seconds, _ = signal_once_training(runner, proc, lambda: os.killpg(proc.pid, signal.SIGINT), 30)
        assert seconds < 10, f"took {seconds:.1f} s to stop"
        assert_stopped_cleanly(runner, proc, out, shared_memory_before)
    checkpoint = next(runner.cwd.glob("runs/*/checkpoint.pt"))
    first = torch.load(checkpoint, weights_only=True)
    assert_other_flags_are_refused(name, checkpoint, capsys)

    spread = SPREAD.get(name, ["--env-threads", 2, "--actor-timeout", 30])
    with forever_run(runner, name, "--resume", *spread) as proc:
        lines, reader = follow(proc)
        assert wait_for(lambda: progress_steps(lines) and max(progress_steps(lines)) > first["global_step"], 60), (
            "".join(lines)[-2000:]
        )
        os.kill(proc.pid, signal.SIGTERM)
        sent_at = time.monotonic()
        proc.wait(timeout=30)
        seconds = time.monotonic() - sent_at
        reader.join(timeout=10)
        out = "".join(lines)
        assert seconds < 10, f"took {seconds:.1f} s to stop"
        assert_stopped_cleanly(runner, proc, out, shared_memory_before)
    assert min(progress_steps(lines)) > first["global_step"], out[-2000:]
    second = torch.load(checkpoint, weights_only=True)
    assert second["global_step"] > first["global_step"]
    for key in ["wall_time_s", "train_time_s", "startup_s"]:
        assert second[key] > first[key] > 0, key
    if first["time_to_threshold_s"] is not None:  # reached before the cut: kept, not measured again
        assert second["time_to_threshold_s"] == first["time_to_threshold_s"]
    if name in ("apex", "r2d2"):
        # the replay is not in the checkpoint: the resumed run refills it for --learning-starts steps before the
        # learner updates again (fewer updates than an uninterrupted run), then at the rate limit
        assert first["update"] == updates_allowed(name, first["global_step"])
        resumed_steps = second["global_step"] - first["global_step"]
        assert second["update"] == first["update"] + updates_allowed(name, resumed_steps)

    # with a budget already spent it resumes and only evaluates: its counters and final weights are the
    # checkpoint's, bit for bit, and its times whole-run figures, though this segment trained none
    only_evaluate = ["--total-timesteps", 1, "--eval-episodes", 1, "--save-model"]
    check_ok(runner.run(name, "--env-id", "CartPole-v1", "--resume", *only_evaluate, *EXTRA.get(name, [])))
    summary = json.loads((checkpoint.parent / "summary.json").read_text())
    assert summary["global_step"] == second["global_step"]
    assert summary["sps"] > 0 and summary["train_time_s"] > 0
    assert_weights_are_the_checkpoints(name, torch.load(checkpoint.parent / "model.pt", weights_only=True), second)


def assert_other_flags_are_refused(name: str, checkpoint, capsys) -> None:
    """The checkpoint read for a run with another value of a flag that defines the run (in-process: read_checkpoint
    against that run's configuration, as main() calls it; the exit 2 with one line, end to end, is
    test_bad_checkpoint.py's): exit 2, one line naming the setting with the checkpoint's value and the new one, the
    checkpoint untouched."""
    content = checkpoint.read_bytes()
    flag, value = OTHER_FLAG.get(name, ["--learning-rate", 0.5])
    setting = flag[2:].replace("-", "_")
    recorded = torch.load(checkpoint, weights_only=True)["config"][setting]
    with pytest.raises(SystemExit) as exit_info:
        load_algo(name).read_checkpoint(str(checkpoint), progress_of(name, **{setting: value}))
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1, lines
    assert f"is of a run with {flag} {recorded} (now {flag} {value})" in lines[0], lines[0]
    assert checkpoint.read_bytes() == content


def follow(proc) -> tuple:
    """The lines of a running job's output, appended by a thread as they come (so that a test can wait for one),
    and the thread, which ends with the output."""
    lines = []

    def read():
        for line in proc.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return lines, reader


def progress_steps(lines: list) -> list:
    return [int(step) for step in re.findall(r"global_step=(\d+)", "".join(lines))]


def assert_weights_are_the_checkpoints(name: str, model: dict, saved: dict) -> None:
    """model.pt of a resumed run that trained no further holds the checkpoint's weights exactly (the GA: the elite's
    seed list, its whole genome)."""
    if name == "ga":
        assert model["seeds"] == saved["elite"]
    elif name in ("es", "fedpg"):
        assert torch.equal(model["theta"], saved["model"])
        assert name == "fedpg" or torch.equal(model["obstat"], saved["obstat"])
    else:
        assert model.keys() == saved["model"].keys()
        assert all(torch.equal(model[key], value) for key, value in saved["model"].items())


# the files where no episode spans a cut (a generation or round ends them all): a resumed run is bitwise the
# uninterrupted one; a budget of at least 8 times the 0.5 s wait on a 2-core machine, so that on a faster CPU the
# signal still comes before the end
BITWISE = {
    "es": ["--total-timesteps", 600_000],
    "fedpg": [
        *["--total-timesteps", 250_000, "--aggregator", "fedpg-br"],
        *["--num-byzantine", 3, "--attack", "sign-flip"],  # the filter's counts and the server's data cross the cut
    ],
    "ga": ["--total-timesteps", 500_000, "--elite-episodes", 10],  # decodes the parents from their seed lists
}


@pytest.mark.parametrize("name", sorted(BITWISE))
def test_a_run_resumed_after_sigterm_ends_as_the_uninterrupted_run(runner, name):
    """The run to its end ("whole"); again with 2 spawned workers ("cut"), SIGTERM once it has started, exit 0 with
    a checkpoint and no summary; resumed with 2 workers (rank 0 reads the checkpoint and broadcasts it), it ends
    with the whole run's summary."""
    args = ["--env-id", "CartPole-v1", *BITWISE[name], "--eval-episodes", 2]
    check_ok(runner.run(name, *args, "--exp-name", "whole"))
    proc = runner.start(name, *args, "--exp-name", "cut", "--num-workers", 2)
    assert wait_for(lambda: list(runner.run_dir("CartPole-v1", "cut").glob("events.*")), 60)
    time.sleep(0.5)  # the workers install their signal handlers right after creating the event file
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "checkpoint" in out, out
    assert not (runner.run_dir("CartPole-v1", "cut") / "summary.json").exists(), "the run ended before the signal"
    check_ok(runner.run(name, *args, "--exp-name", "cut", "--resume", "--num-workers", 2))
    assert_same_result(runner.summary("CartPole-v1", "whole"), runner.summary("CartPole-v1", "cut"))


# the moment start-up is under way: the first forked worker or actor exists (DD-PPO forks none: its run folder,
# made before its envs), polled every millisecond
def starting(runner, proc) -> bool:
    return bool(descendants(proc.pid)) or (runner.cwd / "runs").exists()


# (file, how the signal comes): Ctrl-C to the whole group for every file, which reaches workers and actors just
# forked; SIGTERM to the launcher alone for the files whose parent forwards it to its workers
START_UP = [(name, "ctrl-c") for name in ALGOS] + [(name, "sigterm") for name in ["es", "fedpg", "ga"]]


@pytest.mark.parametrize(("name", "how"), START_UP)
def test_a_signal_during_start_up_ends_in_a_checkpoint(runner, name, how):
    """A signal while the job starts (its workers or actors forked, not yet running their code; DD-PPO before its
    envs exist) is kept: every file installs its handlers first thing in main(), and forked processes keep them
    until they ignore the signals themselves. The run finishes its first update, writes a checkpoint and exits
    0, as it does once training."""
    shared_memory_before = set(os.listdir("/dev/shm"))
    with forever_run(runner, name) as proc:
        assert wait_for(lambda: starting(runner, proc), 60, interval=0.001), "the job did not start"
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert_stopped_cleanly(runner, proc, out, shared_memory_before)


@pytest.mark.parametrize("name", ALGOS)
def test_a_second_ctrl_c_ends_the_run_at_once(runner, name):
    """A second Ctrl-C a moment after the first, wherever it lands (the update, the checkpoint, the teardown, the
    interpreter's exit, which restores the default handlers): the job ends within 10 s, by SIGINT or with exit 0
    where the first one's stop was done, nothing left behind, and a checkpoint, where the first Ctrl-C got that
    far, whole. On CartPole the first stop can be over within the moment, so that the second meets the exit;
    that the second one raises KeyboardInterrupt is checked in-process below."""
    shared_memory_before = set(os.listdir("/dev/shm"))

    def twice():
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)

    with forever_run(runner, name) as proc:
        out, seconds, _ = signal_once_training(runner, proc, twice, 30)
        assert seconds < 10, f"took {seconds:.1f} s to stop"
        assert proc.returncode in (0, -signal.SIGINT), out[-2000:]
        assert wait_for(lambda: not session_members(proc.pid), 5), f"left behind: {session_members(proc.pid)}"
        assert not shared_memory_left(shared_memory_before)
    for checkpoint in runner.cwd.glob("runs/*/checkpoint.pt"):
        assert torch.load(checkpoint, weights_only=True)["update"] >= 1


@pytest.mark.parametrize("name", ALGOS)
def test_the_first_ctrl_c_asks_for_a_stop_and_the_second_raises_keyboard_interrupt(name):
    """The handlers as main() installs them in the launcher (in-process, restored afterwards): the first SIGINT
    sets the stop flag, the second raises KeyboardInterrupt."""
    saved = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    try:
        stop = load_algo(name).install_stop_handlers()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        assert stop["signal"] == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
    finally:
        for number, handler in saved.items():
            signal.signal(number, handler)


class KilledWithCtrlC:
    """An actor (or A3C worker) whose kill() meets a Ctrl-C: SIGINT to this process, then the real kill."""

    def __init__(self, process):
        self.process = process

    def kill(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        self.process.kill()

    def join(self) -> None:
        self.process.join()


@pytest.mark.parametrize("name", ["a3c", "apex", "impala", "r2d2", "seed"])
def test_a_ctrl_c_while_the_actors_are_stopped_leaves_none_running(name):
    """A second Ctrl-C that reached IMPALA's learner while it killed its actors (two tests sharing the CPUs,
    `dc5c875`) raised KeyboardInterrupt there: an actor was left running, and the interpreter's exit waited for it
    (actors ignore the SIGTERM that exit sends) past the test's 30 s. The files that fork actors or workers stop
    them with Ctrl-C ignored, then put the handler back (in-process here, the handler restored afterwards)."""
    module = load_algo(name)
    context = torch.multiprocessing.get_context("fork")
    processes = [context.Process(target=time.sleep, args=(60,), daemon=True) for _ in range(2)]
    for process in processes:
        process.start()
    saved = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        actors = [KilledWithCtrlC(process) for process in processes]
        try:
            if name == "a3c":
                module.stop_workers(actors)
            elif name in ("apex", "r2d2"):
                module.stop_actors(actors, {})
            else:
                module.stop_actors(actors)
        except KeyboardInterrupt:
            pytest.fail("Ctrl-C raised while the actors were stopped")
        assert not any(process.is_alive() for process in processes)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, saved)
        for process in processes:
            process.kill()
            process.join()


class StartedWorkers:
    """torch's start_processes context as spawn_workers sees it: one live worker (this process's pid), joined at
    once."""

    processes = [type("Worker", (), {"pid": os.getpid(), "is_alive": lambda self: True})()]

    def join(self, timeout=None, grace_period=None) -> bool:
        return True


@pytest.mark.parametrize("name", ["es", "fedpg", "ga"])
def test_a_stop_kept_while_the_workers_start_reaches_them_as_sigusr1(name, monkeypatch):
    """A Ctrl-C while spawn_workers forks arms the parent's second-Ctrl-C switch, and a worker forked after that
    inherits it until it installs its own handlers: the kept stop must reach the workers as SIGUSR1, which they
    take as the same request, not as SIGINT, which raised KeyboardInterrupt there (exit 1, or a worker gone
    before the rendezvous and the job waiting for it)."""
    module = load_algo(name)
    sent = []
    monkeypatch.setattr(module.mp, "start_processes", lambda *args, **kwargs: StartedWorkers())
    monkeypatch.setattr(module.os, "kill", lambda pid, number: sent.append(number))
    monkeypatch.setenv("MASTER_ADDR", "")
    monkeypatch.setenv("MASTER_PORT", "")
    saved = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    try:
        assert module.spawn_workers(command_line_args(module)(num_workers=2), {"signal": signal.SIGINT}) == 0
    finally:
        for number, handler in saved.items():
            signal.signal(number, handler)
    assert sent == [signal.SIGUSR1]

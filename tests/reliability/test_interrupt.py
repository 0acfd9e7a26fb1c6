"""Ctrl-C (SIGINT to the whole foreground process group, as a terminal sends it) stops every file cleanly: a
checkpoint at the end of the current update, exit 0 within 10 s, no process left behind, nothing left in /dev/shm
(docs/conventions.md §8). So does a signal during start-up, once the run has done its first update. The checkpoint
a Ctrl-C wrote is then refused by a resume that changes a flag defining the run."""

import contextlib
import os
import signal
import time

import pytest
from conftest import descendants, session_members, signal_once_training, wait_for

ALGOS = ["a3c", "apex", "ddppo", "es", "fedpg", "ga", "impala", "r2d2", "seed"]
# the files that fork workers, with two of them (the others run actors or ranks by default)
EXTRA = {"es": ["--num-workers", 2], "ga": ["--num-workers", 2], "fedpg": ["--num-workers", 2]}
# a flag that defines the run (its run_config), with a value other than the default, where a file has no
# --learning-rate
OTHER_FLAG = {"ga": ["--sigma", 0.5]}


@contextlib.contextmanager
def forever_run(runner, name: str):
    """A run of `name` on CartPole with no end in sight, in a session of its own (killed whole on the way out)."""
    proc = runner.start(name, "--env-id", "CartPole-v1", "--total-timesteps", 10**8, *EXTRA.get(name, []))
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
    assert set(os.listdir("/dev/shm")) <= shared_memory_before


@pytest.mark.parametrize("name", ALGOS)
def test_ctrl_c_checkpoints_and_exits_0(runner, name):
    shared_memory_before = set(os.listdir("/dev/shm"))
    with forever_run(runner, name) as proc:
        out, seconds, _ = signal_once_training(runner, proc, lambda: os.killpg(proc.pid, signal.SIGINT), 30)
        assert seconds < 10, f"took {seconds:.1f} s to stop"
        assert_stopped_cleanly(runner, proc, out, shared_memory_before)
    assert_resume_refuses_other_flags(runner, name)


def assert_resume_refuses_other_flags(runner, name: str) -> None:
    """The stopped run resumed with another value of a flag that defines it: exit 2 within 10 s, one line naming
    the flag with the checkpoint's value, the checkpoint untouched."""
    checkpoint = next(runner.cwd.glob("runs/*/checkpoint.pt"))
    content = checkpoint.read_bytes()
    flag, value = OTHER_FLAG.get(name, ["--learning-rate", 0.5])
    started = time.monotonic()
    proc = runner.run(name, "--env-id", "CartPole-v1", "--resume", flag, value, *EXTRA.get(name, []))
    seconds = time.monotonic() - started
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert f"is of a run with {flag} " in lines[0] and f"(now {value})" in lines[0], lines[0]
    assert seconds < 10, f"took {seconds:.1f} s"
    assert checkpoint.read_bytes() == content


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

"""Ctrl-C (SIGINT to the whole foreground process group, as a terminal sends it) stops every file cleanly: a
checkpoint at the end of the current update, exit 0 within 10 s, no process left behind, nothing left in /dev/shm
(docs/conventions.md §8)."""

import os
import signal

import pytest
from conftest import alive, signal_once_training, wait_for

ALGOS = ["a3c", "apex", "ddppo", "es", "fedpg", "ga", "impala", "r2d2", "seed"]
# the files that fork workers, with two of them (the others run actors or ranks by default)
EXTRA = {"es": ["--num-workers", 2], "ga": ["--num-workers", 2], "fedpg": ["--num-workers", 2]}


@pytest.mark.parametrize("name", ALGOS)
def test_ctrl_c_checkpoints_and_exits_0(runner, name):
    shared_memory_before = set(os.listdir("/dev/shm"))
    proc = runner.start(name, "--env-id", "CartPole-v1", "--total-timesteps", 10**8, *EXTRA.get(name, []))
    try:
        out, seconds, processes = signal_once_training(runner, proc, lambda: os.killpg(proc.pid, signal.SIGINT), 30)
        assert seconds < 10, f"took {seconds:.1f} s to stop"
        assert proc.returncode == 0, out[-2000:]
        assert "signal received: checkpoint" in out, out[-2000:]
        assert list(runner.cwd.glob("runs/*/checkpoint.pt"))
        assert wait_for(lambda: not alive(processes), 5), f"left behind: {alive(processes)}"
        assert set(os.listdir("/dev/shm")) <= shared_memory_before
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

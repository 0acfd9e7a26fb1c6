"""A worker or rank that hangs without dying (SIGSTOP) ends the job within a bounded time (docs/conventions.md §8):
the ranks waiting on a stopped rank fail once --collective-timeout has passed, and the launcher (torchrun's agent,
or the file's own parent) then ends the rest; a learner notices a silent local actor (A3C's parent, a silent
worker) after --actor-timeout (--worker-timeout) and ends the job naming it."""

import os
import signal
import subprocess

import pytest
from conftest import algo_command, alive, child_env, free_port, kill_one_worker, signal_once_training, wait_for

TIMEOUT = 5  # --collective-timeout of these runs, in seconds
# the files that fork their own workers; the file's parent gives them 2 s after one fails, then SIGTERM, 2 s more,
# then SIGKILL (a stopped worker needs it)
FORKED = ["es", "fedpg", "ga"]
GRACE = 4
LONG = ["--env-id", "CartPole-v1", "--total-timesteps", 10**8, "--collective-timeout", TIMEOUT]


@pytest.mark.parametrize("name", FORKED)
def test_a_stopped_worker_ends_the_job(runner, name):
    proc = runner.start(name, *LONG, "--num-workers", 2)
    kill_one_worker(
        proc,
        f"{name}.py",
        lambda: list(runner.cwd.glob("runs/*/events.*")),
        signal_number=signal.SIGSTOP,
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
        within=TIMEOUT + 10,
    )
    assert f"silent for {TIMEOUT} s (stopped or hung)" in out, out[-2000:]

"""A worker or rank that hangs without dying (SIGSTOP) ends the job within a bounded time (docs/conventions.md §8):
the ranks waiting on a stopped rank fail once --collective-timeout has passed, and the launcher (torchrun's agent,
or the file's own parent) then ends the rest; a learner notices a silent local actor (A3C's parent, a silent
worker) after --actor-timeout (--worker-timeout) and ends the job naming it."""

import signal
from pathlib import Path

import pytest
from conftest import kill_one_worker, load_algo

TIMEOUT = 5  # --collective-timeout of these runs, in seconds
# torchrun's agent sends SIGTERM to the ranks left and waits 30 s before SIGKILL, which a stopped rank needs;
# the files that fork their own workers give them 2 s, then SIGTERM, 2 s more, then SIGKILL
GRACE = {"torchrun": 30, "forked": 4}
LONG = ["--env-id", "CartPole-v1", "--total-timesteps", 10**8, "--collective-timeout", TIMEOUT]
# name -> (arguments, torchrun processes or 0); Ape-X stands for the remote actors of SEED and R2D2 (same bridge)
JOBS = {
    "ddppo": (LONG, 2),
    "apex": (LONG, 2),
    "es": ([*LONG, "--num-workers", 2], 0),
    "ga": ([*LONG, "--num-workers", 2], 0),
    "fedpg": ([*LONG, "--num-workers", 2], 0),
}


def rank_one(agent: int):
    """Picks torchrun's rank 1 from the job's processes: the child of the agent with RANK=1 (its own forked
    actors inherit RANK but are its children)."""

    def pick(pids: list) -> int:
        for pid in pids:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if int(stat[1]) == agent and b"RANK=1" in environ:
                return pid
        raise AssertionError(f"no rank 1 among {pids}")

    return pick


@pytest.mark.parametrize("name", sorted(JOBS))
def test_a_stopped_rank_ends_the_job(runner, name):
    args, nproc = JOBS[name]
    proc = runner.start(name, *args, nproc=nproc)
    kill_one_worker(
        proc,
        f"{name}.py",
        lambda: list(runner.cwd.glob("runs/*/events.*")),
        signal_number=signal.SIGSTOP,
        within=TIMEOUT + GRACE["torchrun" if nproc else "forked"] + 10,
        pick=rank_one(proc.pid) if nproc else lambda workers: workers[-1],
    )


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


TIMEOUT_FLAGS = [
    (name, "--collective-timeout") for name in ["apex", "ddppo", "es", "fedpg", "ga", "impala", "r2d2", "seed"]
]
TIMEOUT_FLAGS += [(name, flag) for name, (flag, _) in sorted(LOCAL.items())]


@pytest.mark.parametrize("name, flag", TIMEOUT_FLAGS)
def test_a_timeout_that_is_not_positive_is_refused(name, flag, capsys):
    """validate() itself (the files call it first, before anything starts; exit 2 as for every bad argument)."""
    module = load_algo(name)
    args = module.Args(**{flag.removeprefix("--").replace("-", "_"): 0.0})
    with pytest.raises(SystemExit) as exit_info:
        module.validate(args)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0], lines

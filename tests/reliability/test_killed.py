"""A killed process never leaves the job running or anything behind (docs/conventions.md §8). A worker, actor or
rank killed mid-run (SIGKILL) ends the whole job within 10 s, non-zero, naming it. The launcher killed (the
`python algos/<file>.py` a user started, or torchrun's agent) takes every process of the job with it within 10 s
and leaves nothing in /dev/shm: the actors and forked workers ask the kernel to kill them with their parent
(PR_SET_PDEATHSIG), and so do ranks under torchrun, with their agent."""

import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import (
    algo_command,
    alive,
    child_env,
    descendants,
    kill_one_worker,
    session_members,
    shared_memory_left,
    wait_for,
)

ALGOS = ["a3c", "apex", "ddppo", "es", "fedpg", "ga", "impala", "r2d2", "seed"]
FOREVER = ["--env-id", "CartPole-v1", "--total-timesteps", 10**8]
# How each file runs two workers besides its learner (DD-PPO: two ranks under torchrun), and the words its error
# names the killed one by (the last one started is killed: worker 1 of two, actor 1 of two).
WORKERS = {
    "a3c": (["--num-workers", 2], "worker 1"),
    "apex": (["--num-actors", 2], "actor 1"),
    "r2d2": (["--num-actors", 2], "actor 1"),
    "impala": (["--num-actors", 2], "actor 1"),
    "seed": (["--num-actors", 2], "actor 1"),
    "ddppo": (["--local-num-envs", 8], ""),
    "es": (["--num-workers", 2], "error: worker"),
    "ga": (["--num-workers", 2], "error: worker"),
    "fedpg": (["--num-workers", 2], "error: worker"),
}
# the launcher a user starts: python for the files that run their own workers, torchrun (two ranks) for the
# eight files that take it (A3C is one node by design and refuses it)
LAUNCHES = [(name, 0) for name in ALGOS if name != "ddppo"] + [(name, 2) for name in ALGOS if name != "a3c"]


def training(cwd: Path):
    return lambda: list(cwd.glob("runs/*/events.*"))


@pytest.mark.parametrize("name", ALGOS)
def test_a_killed_worker_ends_the_job_naming_it(runner, name):
    extra, named = WORKERS[name]
    proc = runner.start(name, *FOREVER, *extra, nproc=2 if name == "ddppo" else 0)
    out = kill_one_worker(proc, f"{name}.py", training(runner.cwd))
    assert named in out, out


@pytest.mark.parametrize(("name", "nproc"), LAUNCHES, ids=[f"{n}-{'torchrun' if p else 'python'}" for n, p in LAUNCHES])
def test_a_killed_launcher_leaves_nothing_behind(runner, name, nproc):
    if nproc:
        # two ranks, each with its defaults (DD-PPO's 8 envs a rank keep its batch small)
        extra = ["--local-num-envs", 8] if name == "ddppo" else []
    else:
        extra = WORKERS[name][0]
    shared_memory_before = set(os.listdir("/dev/shm"))
    command = shlex.join(algo_command(name, [*FOREVER, *extra], nproc))
    # Launched from a shell in the background of a session of its own, output to a file, as a batch script
    # would: started from Python directly, the workers of files without a guard happened to die with it.
    shell = subprocess.run(
        ["bash", "-c", f"{command} > job.log 2>&1 < /dev/null & echo $!"],
        cwd=runner.cwd,
        env=child_env(),
        capture_output=True,
        text=True,
        check=True,
        start_new_session=True,
    )
    launcher = int(shell.stdout.split()[-1])
    session = os.getsid(launcher)
    job = []
    try:
        assert wait_for(training(runner.cwd), 60), (runner.cwd / "job.log").read_text()[-2000:]
        time.sleep(1.0)
        # torchrun starts each rank in a session of its own: the job is the launcher's descendants
        job = descendants(launcher)
        assert len(job) >= 2, "the job has no workers, actors or ranks"
        os.kill(launcher, signal.SIGKILL)

        def left():
            return sorted(set(alive(job) + session_members(session)))

        assert wait_for(lambda: not left(), 10), f"{left()} outlived the launcher by 10 s"
        assert not shared_memory_left(shared_memory_before)
    finally:
        for pid in set(alive(job) + session_members(session)):
            os.kill(pid, signal.SIGKILL)


# Under `torchrun --max-restarts=1`: each file's budget (a few checkpoints' worth of training after the first), how
# often it checkpoints, and the log line that only a run starting from scratch prints
ELASTIC = {
    "ddppo": (["--total-timesteps", 12_000, "--local-num-envs", 8, "--checkpoint-every", 3], "update 1/"),
    "impala": (["--total-timesteps", 30_000, "--checkpoint-every", 5], "update 1/"),
    "seed": (["--total-timesteps", 16_000, "--checkpoint-every", 10], "update 1/"),
    "apex": (["--total-timesteps", 6_000, "--checkpoint-every", 30], "update 0 "),
    "r2d2": (["--total-timesteps", 6_000, "--checkpoint-every", 20], "update 0 "),
    "es": (["--total-timesteps", 200_000, "--checkpoint-every", 2], "generation 1 "),
    "ga": (["--total-timesteps", 250_000, "--checkpoint-every", 1], "generation 1 "),
    "fedpg": (["--total-timesteps", 150_000, "--checkpoint-every", 1], "round 1 "),
}


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.parametrize("name", sorted(ELASTIC))
def test_an_elastic_restart_resumes_from_the_checkpoint_and_finishes(runner, name):
    """`torchrun --max-restarts=1` with `--resume`: a rank killed mid-run makes the agent restart every rank, which
    resume from the last checkpoint and finish the budget. TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with the store
    shared between rendezvous and process group (torch's default), a restarted rank failed to connect to the gloo
    address it read from the store (torch issue #135712 reports the same with NCCL)."""
    args, first_line = ELASTIC[name]
    budget = args[1]
    command = algo_command(name, ["--resume", *args], nproc=2)
    command.insert(command.index("torch.distributed.run") + 1, "--max-restarts=1")
    env = dict(child_env(), TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    proc = subprocess.Popen(
        command, cwd=runner.cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        run_dir = runner.run_dir("CartPole-v1", name)
        assert wait_for(lambda: (run_dir / "checkpoint.pt").exists(), 60), "no checkpoint"
        ranks = [pid for pid in alive(descendants(proc.pid)) if parent(pid) == proc.pid]
        assert len(ranks) == 2, ranks
        os.kill(max(ranks), signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out[-3000:]
        # torchrun logs the first failure it has on record: the killed rank's -9, or the exit 1 of a rank that saw
        # it go first (SEED's learner, rank 0, when its remote actor, rank 1, is killed)
        assert "failed (exitcode: " in out, "no rank was lost: the budget ended first"
        summary = runner.summary("CartPole-v1", name)
        # the budget, to the file's last whole update (DD-PPO: 46 x 256 of 12,000)
        assert budget * 0.97 <= summary["global_step"] and summary["world_size"] == 2
        # the restarted ranks began at a checkpoint, not at the start: the first log line only once
        assert out.count(first_line) == 1, out[-3000:]
    finally:
        for pid in alive(descendants(proc.pid)):
            os.kill(pid, signal.SIGKILL)
        proc.kill()


def importing(pid: int) -> bool:
    """The rank has begun to import a package from site-packages (its first shared library is mapped): a rank of the
    eight torchrun files is then past the PR_SET_PDEATHSIG that heads its imports. Until its exec, torchrun's fork
    is a copy of the agent, its command line and its memory (torch included)."""
    try:
        agent_copy = "torch.distributed.run" in Path(f"/proc/{pid}/cmdline").read_text()
        return not agent_copy and "site-packages" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("name", ["ddppo", "es", "impala"])
def test_ranks_whose_agent_dies_while_they_import_end_within_10_s(runner, name):
    """torchrun's agent SIGKILLed while its two ranks import their packages: both end within 10 s. They asked to die
    with their agent (PR_SET_PDEATHSIG) before those imports; without that request they wait for the dead agent's
    store until --collective-timeout (600 s by default). The agent is killed once both ranks have mapped a library from
    site-packages: an agent killed before a rank's interpreter reaches that request (its first 50 ms or so alone,
    longer on a loaded machine) is not seen, a known limit (docs/reliability.md)."""
    command = algo_command(name, FOREVER, nproc=2)
    proc = subprocess.Popen(
        command, cwd=runner.cwd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    ranks = []
    try:
        assert wait_for(lambda: len([p for p in descendants(proc.pid) if parent(p) == proc.pid]) == 2, 30, 0.002)
        ranks = [pid for pid in descendants(proc.pid) if parent(pid) == proc.pid]
        assert wait_for(lambda: all(importing(pid) for pid in ranks), 30, 0.002), "the ranks never began to import"
        os.kill(proc.pid, signal.SIGKILL)
        assert wait_for(lambda: not alive(ranks), 10), f"ranks alive 10 s after their agent: {alive(ranks)}"
    finally:
        for pid in alive(ranks):
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()

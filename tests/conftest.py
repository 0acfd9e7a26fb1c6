"""Fixtures shared by every algorithm's tests: run an algos/ file as a user would, read its outputs back."""

import importlib.util
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parents[1]
ALGOS = ROOT / "algos"
GLOO_EXIT_HOOK = Path(__file__).resolve().parent / "gloo_exit_hook"


def load_algo(name: str):
    """Import algos/<name>.py as a module (the files stand alone, so there is no package to import from)."""
    spec = importlib.util.spec_from_file_location(f"distrl_{name}", ALGOS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def command_line_args(module):
    """The class of every flag of a file's command line: `RunArgs` (the algorithm's `Args` and the infrastructure's
    `Infra`, below the fold) in the folded files, `Args` in the others."""
    return getattr(module, "RunArgs", module.Args)


def free_port() -> int:
    """A port free now, drawn at random outside the kernel's ephemeral range. bind(0) gives a port from that range,
    which the kernel may hand to any socket opened before the job binds it (gloo's connections in the test beside
    this one, another bind to port 0): the clean-clone run at 28c299e lost the rendezvous of a SLURM job that way
    (its torchrun agent reached another process's server on the port)."""
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = [*range(10000, low), *range(high + 1, 65536)]
    draw = random.SystemRandom()
    while True:
        port = draw.choice(ports)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


def child_env() -> dict:
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore")
    env.pop("RANK", None), env.pop("WORLD_SIZE", None), env.pop("LOCAL_RANK", None)
    return env


def algo_command(name: str, args, nproc: int = 0) -> list:
    """`python algos/<name>.py ARGS`, or under `torchrun --standalone --nproc_per_node=nproc` when nproc > 0."""
    script = str(ALGOS / f"{name}.py")
    if nproc:
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=1",
            f"--nproc_per_node={nproc}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{free_port()}",
            script,
            *map(str, args),
        ]
    return [sys.executable, script, *map(str, args)]


class Runner:
    """Runs algorithm files in a temporary working directory (their runs/ folder lands there)."""

    def __init__(self, cwd: Path):
        self.cwd = cwd

    def run(self, name: str, *args, nproc: int = 0, timeout: float = 300) -> subprocess.CompletedProcess:
        """Run to the end. Under torchrun, every rank checks at its interpreter's end that no gloo thread is left
        (tests/gloo_exit_hook), which fails the run."""
        env = child_env()
        if nproc:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(GLOO_EXIT_HOOK), env.get("PYTHONPATH")]))
        return subprocess.run(
            algo_command(name, args, nproc),
            cwd=self.cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, name: str, *args, nproc: int = 0) -> subprocess.Popen:
        return subprocess.Popen(
            algo_command(name, args, nproc),
            cwd=self.cwd,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def run_dir(self, env_id: str, exp_name: str, seed: int = 1) -> Path:
        return self.cwd / "runs" / f"{env_id}__{exp_name}__{seed}"

    def summary(self, env_id: str, exp_name: str, seed: int = 1) -> dict:
        """The run's summary.json, which must be strict JSON: NaN or Infinity (a mean of nothing) fails the test."""
        return json.loads(
            (self.run_dir(env_id, exp_name, seed) / "summary.json").read_text(),
            parse_constant=lambda c: pytest.fail(f"summary.json holds {c}, which JSON does not allow"),
        )


@pytest.fixture
def runner(tmp_path) -> Runner:
    return Runner(tmp_path)


def check_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    )


SUMMARY_KEYS = {
    "algo",
    "env_id",
    "seed",
    "world_size",
    "global_step",
    "wall_time_s",
    "startup_s",
    "train_time_s",
    "sps",
    "eval_return_mean",
    "eval_return_std",
    "train_return_last20",
    "time_to_threshold_s",
}


def descendants(pid: int) -> list:
    """PIDs of all living descendants of pid (from /proc, no psutil needed)."""
    children = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def alive(pids: list) -> list:
    """The PIDs of `pids` still running (zombies excluded)."""
    living = []
    for pid in pids:
        try:
            # the state follows the command name, which may hold spaces and parentheses
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            # gone between the listing and the read
            continue
        if state != "Z":
            living.append(pid)
    return living


def session_members(session: int) -> list:
    """The living processes (zombies excluded) of a session, from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == session and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def wait_for(predicate, timeout: float, interval: float = 0.02) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def shared_memory_left(before: set, timeout: float = 2.0) -> set:
    """The entries of /dev/shm new since `before` that stay (conventions §8 allows none). A leak stays, while what
    a test running beside this one (`pytest -n 2`) has there goes within `timeout`. Named semaphores (sem.mp-*)
    are left out: every file forks (A3C's shared counters through the default context, fork on Linux before
    Python 3.14), and CPython unlinks a fork context's semaphores as it makes them, so only the tests' own spawn
    helpers (test_ddppo's gloo workers) keep them there while they run."""

    def new() -> set:
        return {entry for entry in os.listdir("/dev/shm") if not entry.startswith("sem.mp-")} - before

    wait_for(lambda: not new(), timeout)
    return new()


def signal_once_training(runner: "Runner", proc: subprocess.Popen, send, timeout: float) -> tuple:
    """Wait until the run trains (its TensorBoard event file exists), give it a second, note its processes, call
    send() (the fault), and wait for proc to end. Returns (its output, seconds from send() to its end, the
    processes it had)."""
    assert wait_for(lambda: list(runner.cwd.glob("runs/*/events.*")), 60), "training did not start"
    time.sleep(1.0)
    processes = descendants(proc.pid)
    send()
    sent_at = time.monotonic()
    out, _ = proc.communicate(timeout=timeout)
    return out, time.monotonic() - sent_at, processes


def assert_bad_argument(proc: subprocess.CompletedProcess, name: str, cwd: Path) -> None:
    """Exit code 2, one line on stderr naming the argument, and nothing started (no runs/ folder)."""
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and name in lines[0], proc.stderr
    assert not (cwd / "runs").exists()


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds that a process (all its threads) has used; 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def kill_one_worker(
    proc: subprocess.Popen,
    script: str,
    ready,
    min_workers: int = 2,
    signal_number: int = 9,
    within: float = 10,
    pick=lambda workers: workers[-1],
    busy_s: float = 0.0,
) -> str:
    """Send signal_number (SIGKILL; SIGSTOP for a worker that hangs without dying) to one of the job's worker
    processes (those running `script`; `pick` chooses from their PIDs, the last by default) once `ready()` holds
    and every worker has used busy_s seconds of CPU (past its start-up: a worker stopped before its first sign of
    life gets the longer start-up grace); assert the job then ends non-zero within `within` seconds and no worker
    outlives it. Returns the job's output."""
    import signal

    try:

        def workers():
            return [
                p
                for p in descendants(proc.pid)
                if os.path.exists(f"/proc/{p}") and script in open(f"/proc/{p}/cmdline").read()
            ]

        def started():
            running = workers()
            return len(running) >= min_workers and ready() and all(cpu_seconds(p) >= busy_s for p in running)

        assert wait_for(started, 60), "the workers did not start"
        time.sleep(1.0)
        victims = workers()
        os.kill(pick(victims), signal_number)
        killed_at = time.time()
        out, _ = proc.communicate(timeout=within + 20)
        assert time.time() - killed_at < within, f"the job took {time.time() - killed_at:.1f} s to end"
        assert proc.returncode != 0, out
        assert wait_for(
            lambda: (
                not any(
                    os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().split()[2] != "Z" for p in victims
                )
            ),
            5,
        ), "a worker outlived the job"
        return out
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# summary.json keys that measure time or depend on the launch (worker count, padding), not the result
LAUNCH_KEYS = {
    "wall_time_s",
    "startup_s",
    "sps",
    "train_time_s",
    "time_to_threshold_s",
    "world_size",
    "bytes_per_generation",
    "episodes_per_s",
}


def run_whole_and_kill_at_first_checkpoint(runner: "Runner", name: str, args: list) -> dict:
    """Run `name` with `args` to its end (exp "whole"), then again (exp "cut") SIGKILLed as soon as its first
    periodic checkpoint exists, so that it writes none of its own. Returns that checkpoint, which a resume of "cut"
    goes on from."""
    import torch

    check_ok(runner.run(name, *args, "--exp-name", "whole"))
    proc = runner.start(name, *args, "--exp-name", "cut")
    checkpoint = runner.run_dir("CartPole-v1", "cut") / "checkpoint.pt"
    try:
        assert wait_for(checkpoint.exists, 60), "no checkpoint"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    assert not (runner.run_dir("CartPole-v1", "cut") / "summary.json").exists(), "the run ended before the kill"
    return torch.load(checkpoint, weights_only=True)


def assert_same_result(a: dict, b: dict) -> None:
    assert {k: v for k, v in a.items() if k not in LAUNCH_KEYS} == {k: v for k, v in b.items() if k not in LAUNCH_KEYS}


# the arguments of new_progress after the configuration, where it takes one (its keys do not depend on the value)
PROGRESS_ARGS = {"es": [0]}


def progress_of(name: str, **flags) -> dict:
    """A fresh progress dict of `name` with the configuration of its default flags, less any given here (as
    main() makes it before reading a checkpoint)."""
    module = load_algo(name)
    progress = module.new_progress(module.run_config(command_line_args(module)(**flags)), *PROGRESS_ARGS.get(name, []))
    return {**progress, "recent_returns": list(progress["recent_returns"])}


def updates_allowed(name: str, steps: int, starts: int = -1) -> int:
    """Learner updates the rate limit of Ape-X and R2D2 allows after `steps` environment steps of a run segment: none
    for learning_starts steps (`starts`, -1 for the default), then one per steps_per_update. The replay is not in a
    checkpoint, so a resumed run waits for learning_starts again."""
    defaults = load_algo(name).Args()
    return max(0, math.ceil((steps - (defaults.learning_starts if starts < 0 else starts)) / defaults.steps_per_update))


def decoded_frame_shapes(video: Path) -> list:
    import imageio

    with imageio.get_reader(video) as reader:
        return [frame.shape for frame in reader]


def assert_video_of_the_first_eval_episode(run_dir: Path) -> None:
    """--capture-video on CartPole: evaluation episode 0 is written as an MP4 (envpool's render, encoded by
    imageio-ffmpeg) that decodes back to one frame per step of that episode, at the size envpool renders."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir))
    events.Reload()
    first_return = events.Scalars("eval/episodic_return")[0].value
    shapes = decoded_frame_shapes(run_dir / "videos" / "eval_episode0.mp4")
    # CartPole pays 1 per step, so episode 0's return is its length: one frame per step, none after the end
    assert len(shapes) == first_return
    assert set(shapes) == {(400, 600, 3)}


# the final evaluation a short-budget learning proof asks for on CartPole (conventions §9): far above a policy that
# learned nothing (a random one averages about 22) or one without memory on masked CartPole (about 40)
LEARNED_FLOOR = 100.0


def assert_solves(
    runner: Runner,
    name: str,
    *args,
    env_id: str = "CartPole-v1",
    seeds=(1, 2, 3),
    threshold: Optional[float] = None,
):
    """The final evaluation (what a user sees) reaches `threshold` (default: the env's reward threshold) on at least
    one of `seeds`, trying them in turn until one does. Floats differ between CPUs, so no single seed's path is
    relied on: the defaults solve CartPole on at least 9 of 10 seeds in the benchmark (docs/<name>.md), so at a 0.9
    success rate per seed all 3 fail with probability 0.001, while a broken algorithm fails every seed. A passing
    suite pays for one run. Files whose full runs are long pass a short budget in `args` and a lower `threshold`
    (conventions §9)."""
    results = []
    for seed in seeds:
        check_ok(runner.run(name, "--seed", seed, *args))
        s = runner.summary(env_id, name, seed=seed)
        results.append((seed, s["eval_return_mean"], s["time_to_threshold_s"]))
        target = threshold or s["reward_threshold"] or 475.0
        if results[-1][1] >= target:
            return
    pytest.fail(f"{name}: (seed, final eval, time to threshold) = {results}, none reached {target}")


def start_actor(module, args, spec, net, num_buffers: int = 2):
    """One real actor of an Ape-X-family file (apex, r2d2) forked over `num_buffers` shared block buffers, with
    `net`'s parameters published as version 0. Returns (process, buffers, store, free_q, full_q)."""
    import torch.multiprocessing as mp

    buffers = module.block_buffers(args, spec, num_buffers)
    store = module.ParameterStore(sum(p.numel() for p in net.parameters()))
    store.publish(module.flat_params(net), 0)
    ctx = mp.get_context("fork")
    free_q, full_q = ctx.Queue(maxsize=num_buffers), ctx.Queue(maxsize=num_buffers)
    for k in range(num_buffers):
        free_q.put(k)
    link = module.LocalLink(buffers, store, free_q, full_q, module.Heartbeats(1), 0)
    actor = ctx.Process(target=module.actor_loop, args=(0, args, spec, link), daemon=True)
    actor.start()
    return actor, buffers, store, free_q, full_q

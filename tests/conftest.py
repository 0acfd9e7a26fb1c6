"""Fixtures shared by every algorithm's tests: run an algos/ file as a user would, read its outputs back."""
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ALGOS = ROOT / "algos"


def load_algo(name: str):
    """Import algos/<name>.py as a module (the files stand alone, so there is no package to import from)."""
    spec = importlib.util.spec_from_file_location(f"distrl_{name}", ALGOS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env() -> dict:
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore")
    env.pop("RANK", None), env.pop("WORLD_SIZE", None), env.pop("LOCAL_RANK", None)
    return env


def algo_command(name: str, args, nproc: int = 0) -> list:
    """`python algos/<name>.py ARGS`, or under `torchrun --standalone --nproc_per_node=nproc` when nproc > 0."""
    script = str(ALGOS / f"{name}.py")
    if nproc:
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={nproc}",
                "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", script, *map(str, args)]
    return [sys.executable, script, *map(str, args)]


class Runner:
    """Runs algorithm files in a temporary working directory (their runs/ folder lands there)."""

    def __init__(self, cwd: Path):
        self.cwd = cwd

    def run(self, name: str, *args, nproc: int = 0, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(algo_command(name, args, nproc), cwd=self.cwd, env=child_env(), capture_output=True,
                              text=True, timeout=timeout)

    def start(self, name: str, *args, nproc: int = 0) -> subprocess.Popen:
        return subprocess.Popen(algo_command(name, args, nproc), cwd=self.cwd, env=child_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def run_dir(self, env_id: str, exp_name: str, seed: int = 1) -> Path:
        return self.cwd / "runs" / f"{env_id}__{exp_name}__{seed}"

    def summary(self, env_id: str, exp_name: str, seed: int = 1) -> dict:
        return json.loads((self.run_dir(env_id, exp_name, seed) / "summary.json").read_text())


@pytest.fixture
def runner(tmp_path) -> Runner:
    return Runner(tmp_path)


def check_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"


SUMMARY_KEYS = {"algo", "env_id", "seed", "world_size", "global_step", "wall_time_s", "sps", "eval_return_mean",
                "eval_return_std", "train_return_last20", "time_to_threshold_s"}


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


def wait_for(predicate, timeout: float, interval: float = 0.02) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()

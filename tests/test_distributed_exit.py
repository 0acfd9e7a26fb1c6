"""Every file that runs under torchrun has stopped gloo's threads by the time its interpreter ends. A gloo thread
still running then can free a tensor after the interpreter is gone and abort the rank ("terminate called without an
active exception", exit -6): it did in 3 of 33 runs of DD-PPO's preemption test on one CPU, because torch.optim
imports torch._dynamo on first use and, imported once the group existed, that kept the group alive past
destroy_process_group. A hook in the ranks' interpreters checks, at their very end, that no gloo thread is left."""

import os
import subprocess

import pytest
from conftest import algo_command, check_ok, child_env

# registered first by `site`, so it runs after every exit handler of the file itself
HOOK = """
import atexit
import os
import sys


def fail_if_gloo_threads_are_left():
    names = [open(f"/proc/self/task/{task}/comm").read().strip() for task in os.listdir("/proc/self/task")]
    left = [name for name in names if "gloo" in name]
    if left:
        sys.stderr.write(f"gloo threads left at interpreter exit: {left}\\n")
        sys.stderr.flush()
        os._exit(70)


atexit.register(fail_if_gloo_threads_are_left)
"""

TINY = {
    "ddppo": ["--total-timesteps", 4096, "--local-num-envs", 8],
    "es": ["--total-timesteps", 2000],
    "ga": ["--total-timesteps", 2000, "--population-size", 8, "--truncation", 3, "--elite-candidates", 2],
    "fedpg": ["--num-clients", 2, "--total-timesteps", 3000],
    "impala": ["--total-timesteps", 12800, "--num-actors", 1],
    "seed": ["--total-timesteps", 16000, "--num-actors", 1, "--inference-timeout-ms", 10000],
    "apex": ["--total-timesteps", 6144, "--learning-starts", 1024, "--num-actors", 1],
    "r2d2": ["--total-timesteps", 6144, "--learning-starts", 1024, "--num-actors", 1],
}


@pytest.mark.parametrize("name", sorted(TINY))
def test_no_gloo_thread_is_left_when_a_rank_exits(runner, tmp_path, name):
    hook_dir = tmp_path / "hook"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(HOOK)
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hook_dir), env.get("PYTHONPATH")]))
    args = [*TINY[name], "--eval-episodes", 1]
    proc = subprocess.run(
        algo_command(name, args, nproc=2), cwd=runner.cwd, env=env, capture_output=True, text=True, timeout=300
    )
    check_ok(proc)
    assert "gloo threads left" not in proc.stderr

"""What the CartPole peers' runners (sb3_cartpole.py, rllib_cartpole.py, sf_cartpole.py) share: the process's start
time, so that `startup_s` counts imports as in the algos/ files, and the summary.json benchmark/run.py reads. Standard
library only: each peer runs in its own virtualenv."""

import json
import os
import time


def process_start_time() -> float:
    """When this process started (Linux /proc)."""
    with open("/proc/self/stat") as stat:
        start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as uptime:
        uptime_s = float(uptime.read().split()[0])
    return time.time() - uptime_s + start_ticks / os.sysconf("SC_CLK_TCK")


def cartpole_summary(algo: str, seed: int, steps: int, train_start: float, train_end: float, reached, **extra) -> dict:
    """The summary of a one-process CartPole-v1 run; reached: (seconds of training, step) at the threshold, or
    (None, None)."""
    process_start = process_start_time()
    train_time = train_end - train_start
    return {
        "algo": algo,
        "env_id": "CartPole-v1",
        "seed": seed,
        "world_size": 1,
        **extra,
        "global_step": steps,
        "sps": steps / train_time,
        "train_time_s": train_time,
        "startup_s": train_start - process_start,
        "time_to_threshold_s": reached[0],
        "threshold_step": reached[1],
        "wall_time_s": time.time() - process_start,
    }


def write_summary(out: str, summary: dict) -> None:
    with open(out, "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(summary))

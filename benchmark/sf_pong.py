"""Sample Factory 2.1.1's APPO on Pong-v5 through envpool (sf_examples/envpool/atari, its Atari defaults: 64 envs per
worker, rollout 128, batch 256) with as many rollout workers as this machine has CPUs, for a fixed time: the
throughput beside IMPALA's (benchmark/atari.py throughput). The rate is environment steps (agent steps; Sample
Factory counts frames, 4 per step) per second over the second half of the window, from an AlgoObserver's record of
the step count after every training step, so that start-up is not in it. Runs in its own virtualenv
(benchmark/peer_venvs.py).

  benchmark/sf-venv/bin/python benchmark/sf_pong.py --seconds 300 --out runs/sf_pong.json
"""

import argparse
import os
import sys
import tempfile
import time

from peer_timing import write_summary
from sample_factory.algo.runners.runner import AlgoObserver
from sample_factory.train import make_runner
from sf_examples.envpool.atari.train_envpool_atari import parse_atari_args, register_atari_components

FRAMESKIP = 4


class StepClock(AlgoObserver):
    """Records the frame count after every training step; stops the run once `seconds` have passed since the first
    (Sample Factory's own --train_for_seconds did not stop it here)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.points = []  # (wall time, frames)

    def on_training_step(self, runner, training_iteration_since_resume: int) -> None:
        self.points.append((time.time(), runner.env_steps.get(0, 0)))
        if self.points[-1][0] - self.points[0][0] > self.seconds:
            runner._stop_training()


def second_half_rate(points: list) -> float:
    start = (points[0][0] + points[-1][0]) / 2
    half = [point for point in points if point[0] >= start]
    return (half[-1][1] - half[0][1]) / FRAMESKIP / (half[-1][0] - half[0][0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", required=True)
    options = parser.parse_args()
    workers = len(os.sched_getaffinity(0))
    register_atari_components()
    with tempfile.TemporaryDirectory() as train_dir:
        argv = [
            "--algo=APPO",
            "--env=atari_pong",
            f"--experiment=pong_seed{options.seed}",
            f"--seed={options.seed}",
            f"--num_workers={workers}",
            f"--train_dir={train_dir}",
            "--device=cpu",
        ]
        cfg, runner = make_runner(parse_atari_args(argv=argv))
        clock = StepClock(options.seconds)
        runner.register_observer(clock)
        runner.init()
        runner.run()
    summary = {
        "algo": "sf_appo",
        "env_id": "Pong-v5",
        "command": " ".join(argv),
        "num_workers": workers,
        "seconds": options.seconds,
        "last_step": clock.points[-1][1] // FRAMESKIP,
        "steps_per_s": second_half_rate(clock.points),
    }
    write_summary(options.out, summary)


if __name__ == "__main__":
    sys.exit(main())

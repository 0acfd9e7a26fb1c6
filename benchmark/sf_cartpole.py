"""Sample Factory 2.1.1's APPO on CartPole-v1, a peer of algos/impala.py and algos/seed.py, with the command line of
Sample Factory's own CartPole example (sf_examples/train_gym_env.py's docstring) and as many rollout workers as ours
have actors (one per available CPU). Timed the way distrl's files time themselves: training time from the runner's
start (`runner.run()`, after the set-up of `runner.init()`; start-up, imports included, is `startup_s`) until the mean
return of the last 20 training episodes reaches 475 (`--stats_avg 20`), checked after every training step by an
AlgoObserver, which then stops the run. Runs in its own virtualenv (benchmark/run.py peer-venvs). Writes the
summary.json keys benchmark/run.py reads.

  benchmark/sf-venv/bin/python benchmark/sf_cartpole.py --seed 1 --out runs/sf_appo_1.json
"""

import argparse
import os
import sys
import tempfile
import time

from peer_timing import cartpole_summary, write_summary
from sample_factory.algo.runners.runner import AlgoObserver
from sample_factory.train import make_runner
from sf_examples.train_gym_env import parse_custom_args, register_custom_components

THRESHOLD = 475.0
TOTAL_TIMESTEPS = 2_000_000


def example_argv(seed: int, workers: int, train_dir: str) -> list:
    """sf_examples/train_gym_env.py's CartPole-v1 command, with the seed, the workers and where it writes."""
    return [
        "--algo=APPO",
        "--env=CartPole-v1",
        "--use_rnn=False",
        "--num_envs_per_worker=20",
        "--policy_workers_per_policy=2",
        "--recurrence=1",
        "--with_vtrace=False",
        "--batch_size=512",
        "--reward_scale=0.1",
        "--save_every_sec=10",
        "--experiment_summaries_interval=10",
        f"--experiment=cartpole_seed{seed}",
        f"--seed={seed}",
        f"--num_workers={workers}",
        f"--train_dir={train_dir}",
        f"--train_for_env_steps={TOTAL_TIMESTEPS}",
        "--stats_avg=20",
        "--device=cpu",
    ]


class Threshold(AlgoObserver):
    def __init__(self):
        self.train_start = None
        self.time_to_threshold = None
        self.step_at_threshold = None

    def on_training_step(self, runner, training_iteration_since_resume: int) -> None:
        returns = runner.policy_avg_stats.get("reward", [[]])[0]
        if self.time_to_threshold is None and len(returns) == 20 and sum(returns) / 20 >= THRESHOLD:
            self.time_to_threshold = time.time() - self.train_start
            self.step_at_threshold = runner.env_steps[0]
            runner._stop_training()  # the time is taken; no need to train on


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", required=True)
    options = parser.parse_args()
    workers = len(os.sched_getaffinity(0))
    register_custom_components()
    with tempfile.TemporaryDirectory() as train_dir:
        cfg = parse_custom_args(argv=example_argv(options.seed, workers, train_dir))
        cfg, runner = make_runner(cfg)
        threshold = Threshold()
        runner.register_observer(threshold)
        runner.init()
        threshold.train_start = time.time()
        runner.run()
        train_end = time.time()
        steps = runner.env_steps.get(0, 0)
    reached = (threshold.time_to_threshold, threshold.step_at_threshold)
    summary = cartpole_summary(
        "sf_appo", options.seed, steps, threshold.train_start, train_end, reached, num_workers=workers
    )
    write_summary(options.out, summary)


if __name__ == "__main__":
    sys.exit(main())

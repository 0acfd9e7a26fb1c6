"""RLlib's IMPALA and APPO on CartPole-v1, peers of algos/impala.py and algos/seed.py, with the settings of RLlib's own
tuned examples (rllib/tuned_examples/impala/cartpole_impala.py and appo/cartpole_appo.py: 2M steps for a mean of 450)
and as many env runners as ours have actors (one per available CPU). Timed the way distrl's files time themselves:
training time from the first `algo.train()` call (Ray's start and the algorithm's build are start-up, reported as
`startup_s`) until the mean return of the last 20 training episodes reaches 475. RLlib reports that mean once per
training iteration; iterations are set to at least 1 s (`min_time_s_per_iteration`, 10 s in IMPALA's defaults), so
the time is known to within about a second. Runs in its own virtualenv (benchmark/run.py peer-venvs). Writes the
summary.json keys benchmark/run.py reads.

  benchmark/rllib-venv/bin/python benchmark/rllib_cartpole.py --algo impala --seed 1 --out runs/rllib_impala_1.json
"""

import argparse
import os
import time

import ray
from peer_timing import cartpole_summary, write_summary
from ray.rllib.algorithms.appo import APPOConfig
from ray.rllib.algorithms.impala import IMPALAConfig
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, EPISODE_RETURN_MEAN, NUM_ENV_STEPS_SAMPLED_LIFETIME

THRESHOLD = 475.0
TOTAL_TIMESTEPS = 2_000_000  # the tuned examples' budget


def tuned_config(algo: str):
    """The tuned examples' values (RLlib master, 2026-11) on RLlib 2.60's defaults for everything else."""
    if algo == "impala":
        config = IMPALAConfig().training(
            train_batch_size_per_learner=500,
            grad_clip=40.0,
            grad_clip_by="global_norm",
            lr=0.0005,
            vf_loss_coeff=0.05,
            entropy_coeff=0.0,
        )
    else:
        config = APPOConfig().training(circular_buffer_iterations_per_batch=2, vf_loss_coeff=0.05, entropy_coeff=0.0)
    return config.rl_module(model_config=DefaultModelConfig(vf_share_layers=True))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--algo", choices=["impala", "appo"], default="impala")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", required=True)
    options = parser.parse_args()
    cpus = len(os.sched_getaffinity(0))
    ray.init(num_cpus=cpus + 1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    config = (
        tuned_config(options.algo)
        .environment("CartPole-v1")
        .env_runners(num_env_runners=cpus)
        .reporting(min_time_s_per_iteration=1, metrics_num_episodes_for_smoothing=20)
        .debugging(seed=options.seed)
    )
    algo = config.build_algo()
    train_start = time.time()
    steps = 0
    time_to_threshold = None
    step_at_threshold = None
    while steps < TOTAL_TIMESTEPS and time_to_threshold is None:
        result = algo.train()
        runners = result.get(ENV_RUNNER_RESULTS, {})
        steps = runners.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, steps)
        if runners.get(EPISODE_RETURN_MEAN, 0.0) >= THRESHOLD:
            time_to_threshold = time.time() - train_start
            step_at_threshold = steps
    reached = (time_to_threshold, step_at_threshold)
    summary = cartpole_summary(
        f"rllib_{options.algo}", options.seed, steps, train_start, time.time(), reached, num_env_runners=cpus
    )
    summary["ray"] = ray.__version__
    algo.stop()
    ray.shutdown()
    write_summary(options.out, summary)


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# A3C's benchmarks with their exact hyperparameters (the suites of benchmark/run.py): A3C with 1 and 2 Hogwild
# workers beside SB3's A2C on CartPole-v1 (5 seeds), the final evaluation over 10 seeds, and Hopper-v4 (3 seeds).
# Here by default, one run at a time; `--slurm` submits each suite as one array job (sbatch's SBATCH_*
# variables apply, e.g. SBATCH_PARTITION), `--dry-run` prints the commands. Arguments go to benchmark/run.py.
#   scripts/a3c.sh
#   scripts/a3c.sh --slurm
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmark/run.py a3c --seeds 1 2 3 4 5 "$@"
python benchmark/run.py final_eval --entries a3c --seeds 1 2 3 4 5 6 7 8 9 10 \
    --out benchmark/results/final_eval_a3c_cartpole.json "$@"
python benchmark/run.py a3c_mujoco --seeds 1 2 3 --out benchmark/results/a3c_mujoco.json "$@"

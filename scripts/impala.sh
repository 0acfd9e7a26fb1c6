#!/usr/bin/env bash
# IMPALA's benchmarks with their exact hyperparameters (the suites of benchmark/run.py): IMPALA and SEED beside
# SB3's A2C on CartPole-v1 (5 seeds; the same run as scripts/seed.sh's), and IMPALA's final evaluation over 10
# seeds.
# Here by default, one run at a time; `--slurm` submits each suite as one array job (sbatch's SBATCH_*
# variables apply, e.g. SBATCH_PARTITION), `--dry-run` prints the commands. Arguments go to benchmark/run.py.
#   scripts/impala.sh
#   scripts/impala.sh --slurm
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmark/run.py actor_learner --seeds 1 2 3 4 5 "$@"
python benchmark/run.py final_eval --entries impala --seeds 1 2 3 4 5 6 7 8 9 10 \
    --out benchmark/results/final_eval_impala_cartpole.json "$@"

#!/usr/bin/env bash
# SEED's benchmarks with their exact hyperparameters (the suites of benchmark/run.py): IMPALA and SEED beside SB3's
# A2C on CartPole-v1 (5 seeds; the same run as scripts/impala.sh's), and SEED's final evaluation over 10 seeds.
# Here by default, one run at a time; `--slurm` submits each suite as one array job (sbatch's SBATCH_*
# variables apply, e.g. SBATCH_PARTITION), `--dry-run` prints the commands. Arguments go to benchmark/run.py.
#   scripts/seed.sh
#   scripts/seed.sh --slurm
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmark/run.py actor_learner --seeds 1 2 3 4 5 "$@"
python benchmark/run.py final_eval --entries seed --seeds 1 2 3 4 5 6 7 8 9 10 \
    --out benchmark/results/final_eval_seed_cartpole.json "$@"

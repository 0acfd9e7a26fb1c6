#!/usr/bin/env bash
# R2D2's benchmarks with their exact hyperparameters (the suites of benchmark/run.py): R2D2 beside Ape-X on masked
# CartPole (positions only, 5 seeds), the final evaluation over 10 seeds, and the short-budget runs of its learning
# test (10 seeds).
# Here by default, one run at a time; `--slurm` submits each suite as one array job (sbatch's SBATCH_*
# variables apply, e.g. SBATCH_PARTITION), `--dry-run` prints the commands. Arguments go to benchmark/run.py.
#   scripts/r2d2.sh
#   scripts/r2d2.sh --slurm
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmark/run.py r2d2 --seeds 1 2 3 4 5 "$@"
python benchmark/run.py final_eval --entries r2d2 --seeds 1 2 3 4 5 6 7 8 9 10 \
    --out benchmark/results/final_eval_r2d2_cartpole.json "$@"
python benchmark/run.py learning_proofs --entries r2d2_masked_80k --seeds 1 2 3 4 5 6 7 8 9 10 \
    --out benchmark/results/learning_proofs_r2d2.json "$@"

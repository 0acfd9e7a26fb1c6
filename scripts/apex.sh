#!/usr/bin/env bash
# Ape-X's benchmarks with their exact hyperparameters (the suites of benchmark/run.py): Ape-X beside SB3's DQN on
# CartPole-v1 (5 seeds), the final evaluation over 10 seeds, and the short-budget runs of its learning test (10
# seeds).
# Here by default, one run at a time; `--slurm` submits each suite as one array job (sbatch's SBATCH_*
# variables apply, e.g. SBATCH_PARTITION), `--dry-run` prints the commands. Arguments go to benchmark/run.py.
#   scripts/apex.sh
#   scripts/apex.sh --slurm
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmark/run.py apex --seeds 1 2 3 4 5 "$@"
python benchmark/run.py final_eval --entries apex --seeds 1 2 3 4 5 6 7 8 9 10 \
    --out benchmark/results/final_eval_apex_cartpole.json "$@"
python benchmark/run.py learning_proofs --entries apex_60k apex_masked_120k --seeds 1 2 3 4 5 6 7 8 9 10 \
    --out benchmark/results/learning_proofs_apex.json "$@"

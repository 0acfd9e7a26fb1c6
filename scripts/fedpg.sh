#!/usr/bin/env bash
# Federated policy gradient's benchmarks with their exact hyperparameters (the suites of benchmark/run.py):
# trajectories per client to CartPole-v1's threshold with 1 and 10 clients and with 3 of 10 Byzantine clients per
# attack and aggregator (5 seeds), and the final evaluation of the defaults and of fedpg-br under sign-flip over 10
# seeds.
# Here by default, one run at a time; `--slurm` submits each suite as one array job (sbatch's SBATCH_*
# variables apply, e.g. SBATCH_PARTITION), `--dry-run` prints the commands. Arguments go to benchmark/run.py.
#   scripts/fedpg.sh
#   scripts/fedpg.sh --slurm
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmark/run.py fedpg --seeds 1 2 3 4 5 "$@"
python benchmark/run.py final_eval_fedpg --seeds 1 2 3 4 5 6 7 8 9 10 \
    --out benchmark/results/final_eval_fedpg_cartpole.json "$@"

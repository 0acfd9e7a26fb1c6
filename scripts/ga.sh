#!/usr/bin/env bash
# Deep GA's benchmarks with their exact hyperparameters (the suites of benchmark/run.py): ES and the Deep GA beside
# SB3's PPO on CartPole-v1 (5 seeds; the same run as scripts/es.sh's), the GA on Hopper-v4 (3 seeds), 1 against 2
# workers (5 seeds), and the final evaluation over 10 seeds.
# Here by default, one run at a time; `--slurm` submits each suite as one array job (sbatch's SBATCH_*
# variables apply, e.g. SBATCH_PARTITION), `--dry-run` prints the commands. Arguments go to benchmark/run.py.
#   scripts/ga.sh
#   scripts/ga.sh --slurm
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmark/run.py evolution --seeds 1 2 3 4 5 "$@"
python benchmark/run.py evolution_mujoco --entries ga_hopper --seeds 1 2 3 \
    --out benchmark/results/evolution_mujoco_ga.json "$@"
python benchmark/run.py evolution_workers --entries ga_w1 ga_w2 --seeds 1 2 3 4 5 \
    --out benchmark/results/evolution_workers_ga.json "$@"
python benchmark/run.py final_eval --entries ga --seeds 1 2 3 4 5 6 7 8 9 10 \
    --out benchmark/results/final_eval_ga_cartpole.json "$@"

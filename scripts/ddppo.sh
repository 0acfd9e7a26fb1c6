#!/usr/bin/env bash
# DD-PPO's benchmarks with their exact hyperparameters (the suites of benchmark/run.py): DD-PPO beside SB3's PPO on
# CartPole-v1 (5 seeds), the HalfCheetah-v4 and Hopper-v4 curves with CleanRL's MuJoCo settings, normalization on
# and off (3 seeds), and the final evaluation over 10 seeds.
# Here by default, one run at a time; `--slurm` submits each suite as one array job (sbatch's SBATCH_*
# variables apply, e.g. SBATCH_PARTITION), `--dry-run` prints the commands. Arguments go to benchmark/run.py.
#   scripts/ddppo.sh
#   scripts/ddppo.sh --slurm
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmark/run.py ddppo --seeds 1 2 3 4 5 "$@"
python benchmark/run.py ddppo_mujoco --seeds 1 2 3 --out benchmark/results/ddppo_mujoco.json "$@"
python benchmark/run.py final_eval --entries ddppo --seeds 1 2 3 4 5 6 7 8 9 10 \
    --out benchmark/results/final_eval_ddppo_cartpole.json "$@"

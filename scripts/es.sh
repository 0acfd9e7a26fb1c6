#!/usr/bin/env bash
# Evolution Strategies' benchmarks with their exact hyperparameters (the suites of benchmark/run.py): ES and the
# Deep GA beside SB3's PPO on CartPole-v1 (5 seeds; the same run as scripts/ga.sh's), ES on HalfCheetah-v4 (3
# seeds), 1 against 2 workers (5 seeds), and the final evaluation over 10 seeds.
# Here by default, one run at a time; `--slurm` submits each suite as one array job (sbatch's SBATCH_*
# variables apply, e.g. SBATCH_PARTITION), `--dry-run` prints the commands. Arguments go to benchmark/run.py.
#   scripts/es.sh
#   scripts/es.sh --slurm
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmark/run.py evolution --seeds 1 2 3 4 5 "$@"
python benchmark/run.py evolution_mujoco --entries es_halfcheetah --seeds 1 2 3 \
    --out benchmark/results/evolution_mujoco_es.json "$@"
python benchmark/run.py evolution_workers --entries es_w1 es_w2 --seeds 1 2 3 4 5 \
    --out benchmark/results/evolution_workers_es.json "$@"
python benchmark/run.py final_eval --entries es --seeds 1 2 3 4 5 6 7 8 9 10 \
    --out benchmark/results/final_eval_es_cartpole.json "$@"

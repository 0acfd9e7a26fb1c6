#!/usr/bin/env bash
# Run one algorithm file for several seeds on this machine, one after another (CPU-friendly), or N at a time.
#   scripts/seeds.sh ddppo "1 2 3" -- --total-timesteps 200000
#   PARALLEL=2 scripts/seeds.sh ddppo "1 2 3 4"
set -euo pipefail
algo="${1:?usage: scripts/seeds.sh ALGO \"SEEDS\" [-- ARGS...]}"; seeds="${2:?seeds, e.g. \"1 2 3\"}"; shift 2
[ "${1:-}" = "--" ] && shift
root="$(cd "$(dirname "$0")/.." && pwd)"
parallel="${PARALLEL:-1}"
for seed in $seeds; do
  python "$root/algos/$algo.py" --seed "$seed" "$@" > "seed_${algo}_${seed}.log" 2>&1 &
  while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do wait -n; done
done
wait
grep -h "time to threshold" seed_"${algo}"_*.log || true

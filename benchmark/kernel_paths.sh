#!/usr/bin/env bash
# Which settings change the float path of a deterministic run on this machine? Trains DD-PPO (world size 1) and
# IMPALA --deterministic for 30k steps under settings that cap or pin the math libraries' code paths, and prints
# a hash of each final model.pt. Equal hashes: the same kernels ran. (docs/conventions.md §10)
#   bash benchmark/kernel_paths.sh > benchmark/results/kernel_paths.txt
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"; cd "$work"
settings=("native:" "aten_avx2:ATEN_CPU_CAPABILITY=avx2" "mkl_avx2:MKL_ENABLE_INSTRUCTIONS=AVX2"
          "mkl_cbwr_compatible:MKL_CBWR=COMPATIBLE ATEN_CPU_CAPABILITY=default"
          "mkl_cbwr_compatible_with_caps:MKL_CBWR=COMPATIBLE ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=AVX2")
for entry in "${settings[@]}"; do
  name="${entry%%:*}"; vars="${entry#*:}"
  env $vars WANDB_MODE=disabled python "$root/algos/ddppo.py" --total-timesteps 30000 --save-model --exp-name "ddppo_$name" >/dev/null
  env $vars WANDB_MODE=disabled python "$root/algos/impala.py" --deterministic --num-envs 4 --total-timesteps 30000 \
      --save-model --exp-name "impala_$name" >/dev/null
done
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), commit $(git -C "$root" rev-parse --short HEAD)"
python - <<'PY'
import glob, hashlib, torch
for f in sorted(glob.glob("runs/*/model.pt")):
    sd = torch.load(f, weights_only=True)
    print(f.split("/")[1].split("__")[1], hashlib.sha256(b"".join(v.numpy().tobytes() for v in sd.values())).hexdigest()[:12])
PY
rm -rf "$work"

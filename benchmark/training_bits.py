"""Hashes of the trained weights of each file's deterministic configurations.

A refactoring that must not change training is checked by running this script on the tree before and after and
comparing the lines: the same configuration must give the same hash.

  python benchmark/training_bits.py                       # every configuration, this tree
  python benchmark/training_bits.py --tree ../base ddppo  # the configurations of ddppo.py, another checkout

Each run goes in a fresh temporary directory with --save-model; the hash is the SHA-256 of every tensor of
model.pt, in the state_dict's key order (names are not hashed, so renaming a module does not count).
"""

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile

import torch

# name -> (file, arguments): small budgets of the deterministic configurations listed in docs/conventions.md §10
CONFIGS = {
    "ddppo-cartpole": ("ddppo", ["--total-timesteps", "16384"]),
    "ddppo-hopper": ("ddppo", ["--env-id", "Hopper-v4", "--total-timesteps", "8192"]),
    "es": ("es", ["--total-timesteps", "100000", "--num-workers", "1"]),
    "ga": ("ga", ["--total-timesteps", "100000", "--num-workers", "1"]),
    "fedpg-fedavg": ("fedpg", ["--total-timesteps", "30000"]),
    "fedpg-br": ("fedpg", ["--total-timesteps", "30000", "--aggregator", "fedpg-br", "--num-byzantine", "3"]),
    "impala-deterministic": ("impala", ["--deterministic", "--num-envs", "4", "--num-actors", "2"]),
    "apex-deterministic": ("apex", ["--deterministic", "--num-actors", "2", "--total-timesteps", "12288"]),
    "r2d2-deterministic": ("r2d2", ["--deterministic", "--num-actors", "2", "--mask-velocity"]),
    # the image path (frames, the CNN, value rescaling) at tiny sequence lengths
    "r2d2-pong-deterministic": (
        "r2d2",
        ["--deterministic", "--env-id", "Pong-v5", "--num-actors", "1", "--num-envs", "2", "--burn-in", "2"]
        + ["--sequence-length", "4", "--sequence-overlap", "2", "--batch-size", "4", "--learning-starts", "256"],
    ),
    "a3c-one-worker": ("a3c", ["--num-workers", "1", "--total-timesteps", "20000"]),
}
# budgets a configuration needs beyond its own arguments (kept short: these runs only have to train a little)
SHORT = {"impala": ["--total-timesteps", "12000"], "r2d2": ["--total-timesteps", "8192"]}


def weights_sha256(path: str) -> str:
    state = torch.load(path, map_location="cpu", weights_only=True)
    digest = hashlib.sha256()
    for value in state.values():
        if torch.is_tensor(value):
            digest.update(value.contiguous().numpy().tobytes())
    return digest.hexdigest()


def run_config(tree: str, name: str) -> str:
    algo, extra = CONFIGS[name]
    script = os.path.join(os.path.abspath(tree), "algos", f"{algo}.py")
    with tempfile.TemporaryDirectory() as work_dir:
        command = [sys.executable, script, *extra, *SHORT.get(algo, []), "--eval-episodes", "2", "--save-model"]
        env = dict(os.environ, WANDB_MODE="disabled")
        done = subprocess.run(command, cwd=work_dir, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            return f"FAILED (exit {done.returncode}): {done.stderr.strip().splitlines()[-1:]}"
        (run_dir,) = os.listdir(os.path.join(work_dir, "runs"))
        return weights_sha256(os.path.join(work_dir, "runs", run_dir, "model.pt"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="configurations, or files (all their configurations)")
    parser.add_argument("--tree", default=".", help="checkout whose algos/ to run")
    options = parser.parse_args()
    names = [n for n in CONFIGS if not options.names or n in options.names or CONFIGS[n][0] in options.names]
    for name in names:
        print(f"{name}\t{run_config(options.tree, name)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

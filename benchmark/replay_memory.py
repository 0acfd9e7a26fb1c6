"""Replay memory per million environment steps of Ape-X or R2D2, from the replay the file itself allocates.

The replay's tensors are preallocated (`PrioritizedReplay`), so its size follows from the settings without a
training run: this builds the file's replay for `--capacity` items with the given flags and reports bytes per
item and per environment step it holds (a transition for Ape-X; `sequence_length - sequence_overlap` new steps per
sequence for R2D2).

  python benchmark/replay_memory.py r2d2 --env-id Pong-v5 --burn-in 40 --sequence-length 80 --sequence-overlap 40
"""

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from conftest import load_algo  # noqa: E402


def main() -> None:
    name, flags = sys.argv[1], sys.argv[2:]
    module = load_algo(name)
    args = module.tyro.cli(module.Args, args=flags)
    spec = module.envpool.make_spec(args.env_id)
    buffers = module.block_buffers(args, spec, 1, shared=False)
    keys = module.SEQUENCE_KEYS if name == "r2d2" else module.TRANSITION_KEYS
    capacity = 1000
    replay = module.PrioritizedReplay(
        capacity, {k: buffers[k][0, 0] for k in keys}, args.alpha, args.priority_eps, torch.device("cpu")
    )
    per_item = replay.nbytes() / capacity
    steps = args.sequence_length - args.sequence_overlap if name == "r2d2" else 1
    print(
        json.dumps(
            {
                "algo": name,
                "flags": flags,
                "fields": {k: [list(v.shape), str(v.dtype)] for k, v in replay.data.items()},
                "bytes_per_item": per_item,
                "bytes_per_step": per_item / steps,
                "gb_per_million_steps": per_item / steps * 1e6 / 1e9,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

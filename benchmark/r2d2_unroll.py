"""R2D2's LSTM unroll on Pong-v5 sizes, three ways, without gradient (the target network's pass over a batch).

  cell     the file's way: one `nn.LSTMCell` call per time step (each computes x_t W_ih and h W_hh)
  hoisted  x W_ih for every step in one matrix product, then per step h W_hh and the gates by hand
  lstm     `nn.LSTM` over the whole sequence (one call; it cannot carry the state over padding as the file does)

Batch 64 sequences of 121 steps, input 3,136 torso features + 6 actions + 1 reward, 512 units, one thread, the
process's allocator as the files set it (keep_freed_memory). Seconds per unroll, median of `--calls`.

  python benchmark/r2d2_unroll.py                 # -> benchmark/results/r2d2_unroll.json
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmark"))
from profile_atari import load  # noqa: E402
from run import machine  # noqa: E402

B = 64
T = 121
INPUT = 3136 + 6 + 1
H = 512


def cell(lstm_cell: nn.LSTMCell, x: torch.Tensor) -> torch.Tensor:
    h = torch.zeros(B, H)
    c = torch.zeros(B, H)
    for t in range(T):
        h, c = lstm_cell(x[:, t], (h, c))
    return h


def hoisted(lstm_cell: nn.LSTMCell, x: torch.Tensor) -> torch.Tensor:
    gates_x = nn.functional.linear(x, lstm_cell.weight_ih, lstm_cell.bias_ih + lstm_cell.bias_hh)
    h = torch.zeros(B, H)
    c = torch.zeros(B, H)
    for t in range(T):
        gates = gates_x[:, t] + nn.functional.linear(h, lstm_cell.weight_hh)
        i, f, g, o = gates.chunk(4, 1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
    return h


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "benchmark" / "results" / "r2d2_unroll.json"))
    a = p.parse_args()
    load("r2d2").keep_freed_memory()
    torch.set_num_threads(1)
    torch.manual_seed(1)
    x = torch.randn(B, T, INPUT)
    lstm_cell = nn.LSTMCell(INPUT, H)
    lstm = nn.LSTM(INPUT, H, batch_first=True)
    variants = {"cell": lambda: cell(lstm_cell, x), "hoisted": lambda: hoisted(lstm_cell, x), "lstm": lambda: lstm(x)}
    seconds = {}
    with torch.no_grad():
        # the same numbers, to rounding, by the file's way and by hand
        torch.testing.assert_close(hoisted(lstm_cell, x), cell(lstm_cell, x), rtol=1e-4, atol=1e-5)
        for name, fn in variants.items():
            fn()
            times = []
            for _ in range(a.calls):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            seconds[name] = statistics.median(times)
            print(f"{name}: {seconds[name]:.3f} s per unroll", flush=True)
    record = {"machine": machine(), "command": " ".join(sys.argv).replace(str(ROOT) + "/", ""), "seconds": seconds}
    record["shape"] = {"batch": B, "steps": T, "input": INPUT, "hidden": H, "threads": 1}
    Path(a.out).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()

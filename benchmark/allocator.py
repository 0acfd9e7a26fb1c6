"""The learner's update on Pong-v5 with and without `keep_freed_memory` (glibc's malloc keeps freed memory).

For each Atari file, a fresh process builds the learner's update at the preset's sizes (profile_atari.py's case:
the file's own learner function on a full batch or replay) and times it for a few seconds after one warm-up call,
once with the file's `keep_freed_memory()` called first and once without; the two alternate for `--rounds`
rounds, so that a slow spell of the machine falls on both. Each process reports the mean milliseconds per
environment step (a mean, not a median: the page faults come in bursts), the share of it spent in the kernel,
and the minor page faults per update.

  python benchmark/allocator.py                          # -> benchmark/results/allocator_pong.json and .md
  python benchmark/allocator.py --files impala r2d2 --rounds 1 --seconds 5
"""

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmark"))
from profile_atari import FILES, load, make_case  # noqa: E402
from run import machine  # noqa: E402


def measure(name: str, keep: bool, seconds: float) -> dict:
    """One process's figures: the update timed for `seconds` after a warm-up call."""
    module = load(name)
    if keep:
        module.keep_freed_memory()
    case = make_case(name, module)
    torch.set_num_threads(case["threads"])
    case["update"]()
    calls = 0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or calls < 2:
        case["update"]()
        calls += 1
    wall = time.perf_counter() - start
    end = resource.getrusage(resource.RUSAGE_SELF)
    steps = calls * case["steps_per_update"]
    return {
        "ms_per_step": 1e3 * wall / steps,
        "kernel_share": (end.ru_stime - usage.ru_stime) / wall,
        "faults_per_update": (end.ru_minflt - usage.ru_minflt) / calls,
        "updates": calls,
    }


def in_process(name: str, keep: bool, seconds: float) -> dict:
    command = [sys.executable, __file__, "--child", name, "--seconds", str(seconds)] + (["--keep"] if keep else [])
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=3600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(rows: dict) -> str:
    lines = ["| file | ms per step, without / with | with / without | kernel share | page faults per update |"]
    lines.append("|---|---|---|---|---|")
    for name, row in rows.items():
        off = row["without"]
        on = row["with"]
        lines.append(
            f"| {name} | {off['ms_per_step']:.3f} / {on['ms_per_step']:.3f} "
            f"| {on['ms_per_step'] / off['ms_per_step']:.2f} "
            f"| {off['kernel_share']:.0%} / {on['kernel_share']:.0%} "
            f"| {off['faults_per_update']:,.0f} / {on['faults_per_update']:,.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", nargs="+", default=FILES, choices=FILES)
    p.add_argument("--rounds", type=int, default=2, help="alternations of the two settings per file")
    p.add_argument("--seconds", type=float, default=10.0, help="timing per process, after its warm-up update")
    p.add_argument("--out", default=str(ROOT / "benchmark" / "results" / "allocator_pong.json"))
    p.add_argument("--child", choices=FILES, help=argparse.SUPPRESS)
    p.add_argument("--keep", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(measure(a.child, a.keep, a.seconds)))
        return
    rows = {}
    for name in a.files:
        runs = {"without": [], "with": []}
        for _ in range(a.rounds):
            for label, keep in (("without", False), ("with", True)):
                runs[label].append(in_process(name, keep, a.seconds))
                print(name, label, json.dumps(runs[label][-1]), flush=True)
        rows[name] = {
            label: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for label, rs in runs.items()
        }
        rows[name]["runs"] = runs
    record = {"machine": machine(), "command": " ".join(sys.argv).replace(str(ROOT) + "/", ""), "rows": rows}
    Path(a.out).write_text(json.dumps(record, indent=2) + "\n")
    Path(a.out).with_suffix(".md").write_text(table(rows))
    print(table(rows))


if __name__ == "__main__":
    main()

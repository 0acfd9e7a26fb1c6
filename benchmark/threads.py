"""Steps/s of every file with 1 and 2 threads, on an idle machine and beside a busy neighbour: the measurement
behind each file's default thread counts (a default must lose little when the machine is idle and never collapse
when another process computes beside it, as on a shared SLURM node).

  python benchmark/threads.py --seconds 40            # -> benchmark/results/threads_cartpole.json
  python benchmark/threads.py --files ddppo es --seconds 40
  python benchmark/threads.py --files ddppo --env-id Pong-v5 --seconds 90    # -> threads_pong.json
  python benchmark/threads.py --files ddppo --omp-passive    # the file's OpenMP threads sleep instead of spinning

Each (file, value of its thread option, machine state) runs the file's defaults on --env-id (CartPole-v1) with the
option set and a budget it cannot finish, alone in a scratch directory for --seconds, then gets SIGTERM; its rate is
that of the second half of the window, from the logged steps' wall clock (atari.py's throughput rule, so start-up
is not in it). The busy neighbour is a process multiplying float32 matrices on 2 torch threads (OpenMP, as a
training process does), started before the run and stopped after it. Runs go one at a time; nothing else may run.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from atari import scalar_points, second_half_rate, stop
from run import machine

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmark" / "results"
SCRATCH = ROOT / "benchmark" / "results" / "raw" / "threads"
# each file's thread option: the learner's (or rank's, worker's) torch threads, or envpool's threads where the
# torch work is a tiny forward pass fixed at 1 thread
OPTION = {
    "ddppo": "--torch-threads",
    "impala": "--torch-threads",
    "seed": "--torch-threads",
    "apex": "--torch-threads",
    "r2d2": "--torch-threads",
    "a3c": "--torch-threads",
    "es": "--env-threads",
    "ga": "--env-threads",
    "fedpg": "--env-threads",
}
NEIGHBOUR = "import torch\ntorch.set_num_threads(2)\na = torch.randn(512, 512)\nwhile True:\n    a @ a\n"


def measure(name: str, env_id: str, threads: int, busy: bool, seconds: float, omp_passive: bool) -> dict:
    state = f"{'busy' if busy else 'idle'}{'_passive' if omp_passive else ''}"
    run_dir = SCRATCH / f"{name}_{env_id}_{OPTION[name].strip('-')}{threads}_{state}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    command = [
        sys.executable,
        str(ROOT / "algos" / f"{name}.py"),
        "--env-id",
        env_id,
        "--total-timesteps",
        "1000000000",
    ]
    command += [OPTION[name], str(threads), "--exp-name", "threads"]
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONWARNINGS="ignore")
    if omp_passive:
        # read by OpenMP when torch loads it: waiting threads sleep at once instead of spinning first
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    neighbour = subprocess.Popen([sys.executable, "-c", NEIGHBOUR], start_new_session=True) if busy else None
    try:
        with open(run_dir / "stdout.log", "w") as log:
            proc = subprocess.Popen(
                command, cwd=run_dir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            time.sleep(seconds)
            stop(proc)
    finally:
        if neighbour:
            stop(neighbour)
    points = scalar_points(next(run_dir.glob("runs/*")), "charts/SPS")
    return {
        "command": " ".join(command),
        "busy": busy,
        "threads": threads,
        "omp_wait_policy": env.get("OMP_WAIT_POLICY"),
        "steps_per_s": second_half_rate(points),  # None: too slow for two points in the window's second half
        "logged_sps": points[-1].value if points else None,  # the file's own whole-run figure, start-up apart
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", nargs="+", choices=sorted(OPTION), default=sorted(OPTION))
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--omp-passive", action="store_true", help="run the files with OMP_WAIT_POLICY=PASSIVE")
    args = parser.parse_args()
    out = RESULTS / f"threads_{args.env_id.split('-')[0].lower()}.json"
    results = json.loads(out.read_text()) if out.exists() else {}
    for name in args.files:
        runs = [
            measure(name, args.env_id, threads, busy, args.seconds, args.omp_passive)
            for busy in (False, True)
            for threads in (1, 2)
        ]
        key = f"{name} omp_passive" if args.omp_passive else name
        results[key] = {"option": OPTION[name], "machine": machine(), "seconds": args.seconds, "runs": runs}
        rates = ", ".join(f"{'busy' if r['busy'] else 'idle'} {r['threads']}: {r['steps_per_s']}" for r in runs)
        print(f"{name} ({OPTION[name]}) steps/s: {rates}", flush=True)
        out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

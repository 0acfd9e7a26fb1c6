"""Resident memory of every process of a run, sampled over several minutes (issue "Reliability": bounded resources).

Each file runs as a user starts it (`python algos/<file>.py --env-id CartPole-v1` with its defaults and a budget it
will not reach) in a session of its own. Every 2 s this reads, for each process of the session, its resident set
(VmRSS) and its proportional share (Pss from smaps_rollup: a page shared by n processes counts 1/n in each, so the
shares add up to the job's memory), then it stops the run with Ctrl-C and waits for its checkpoint. The JSON holds
every sample; `--plot` draws one figure per file (the job's total PSS and each process's RSS against time).

  python benchmark/memory.py --seconds 180 --out benchmark/results/memory_cartpole.json
  python benchmark/memory.py --plot benchmark/results/memory_cartpole.json --img docs/img
"""

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import session_members  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ALGOS = ["a3c", "apex", "ddppo", "es", "fedpg", "ga", "impala", "r2d2", "seed"]
MIB = 2**20


def memory_of(pid: int) -> tuple:
    """(RSS, PSS) of a process in bytes, or None if it is gone."""
    try:
        rss = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmRSS"))
        pss = next(
            line for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines() if line.startswith("Pss:")
        )
    except (OSError, StopIteration):
        return None
    return int(rss.split()[1]) * 1024, int(pss.split()[1]) * 1024


def measure(name: str, seconds: float, interval: float, workdir: Path) -> dict:
    command = [
        sys.executable,
        str(ROOT / "algos" / f"{name}.py"),
        "--env-id",
        "CartPole-v1",
        "--total-timesteps",
        "1000000000",
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    log = open(workdir / f"{name}.log", "w")
    proc = subprocess.Popen(command, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    started = time.monotonic()
    samples = []
    while time.monotonic() - started < seconds and proc.poll() is None:
        processes = session_members(proc.pid)
        sample = {"t": round(time.monotonic() - started, 2), "rss": {}, "pss": {}}
        for pid in processes:
            memory = memory_of(pid)
            if memory is not None:
                # the launcher is "main"; every other process is named by its pid
                key = "main" if pid == proc.pid else str(pid)
                sample["rss"][key] = memory[0]
                sample["pss"][key] = memory[1]
        samples.append(sample)
        time.sleep(interval)
    exit_code = proc.poll()
    if exit_code is None:
        os.killpg(proc.pid, signal.SIGINT)
        exit_code = proc.wait(timeout=60)
    log.close()
    return {"algo": name, "command": command[1:], "exit_code": exit_code, "samples": samples}


def summarize(record: dict, warm_up: float) -> dict:
    """Peak and final total PSS, and the growth of the total after warm-up (least squares, MiB per minute)."""
    t = np.array([s["t"] for s in record["samples"]])
    total = np.array([sum(s["pss"].values()) for s in record["samples"]]) / MIB
    after = t >= warm_up
    slope = float(np.polyfit(t[after] / 60, total[after], 1)[0]) if after.sum() > 2 else None
    processes = max(len(s["pss"]) for s in record["samples"])
    return {
        "processes": processes,
        "peak_total_pss_mib": round(float(total.max()), 1),
        "final_total_pss_mib": round(float(total[-1]), 1),
        "growth_after_warm_up_mib_per_min": None if slope is None else round(slope, 2),
        "peak_process_rss_mib": round(max(max(s["rss"].values()) for s in record["samples"]) / MIB, 1),
    }


def plot(path: Path, img: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = json.loads(path.read_text())
    img.mkdir(parents=True, exist_ok=True)
    for record in results["runs"]:
        t = [s["t"] for s in record["samples"]]
        figure, axis = plt.subplots(figsize=(6, 3.2))
        axis.plot(t, [sum(s["pss"].values()) / MIB for s in record["samples"]], color="black", label="job (sum of PSS)")
        keys = sorted({k for s in record["samples"] for k in s["rss"]}, key=lambda k: (k != "main", k))
        for key in keys:
            label = "launcher/learner RSS" if key == "main" else None
            values = [s["rss"].get(key, np.nan) / MIB for s in record["samples"]]
            axis.plot(
                t,
                values,
                linewidth=0.8,
                alpha=0.7,
                label=label or ("other processes' RSS" if key == keys[-1] else None),
            )
        axis.set_xlabel("seconds since launch")
        axis.set_ylabel("MiB")
        axis.set_ylim(bottom=0)
        axis.set_title(f"{record['algo']}.py on CartPole-v1 ({record['summary']['processes']} processes)")
        axis.legend(fontsize=7, loc="lower right")
        figure.tight_layout()
        out = img / f"memory_{record['algo']}.png"
        figure.savefig(out, dpi=90)
        plt.close(figure)
        print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("algos", nargs="*", default=ALGOS)
    parser.add_argument("--seconds", type=float, default=180)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--warm-up", type=float, default=60, help="seconds left out of the growth fit")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--plot", type=Path, help="draw the figures of a results file instead of measuring")
    parser.add_argument("--img", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args()
    if args.plot:
        plot(args.plot, args.img)
        return
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    runs = []
    with tempfile.TemporaryDirectory() as workdir:
        for name in args.algos:
            record = measure(name, args.seconds, args.interval, Path(workdir))
            record["summary"] = summarize(record, args.warm_up)
            print(name, json.dumps(record["summary"]), flush=True)
            runs.append(record)
    results = {
        "machine": f"{cpu}, {len(os.sched_getaffinity(0))} CPUs",
        "commit": commit.strip(),
        "seconds": args.seconds,
        "interval_s": args.interval,
        "warm_up_s": args.warm_up,
        "runs": runs,
    }
    if args.out:
        args.out.write_text(json.dumps(results) + "\n")


if __name__ == "__main__":
    main()

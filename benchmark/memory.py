"""Resident memory of every process of a run, sampled over several minutes: bounded resources.

Each file runs as a user starts it (`python algos/<file>.py --env-id CartPole-v1` with its defaults and a budget it
will not reach) in a session of its own. Every 2 s this reads, for each process of the session, its resident set
(VmRSS) and its proportional share (Pss from smaps_rollup: a page shared by n processes counts 1/n in each, so the
shares add up to the job's memory), then it stops the run with Ctrl-C and waits for its checkpoint. The JSON holds
every sample; `--plot` draws one figure per file (the job's total PSS and each process's RSS against time).

`--follow PID` samples a run that is already going (an hours-long Pong segment of benchmark/atari.py: PID is the
file's process, which the runner starts in a session of its own) until it ends, one JSON line per sample.

  python benchmark/memory.py --seconds 180 --out benchmark/results/memory_cartpole.json
  python benchmark/memory.py --plot benchmark/results/memory_cartpole.json --img docs/img
  python benchmark/memory.py --follow "$(pgrep -f algos/seed.py | head -1)" --interval 30 --out memory_seed_pong.jsonl
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


def sample_session(leader: int, started: float) -> dict:
    """RSS and PSS of every process of the leader's session, at seconds since `started` (time.monotonic)."""
    sample = {"t": round(time.monotonic() - started, 2), "rss": {}, "pss": {}}
    for pid in session_members(leader):
        memory = memory_of(pid)
        if memory is not None:
            # the launcher is "main"; every other process is named by its pid
            key = "main" if pid == leader else str(pid)
            sample["rss"][key] = memory[0]
            sample["pss"][key] = memory[1]
    return sample


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
        samples.append(sample_session(proc.pid, started))
        time.sleep(interval)
    exit_code = proc.poll()
    if exit_code is None:
        os.killpg(proc.pid, signal.SIGINT)
        exit_code = proc.wait(timeout=60)
    log.close()
    return {"algo": name, "command": command[1:], "exit_code": exit_code, "samples": samples}


def machine_and_commit() -> dict:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    return {"machine": f"{cpu}, {len(os.sched_getaffinity(0))} CPUs", "commit": commit.strip()}


def seconds_since_start(pid: int) -> float:
    """How long ago the process started, from its start time in /proc (clock ticks since boot)."""
    start_ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def follow(pid: int, interval: float, out: Path) -> None:
    """Sample a run that is already going, until it ends: pid is its launcher, the leader of its own session (as
    benchmark/atari.py starts each segment). One JSON line per sample is appended to out as it is taken (a header
    line first), with t counted from the launcher's start, so an hours-long run loses nothing if this is stopped."""
    started = time.monotonic() - seconds_since_start(pid)
    command = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[1:-1]
    algo = Path(command[0]).stem
    header = {"algo": algo, "command": command, "pid": pid, "interval_s": interval, **machine_and_commit()}
    with open(out, "a", buffering=1) as lines:
        lines.write(json.dumps(header) + "\n")
        while pid in session_members(pid):
            lines.write(json.dumps(sample_session(pid, started)) + "\n")
            time.sleep(interval)
    print(f"{algo} (pid {pid}) ended; samples in {out}", flush=True)


def read_followed(path: Path) -> dict:
    """A file written by follow() as a results file of one run (the samples of its last header's run)."""
    record = None
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        if "t" not in entry:
            record = {**entry, "samples": []}
        else:
            record["samples"].append(entry)
    return {"runs": [record]}


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

    results = read_followed(path) if path.suffix == ".jsonl" else json.loads(path.read_text())
    img.mkdir(parents=True, exist_ok=True)
    for record in results["runs"]:
        env_id = record["command"][record["command"].index("--env-id") + 1]
        # seconds, or minutes for a run of over 10 minutes
        unit, scale = ("minutes", 60) if record["samples"][-1]["t"] > 600 else ("seconds", 1)
        t = [s["t"] / scale for s in record["samples"]]
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
        axis.set_xlabel(f"{unit} since launch")
        axis.set_ylabel("MiB")
        axis.set_ylim(bottom=0)
        processes = max(len(s["pss"]) for s in record["samples"])
        axis.set_title(f"{record['algo']}.py on {env_id} ({processes} processes)")
        axis.legend(fontsize=7, loc="lower right")
        figure.tight_layout()
        task = "" if env_id == "CartPole-v1" else "_" + env_id.split("-")[0].lower()
        out = img / f"memory_{record['algo']}{task}.png"
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
    parser.add_argument("--follow", type=int, metavar="PID", help="sample a run already going (its session leader)")
    parser.add_argument("--plot", type=Path, help="draw the figures of a results file instead of measuring")
    parser.add_argument("--img", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args()
    if args.plot:
        plot(args.plot, args.img)
        return
    if args.follow:
        follow(args.follow, args.interval, args.out)
        return
    runs = []
    with tempfile.TemporaryDirectory() as workdir:
        for name in args.algos:
            record = measure(name, args.seconds, args.interval, Path(workdir))
            record["summary"] = summarize(record, args.warm_up)
            print(name, json.dumps(record["summary"]), flush=True)
            runs.append(record)
    results = {
        **machine_and_commit(),
        "seconds": args.seconds,
        "interval_s": args.interval,
        "warm_up_s": args.warm_up,
        "runs": runs,
    }
    if args.out:
        args.out.write_text(json.dumps(results) + "\n")


if __name__ == "__main__":
    main()

"""Scaling model: what each file's worker costs per environment step in compute and on the wire, measured here, and
the projected throughput and scaling efficiency from 1 to 1,024 workers on 10 and 100 Gb/s networks (docs/scaling.md).

  python benchmark/scaling.py measure    # -> benchmark/results/scaling_cartpole.json (about 10 minutes, alone)
  python benchmark/scaling.py model      # -> docs/img/scaling.png and the table between the markers of docs/scaling.md

`measure` runs every torchrun file on CartPole-v1 with its defaults and a fixed budget, once as `python algos/x.py`
(one worker: the compute per step) and once under `torchrun --nproc_per_node=2` (the wire: a `sitecustomize` hook in
the ranks' interpreters counts the calls, payload bytes and seconds of every torch.distributed call, per process).
It also times a gloo ping-pong between two ranks on this machine (loopback latency and bandwidth). A3C has no wire
(Hogwild on one node's shared memory): its figures are the 1-16 worker runs of a3c_workers_16core.json.
"""

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from atari import scalar_points
from run import machine

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmark" / "results"
OUT = RESULTS / "scaling_cartpole.json"
SCRATCH = RESULTS / "raw" / "scaling"
DOC = ROOT / "docs" / "scaling.md"
FIGURE = ROOT / "docs" / "img" / "scaling.png"
# each file's budget on CartPole-v1 (about 20-40 s here) and how its work grows with workers:
# "weak": every rank brings its own environments (DD-PPO, IMPALA's learners); "population": a fixed population or
# set of clients is split over the ranks (ES, GA, federated PG); "central": actor ranks feed rank 0's learner
FILES = {
    "ddppo": (["--total-timesteps", "250000"], "weak"),
    "impala": (["--total-timesteps", "600000"], "weak"),
    "es": (["--total-timesteps", "1500000"], "population"),
    "ga": (["--total-timesteps", "1500000"], "population"),
    "fedpg": (["--total-timesteps", "1500000"], "population"),
    "seed": (["--total-timesteps", "300000"], "central"),
    "apex": (["--total-timesteps", "80000"], "central"),
    "r2d2": (["--total-timesteps", "40000"], "central"),
}
# the time of each file's rollout (the part split over ranks), where the file logs it
ROLLOUT_SCALAR = {"es": "stats/rollout_time_s", "ga": "stats/rollout_time_s"}
NETWORKS = {"10 Gb/s, 50 µs": (10e9 / 8, 50e-6), "100 Gb/s, 10 µs": (100e9 / 8, 10e-6)}
WORKERS = [2**k for k in range(11)]

HOOK = """
import atexit
import json
import os
import time

import torch.distributed as dist

PAYLOAD_ARG = {"all_gather": 1}  # all_gather(outputs, input): the rank's own tensor is the second argument
counts = {}


def nbytes(value):
    if isinstance(value, (list, tuple)):
        return sum(nbytes(item) for item in value)
    return value.numel() * value.element_size() if hasattr(value, "element_size") else 0


def counted(name, function):
    def call(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            entry = counts.setdefault(name, {"calls": 0, "bytes": 0, "seconds": 0.0})
            entry["calls"] += 1
            index = PAYLOAD_ARG.get(name, 0)
            entry["bytes"] += nbytes(args[index]) if len(args) > index else 0
            entry["seconds"] += time.perf_counter() - start

    return call


for name in ("send", "recv", "all_reduce", "all_gather", "gather", "broadcast", "barrier", "broadcast_object_list"):
    setattr(dist, name, counted(name, getattr(dist, name)))


def write_counts():
    if counts:
        path = os.path.join(os.environ["SCALING_COUNTS"], f"rank{os.environ.get('RANK', '0')}_{os.getpid()}.json")
        with open(path, "w") as f:
            json.dump(counts, f)


atexit.register(write_counts)
"""

CALLS = """
import json
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
seconds = {}
for op, size in json.loads(sys.argv[1]):
    tensor = torch.zeros(max(1, size // 4))
    for repeat in range(120):
        if repeat == 20:
            start = time.perf_counter()
        if op == "all_reduce":
            dist.all_reduce(tensor)
        elif op == "all_gather":
            dist.all_gather([torch.empty_like(tensor) for _ in range(2)], tensor)
        elif op == "gather":
            dist.gather(tensor, [torch.empty_like(tensor) for _ in range(2)] if rank == 0 else None, dst=0)
        elif op == "broadcast":
            dist.broadcast(tensor, 0)
        elif rank == 0:  # send and recv: one way of a ping-pong
            dist.send(tensor, 1)
            dist.recv(tensor, 1)
        else:
            dist.recv(tensor, 0)
            dist.send(tensor, 0)
    per_call = (time.perf_counter() - start) / 100
    seconds[f"{op} {size}"] = per_call / 2 if op in ("send", "recv") else per_call
if rank == 0:
    print(json.dumps(seconds))
dist.destroy_process_group()
"""


def torchrun(nproc: int) -> list:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]


def timed_run(command: list, run_dir: Path, env: dict, timeout: float) -> tuple:
    """Runs `command` in run_dir, its output to stdout.log. Returns its wall seconds and the cores it kept busy: the
    CPU seconds of every process of the run over its wall time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.time()
    with open(run_dir / "stdout.log", "w") as log:
        subprocess.run(command, cwd=run_dir, env=env, stdout=log, stderr=subprocess.STDOUT, check=True, timeout=timeout)
    wall = time.time() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / wall


def measure_run(name: str, nproc: int) -> dict:
    run_dir = SCRATCH / f"{name}_n{nproc}"
    shutil.rmtree(run_dir, ignore_errors=True)
    counts_dir = run_dir / "counts"
    counts_dir.mkdir(parents=True)
    (run_dir / "sitecustomize.py").write_text(HOOK)
    budget = FILES[name][0]
    launcher = torchrun(nproc) if nproc > 1 else [sys.executable]
    command = [*launcher, str(ROOT / "algos" / f"{name}.py"), *budget, "--exp-name", "scaling"]
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONWARNINGS="ignore", SCALING_COUNTS=str(counts_dir))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(run_dir), env.get("PYTHONPATH")]))
    _, cores_busy = timed_run(command, run_dir, env, timeout=900)
    tb_dir = next(run_dir.glob("runs/*"))
    summary = json.loads((tb_dir / "summary.json").read_text())
    wire = {}
    for path in sorted(counts_dir.glob("rank*.json")):
        rank = path.name.split("_")[0]
        for op, entry in json.loads(path.read_text()).items():
            total = wire.setdefault(rank, {}).setdefault(op, {"calls": 0, "bytes": 0, "seconds": 0.0})
            for key in total:
                total[key] += entry[key]
    record = {"command": " ".join(command[1:]), "summary": summary, "wire": wire, "cores_busy": cores_busy}
    if name in ROLLOUT_SCALAR:
        record["rollout_s_per_update"] = statistics.mean(p.value for p in scalar_points(tb_dir, ROLLOUT_SCALAR[name]))
    return record


def call_seconds(calls: list) -> dict:
    """Seconds per call of each (op, payload bytes) between two gloo ranks on this machine, nothing else running:
    the check of the model at 2 processes uses these in place of alpha and beta."""
    script = SCRATCH / "calls.py"
    script.write_text(CALLS)
    command = [*torchrun(2), str(script), json.dumps(calls)]
    proc = subprocess.run(command, capture_output=True, text=True, check=True, timeout=300)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def loopback(results: dict) -> dict:
    """One-way latency (1 byte) and bandwidth (1 MiB) of a ping-pong, and the per-call seconds of every op and
    payload the files' 2-process runs made."""
    sizes = {("send", 1), ("send", 2**20)}
    for record in results["files"].values():
        for op, entry in record["n2"]["wire"].get("rank0", {}).items():
            if op not in ("barrier", "broadcast_object_list") and entry["calls"]:
                sizes.add((op, round(entry["bytes"] / entry["calls"])))
    seconds = call_seconds(sorted(sizes))
    one_way = seconds["send 1"]
    return {"latency_s": one_way, "bytes_per_s": 2**20 / (seconds[f"send {2**20}"] - one_way), "call_s": seconds}


def measure(names: list) -> None:
    SCRATCH.mkdir(parents=True, exist_ok=True)
    results = json.loads(OUT.read_text()) if OUT.exists() else {"files": {}}
    results["machine"] = machine()
    for name in names:
        runs = {f"n{nproc}": measure_run(name, nproc) for nproc in (1, 2)}
        results["files"][name] = {"mode": FILES[name][1], **runs}
        rates = ", ".join(f"{key} {run['summary']['sps']:.0f}" for key, run in runs.items())
        print(f"{name}: steps/s {rates}", flush=True)
        OUT.write_text(json.dumps(results, indent=1))
    results["loopback"] = loopback(results)
    print("loopback:", results["loopback"], flush=True)
    OUT.write_text(json.dumps(results, indent=1))


# --------------------------------------------------------------------------------------------------------- model
def all_reduce_s(n: int, size: float, bandwidth: float, latency: float) -> float:
    """Ring (bandwidth-optimal) or binary tree (latency-optimal), whichever is faster for this size."""
    if n == 1:
        return 0.0
    ring = 2 * (n - 1) * latency + 2 * (n - 1) / n * size / bandwidth
    tree = 2 * math.ceil(math.log2(n)) * (latency + size / bandwidth)
    return min(ring, tree)


def collective_s(op: str, n: int, size: float, bandwidth: float, latency: float) -> float:
    """Seconds of one call with `size` bytes of payload per rank among n ranks (alpha-beta model)."""
    if n == 1:
        return 0.0
    if op == "all_reduce":
        return all_reduce_s(n, size, bandwidth, latency)
    if op == "all_gather":  # ring: n - 1 steps, each passing one rank's block
        return (n - 1) * (latency + size / bandwidth)
    if op == "gather":  # every block crosses the root's link
        return math.ceil(math.log2(n)) * latency + (n - 1) * size / bandwidth
    if op in ("broadcast", "barrier"):
        return math.ceil(math.log2(n)) * (latency + size / bandwidth)
    raise ValueError(op)


def per_step_costs(record: dict) -> dict:
    """What the one-process run's work costs: compute seconds per environment step, the share of it that is not
    the rollout (ES and GA log their rollout time; elsewhere 0), and per op the calls per step and the bytes per
    call of one rank at n = 2."""
    one = record["n1"]
    compute = one["summary"]["train_time_s"] / one["summary"]["global_step"]
    serial = 0.0
    if "rollout_s_per_update" in one:
        per_update = one["summary"]["train_time_s"] / one["summary"]["generations"]
        serial = max(0.0, 1 - one["rollout_s_per_update"] / per_update) * compute
    two = record["n2"]
    # a "weak" rank steps its own environments; a "population" rank's calls serve the whole population's steps
    steps = two["summary"]["global_step"] / (2 if record["mode"] == "weak" else 1)
    ops = {}
    for op, entry in two["wire"].get("rank0", {}).items():
        if op != "broadcast_object_list" and entry["calls"]:  # broadcast_object_list: start-up only
            ops[op] = {"calls_per_step": entry["calls"] / steps, "bytes_per_call": entry["bytes"] / entry["calls"]}
    return {"compute_s": compute, "serial_s": serial, "ops": ops}


def central_costs(record: dict) -> dict:
    """A remote actor rank (rank 1 at n = 2): its steps/s, and its bytes and calls per step on rank 0's link; and
    what rank 0 (learner and local actors) processed alone, the one-process run's steps/s."""
    two = record["n2"]["summary"]
    actors = two.get("total_actors", two.get("num_actors"))
    actor_steps = two["global_step"] / actors
    wire = record["n2"]["wire"]["rank1"]
    return {
        "actor_sps": two["sps"] / actors,
        "bytes_per_step": sum(e["bytes"] for op, e in wire.items() if op in ("send", "recv")) / actor_steps,
        "calls_per_step": sum(e["calls"] for op, e in wire.items() if op in ("send", "recv")) / actor_steps,
        "rank0_sps": record["n1"]["summary"]["sps"],
    }


def projected_sps(name: str, record: dict, n: int, bandwidth: float, latency: float, split: bool = False) -> float:
    """Environment steps per second of n workers. Weak scaling: each worker does the one-process run's work (for
    ES, GA and federated PG the population or the number of clients grows with n; ES's update, which sums every
    member's noise on every rank, grows with it). split: the population of the one-process run is split over the
    n ranks instead (what the files do when only the number of processes changes). Central files: n actor ranks
    feeding rank 0, bounded by rank 0's link; rank 0's own compute is not in it (see rank0_actors)."""
    if record["mode"] == "central":
        cost = central_costs(record)
        actors = n / (1 / cost["actor_sps"] + cost["calls_per_step"] * latency)
        return min(actors, bandwidth / cost["bytes_per_step"])
    cost = per_step_costs(record)
    parallel = cost["compute_s"] - cost["serial_s"]
    if split:
        seconds = parallel / n + cost["serial_s"]
    else:
        seconds = parallel + cost["serial_s"] * (n if name == "es" else 1)
    for op, entry in cost["ops"].items():
        size = entry["bytes_per_call"]
        if record["mode"] == "population" and op in ("all_gather", "gather"):
            size *= 2 / n if split else 2  # a rank's block: half the population at n = 2
        seconds += entry["calls_per_step"] * collective_s(op, n, size, bandwidth, latency)
    return (1 if split else n) / seconds


def rank0_actors(record: dict) -> float:
    """How many remote actors rank 0 keeps up with if it processes what it did alone here (learner and local actors
    on this machine): the bound the link-only projection leaves out."""
    cost = central_costs(record)
    return cost["rank0_sps"] / cost["actor_sps"]


def check_two(name: str, record: dict, loopback: dict, cores: int) -> float:
    """The model at n = 2 on this machine: each op's calls at its measured per-call seconds between two gloo ranks
    here (loopback["call_s"]) instead of alpha and beta, and the two processes sharing the machine's cores (a
    process that kept c cores busy alone gets at most cores / 2 of them)."""
    cost = per_step_costs(record)
    split = record["mode"] == "population"
    parallel = cost["compute_s"] - cost["serial_s"]
    seconds = parallel / 2 + cost["serial_s"] if split else cost["compute_s"]
    seconds *= max(1.0, 2 * record["n1"]["cores_busy"] / cores)
    for op, entry in cost["ops"].items():
        if op != "barrier":
            seconds += entry["calls_per_step"] * loopback["call_s"][f"{op} {round(entry['bytes_per_call'])}"]
    return (1 if split else 2) / seconds


def efficiency(name: str, record: dict, n: int, bandwidth: float, latency: float) -> float:
    """Throughput of n workers over n times one worker's with no network (a central file's actor beside its
    learner)."""
    if record["mode"] == "central":
        alone = central_costs(record)["actor_sps"]
    else:
        alone = projected_sps(name, record, 1, bandwidth, latency)
    return projected_sps(name, record, n, bandwidth, latency) / (n * alone)


def a3c_sps() -> dict:
    runs = json.loads((RESULTS / "a3c_workers_16core.json").read_text())["curve_defaults_200k"].values()
    workers = sorted({run["num_workers"] for run in runs})
    return {w: statistics.median(run["sps"] for run in runs if run["num_workers"] == w) for w in workers}


def table(results: dict) -> str:
    rows = [
        "| file | work per worker | steps/s, 1 process (cores busy) | 2 processes: measured / model "
        "| rank 0 on the wire per env step (bytes) | efficiency at 64 / 1,024 workers, 10 Gb/s | the same, 100 Gb/s "
        "| actors rank 0 keeps up with here |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, record in results["files"].items():
        one = record["n1"]["summary"]
        two = record["n2"]["summary"]
        central = record["mode"] == "central"
        check = "-" if central else f"{check_two(name, record, results['loopback'], results['machine']['cores']):,.0f}"
        wire = record["n2"]["wire"].get("rank0", {})
        rank0_bytes = sum(entry["bytes"] for op, entry in wire.items() if op != "broadcast_object_list")
        cells = [
            " / ".join(f"{efficiency(name, record, n, bandwidth, latency):.0%}" for n in (64, 1024))
            for bandwidth, latency in NETWORKS.values()
        ]
        serves = f"{rank0_actors(record):.1f}" if central else "-"
        rows.append(
            f"| {name} | {record['mode']} | {one['sps']:,.0f} ({record['n1']['cores_busy']:.1f}) "
            f"| {two['sps']:,.0f} / {check} | {rank0_bytes / two['global_step']:,.1f} | {cells[0]} | {cells[1]} "
            f"| {serves} |"
        )
    return "\n".join(rows)


def wire_table(results: dict) -> str:
    """Per file and op, what one rank passed to torch.distributed in the 2-process run (start-up calls left out)."""
    rows = [
        "| file | rank | op | calls per 1,000 env steps | payload per call (bytes) | seconds in it per 1,000 steps |",
        "|---|---|---|---|---|---|",
    ]
    for name, record in results["files"].items():
        steps = record["n2"]["summary"]["global_step"] / 1000
        for rank, ops in sorted(record["n2"]["wire"].items()):
            for op, entry in ops.items():
                if op == "broadcast_object_list" or entry["calls"] < 2:  # start-up and the final barrier
                    continue
                rows.append(
                    f"| {name} | {rank[4:]} | {op} | {entry['calls'] / steps:.2f} "
                    f"| {entry['bytes'] / entry['calls']:,.0f} | {entry['seconds'] / steps:.4f} |"
                )
    return "\n".join(rows)


def plot(results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    a3c = a3c_sps()
    for ax, (label, (bandwidth, latency)) in zip(axes, NETWORKS.items(), strict=True):
        for name, record in results["files"].items():
            ax.plot(WORKERS, [efficiency(name, record, n, bandwidth, latency) for n in WORKERS], marker=".", label=name)
        ax.plot(list(a3c), [sps / (w * a3c[1]) for w, sps in a3c.items()], "k^", label="a3c (measured, 16 cores)")
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.1)
        ax.set_xlabel("workers")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("scaling efficiency: steps/s ÷ (n × one worker's)")
    axes[1].legend(fontsize=8, loc="lower left")
    fig.suptitle("Projected weak scaling, CartPole-v1 costs measured on 2 vCPU AMD EPYC (benchmark/scaling.py)")
    fig.tight_layout()
    fig.savefig(FIGURE, dpi=110)


# ------------------------------------------------------------------------------------------------- workers on one node
# what a user of one many-core machine turns up: each file's own worker knob, and a budget per worker, so that a run
# lasts about as long at every worker count when scaling is perfect (Ape-X and R2D2 are left out: their learners'
# replay ratio, not their actors, sets their steps/s)
WORKER_KNOBS = {
    "ddppo": ("torchrun", 100_000),
    "impala": ("--num-actors", 150_000),
    "seed": ("--num-actors", 60_000),
    "es": ("--num-workers", 300_000),
    "ga": ("--num-workers", 300_000),
    "fedpg": ("--num-workers", 300_000),
}
FEDPG_CLIENTS = 10  # federated PG's default K: no more worker processes than clients
WORKERS_OUT = RESULTS / "scaling_workers_16core.json"  # the lent 16-core machine's runs (docs/scaling.md)
KNOB_NAMES = {
    "torchrun": "torchrun ranks",
    "--num-actors": "actors (`--num-actors`)",
    "--num-workers": "`--num-workers`",
}


def workers_run(name: str, count: int, run_dir: Path) -> dict:
    knob, per_worker = WORKER_KNOBS[name]
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    launcher = torchrun(count) if knob == "torchrun" and count > 1 else [sys.executable]
    command = [*launcher, str(ROOT / "algos" / f"{name}.py"), "--total-timesteps", str(per_worker * count)]
    command += [] if knob == "torchrun" else [knob, str(count)]
    command += ["--exp-name", "workers"] + (["--no-cuda"] if name in ("ddppo", "impala", "seed") else [])
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONWARNINGS="ignore")
    wall, cores_busy = timed_run(command, run_dir, env, timeout=300)
    summary = json.loads(next(run_dir.glob("runs/*/summary.json")).read_text())
    return {"command": " ".join(command[1:]), "summary": summary, "cores_busy": cores_busy, "wall_s": wall}


def workers(names: list, counts: list, out: Path, deadline_s: float) -> None:
    """Every file at every worker count, the smaller counts of all files first, until deadline_s has passed; the
    results file is written after each run, so a run cut short keeps what finished."""
    started = time.time()
    results = {"machine": machine(), "files": {name: {} for name in names}}
    for count in counts:
        for name in names:
            if name == "fedpg" and count > FEDPG_CLIENTS:
                continue
            if time.time() - started > deadline_s:
                print(f"deadline: {name} with {count} workers not run", flush=True)
                continue
            try:
                record = workers_run(name, count, SCRATCH / "workers" / f"{name}_w{count}")
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
                log = SCRATCH / "workers" / f"{name}_w{count}" / "stdout.log"
                record = {"failed": str(error), "log_tail": log.read_text()[-2000:]}
            results["files"][name][str(count)] = record
            sps = record.get("summary", {}).get("sps")
            print(f"{name} {count} workers: steps/s {sps}", flush=True)
            out.write_text(json.dumps(results, indent=1))


def workers_table(results: dict, measured: dict) -> str:
    """Speed-up over one worker at each count measured on one machine, beside the model's (the alpha-beta model
    with this project's loopback latency and bandwidth, each worker on a core of its own; the population files'
    population split over the workers, as --num-workers does). The model has no actor count: "-" for the central
    files' actors."""
    counts = [2, 4, 8, 16]
    latency = results["loopback"]["latency_s"]
    bandwidth = results["loopback"]["bytes_per_s"]
    rows = [
        "| file | workers | steps/s, 1 worker | speed-up at 2 / 4 / 8 / 16 workers, measured | the model's "
        "| cores busy at the most workers |",
        "|---|---|---|---|---|---|",
    ]
    for name, runs in measured["files"].items():
        base = runs["1"]["summary"]["sps"]
        got = " / ".join(f"{runs[str(n)]['summary']['sps'] / base:.2f}" if str(n) in runs else "-" for n in counts)
        record = results["files"][name]
        model_cell = "-"
        if record["mode"] != "central" and WORKER_KNOBS[name][0] != "--num-actors":
            split = record["mode"] == "population"
            one = projected_sps(name, record, 1, bandwidth, latency, split)
            model_cell = " / ".join(
                f"{projected_sps(name, record, n, bandwidth, latency, split) / one:.2f}" for n in counts
            )
        most = max(runs, key=int)
        rows.append(
            f"| {name} | {KNOB_NAMES[WORKER_KNOBS[name][0]]} | {base:,.0f} | {got} | {model_cell} "
            f"| {runs[most]['cores_busy']:.1f} of {measured['machine']['cores']} ({most} workers) |"
        )
    return "\n".join(rows)


def model() -> None:
    results = json.loads(OUT.read_text())
    plot(results)
    text = DOC.read_text()
    tables = [("scaling table", table(results)), ("wire table", wire_table(results))]
    tables.append(("workers table", workers_table(results, json.loads(WORKERS_OUT.read_text()))))
    for marker, generated in tables:
        start = f"<!-- {marker}: generated by benchmark/scaling.py model; do not edit -->"
        end = f"<!-- end of {marker} -->"
        head, rest = text.split(start)
        text = f"{head}{start}\n{generated}\n{end}{rest.split(end)[1]}"
        print(generated)
    DOC.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    go = sub.add_parser("measure", help="run every file with 1 and 2 processes, counting what crosses the wire")
    go.add_argument("--files", nargs="+", choices=sorted(FILES), default=list(FILES))
    sub.add_parser("model", help="the projection: docs/img/scaling.png and the table in docs/scaling.md")
    node = sub.add_parser("workers", help="steps/s of each file at several worker counts on this one machine")
    node.add_argument("--files", nargs="+", choices=sorted(WORKER_KNOBS), default=list(WORKER_KNOBS))
    node.add_argument("--counts", nargs="+", type=int, default=[1, 4, 16, 2, 8])
    node.add_argument("--out", type=Path, default=RESULTS / "scaling_workers.json")
    node.add_argument("--deadline-s", type=float, default=3600.0, help="start no run after this many seconds")
    args = parser.parse_args()
    if args.what == "measure":
        started = time.time()
        measure(args.files)
        print(f"measured in {time.time() - started:.0f} s")
    elif args.what == "workers":
        workers(args.files, args.counts, args.out, args.deadline_s)
    else:
        model()


if __name__ == "__main__":
    main()

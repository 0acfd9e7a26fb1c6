"""Benchmark runner: a suite's entries (our files and the peers) over seeds, here or on SLURM, with its tables.

Each entry runs as its own process in a scratch directory, benchmark/results/raw/<suite>/<entry>_<seed>/ (kept:
benchmark/plot.py reads its TensorBoard events), and writes a summary.json whose `time_to_threshold_s` counts
training time, from its own training start (the first environment step after set-up; SB3: its first callback),
and whose `startup_s` is the time from process start to training start. Entries alternate seed by seed (ours,
peer, ours, peer, ...) so that drift of a shared machine hits both alike. Here the runs go one at a time (or
--parallel N, with a progress bar where tqdm is installed); with --slurm they go as one array job (the template
scripts/slurm_benchmark.sbatch, filled in and submitted with `sbatch --wait`). The results file records machine,
commit, commands and every run's summary; <out>.md and <out>.csv beside it hold the table (mean ± std over seeds).

  python benchmark/run.py ddppo --seeds 1 2 3 4 5        # -> benchmark/results/ddppo_cartpole.json, .md, .csv
  python benchmark/run.py ddppo --seeds 1 --entries ddppo # ours only
  python benchmark/run.py final_eval --seeds 1 2 --dry-run  # the commands, nothing run
  SBATCH_PARTITION=cpu python benchmark/run.py final_eval --seeds 1 2 3 --slurm   # sbatch's variables apply
"""

import csv
import datetime
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Literal, Optional

import tyro

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
APEX = [PY, str(ROOT / "algos/apex.py"), "--seed", "{seed}", "--exp-name", "bench"]
R2D2_MASKED = [PY, str(ROOT / "algos/r2d2.py"), "--seed", "{seed}", "--exp-name", "bench", "--mask-velocity"]
# the CartPole peers that pin packages of their own run in their own virtualenvs (python benchmark/peer_venvs.py)
RLLIB = [str(ROOT / "benchmark/rllib-venv/bin/python"), str(ROOT / "benchmark/rllib_cartpole.py")]
SAMPLE_FACTORY = [str(ROOT / "benchmark/sf-venv/bin/python"), str(ROOT / "benchmark/sf_cartpole.py")]

# suite -> entry -> command (list) for one seed; "{seed}" and "{out}" are filled in.
SUITES = {
    "ddppo": {
        "ddppo": [PY, str(ROOT / "algos/ddppo.py"), "--seed", "{seed}", "--exp-name", "bench"],
        "sb3_ppo": [PY, str(ROOT / "benchmark/sb3_cartpole.py"), "--algo", "ppo", "--seed", "{seed}", "--out", "{out}"],
    },
    "evolution": {  # ES and Deep GA with their defaults (one worker) beside SB3 PPO
        "es": [PY, str(ROOT / "algos/es.py"), "--seed", "{seed}", "--exp-name", "bench"],
        "ga": [PY, str(ROOT / "algos/ga.py"), "--seed", "{seed}", "--exp-name", "bench"],
        "sb3_ppo": [PY, str(ROOT / "benchmark/sb3_cartpole.py"), "--algo", "ppo", "--seed", "{seed}", "--out", "{out}"],
    },
    "evolution_mujoco": {  # learning curves within a stated budget (3M steps), 2 workers
        "es_halfcheetah": [
            PY,
            str(ROOT / "algos/es.py"),
            "--seed",
            "{seed}",
            "--exp-name",
            "bench",
            "--env-id",
            "HalfCheetah-v4",
            "--population-size",
            "64",
            "--sigma",
            "0.02",
            "--learning-rate",
            "0.01",
            "--total-timesteps",
            "3000000",
            "--num-workers",
            "2",
        ],
        "ga_hopper": [
            PY,
            str(ROOT / "algos/ga.py"),
            "--seed",
            "{seed}",
            "--exp-name",
            "bench",
            "--env-id",
            "Hopper-v4",
            "--population-size",
            "128",
            "--truncation",
            "16",
            "--sigma",
            "0.02",
            "--elite-episodes",
            "5",
            "--total-timesteps",
            "3000000",
            "--num-workers",
            "2",
        ],
    },
    # A3C on a MuJoCo task: Hopper-v4 for 1M steps (DD-PPO's budget there), Hogwild workers as the machine allows;
    # discount 0.99 and a learning rate and entropy cost for a Gaussian policy (chosen, not tuned)
    "a3c_mujoco": {
        "a3c_hopper": [PY, str(ROOT / "algos/a3c.py"), "--seed", "{seed}", "--exp-name", "bench"]
        + ["--env-id", "Hopper-v4", "--total-timesteps", "1000000", "--gamma", "0.99"]
        + ["--learning-rate", "3e-4", "--ent-coef", "1e-4"],
    },
    "actor_learner": {  # IMPALA and SEED with their defaults beside SB3 A2C (rl-zoo)
        "impala": [PY, str(ROOT / "algos/impala.py"), "--seed", "{seed}", "--exp-name", "bench"],
        "seed": [PY, str(ROOT / "algos/seed.py"), "--seed", "{seed}", "--exp-name", "bench"],
        "sb3_a2c": [PY, str(ROOT / "benchmark/sb3_cartpole.py"), "--algo", "a2c", "--seed", "{seed}", "--out", "{out}"],
    },
    "actor_learner_peers": {  # IMPALA and SEED beside RLlib's IMPALA and APPO and Sample Factory's APPO, same CPUs
        "impala": [PY, str(ROOT / "algos/impala.py"), "--seed", "{seed}", "--exp-name", "bench"],
        "seed": [PY, str(ROOT / "algos/seed.py"), "--seed", "{seed}", "--exp-name", "bench"],
        "rllib_impala": [*RLLIB, "--algo", "impala", "--seed", "{seed}", "--out", "{out}"],
        "rllib_appo": [*RLLIB, "--algo", "appo", "--seed", "{seed}", "--out", "{out}"],
        "sf_appo": [*SAMPLE_FACTORY, "--seed", "{seed}", "--out", "{out}"],
    },
    # 1M-step curves, CleanRL's MuJoCo PPO settings; observation/reward normalization on (default) and off
    "ddppo_mujoco": {
        f"{task.split('-')[0].lower()}{suffix}": [
            PY,
            str(ROOT / "algos/ddppo.py"),
            "--seed",
            "{seed}",
            "--exp-name",
            "bench",
            "--env-id",
            task,
            "--local-num-envs",
            "8",
            "--num-steps",
            "256",
            "--num-minibatches",
            "32",
            "--gamma",
            "0.99",
            "--gae-lambda",
            "0.95",
            "--learning-rate",
            "3e-4",
            "--clip-vloss",
            "--total-timesteps",
            "1000000",
            "--torch-threads",
            "1",
            *flags,
        ]
        for task in ["HalfCheetah-v4", "Hopper-v4"]
        for suffix, flags in [("", []), ("_nonorm", ["--no-norm-obs", "--no-norm-reward"])]
    },
    "final_eval": {  # every file with its defaults: the final evaluation (what a user sees), 10 seeds
        algo: [PY, str(ROOT / f"algos/{algo}.py"), "--seed", "{seed}", "--exp-name", "bench"]
        for algo in ["ddppo", "impala", "seed", "es", "ga", "a3c", "fedpg", "apex"]
    }
    | {"r2d2": R2D2_MASKED},
    # a harder task for every file: Acrobot-v1 (threshold -100) with each file's CartPole defaults, budget included
    "acrobot": {
        algo: [PY, str(ROOT / f"algos/{algo}.py"), "--seed", "{seed}", "--exp-name", "bench", "--env-id", "Acrobot-v1"]
        for algo in ["ddppo", "impala", "seed", "es", "ga", "a3c", "fedpg", "apex", "r2d2"]
    },
    # the learning tests' short runs (tests/test_r2d2.py, tests/test_apex.py): the defaults with a small budget, and
    # Ape-X on masked CartPole as the control that has no memory
    "learning_proofs": {
        "r2d2_masked_120k": [*R2D2_MASKED, "--total-timesteps", "120000"],
        "apex_masked_120k": [*APEX, "--mask-velocity", "--total-timesteps", "120000"],
        "apex_100k": [*APEX, "--total-timesteps", "100000"],
        # shorter budgets for the suite's time: the floor, not the threshold
        "r2d2_masked_80k": [*R2D2_MASKED, "--total-timesteps", "80000"],
        "apex_60k": [*APEX, "--total-timesteps", "60000"],
        "impala_150k": [PY, str(ROOT / "algos/impala.py"), "--seed", "{seed}", "--exp-name", "bench"]
        + ["--total-timesteps", "150000"],
        "impala_250k": [PY, str(ROOT / "algos/impala.py"), "--seed", "{seed}", "--exp-name", "bench"]
        + ["--total-timesteps", "250000"],
        "seed_100k": [PY, str(ROOT / "algos/seed.py"), "--seed", "{seed}", "--exp-name", "bench"]
        + ["--total-timesteps", "100000"],
        "fedpg_500k": [PY, str(ROOT / "algos/fedpg.py"), "--seed", "{seed}", "--exp-name", "bench"]
        + ["--total-timesteps", "500000"],
        "fedpg_br_signflip_500k": [PY, str(ROOT / "algos/fedpg.py"), "--seed", "{seed}", "--exp-name", "bench"]
        + ["--aggregator", "fedpg-br", "--num-byzantine", "3", "--attack", "sign-flip", "--total-timesteps", "500000"],
    },
    "smoke": {  # tiny runs of two files: the runner's own tests (tests/test_benchmark.py, tests/test_slurm.py)
        "ddppo": [
            *[PY, str(ROOT / "algos/ddppo.py"), "--seed", "{seed}", "--exp-name", "bench"],
            *["--total-timesteps", "2048", "--local-num-envs", "4", "--eval-episodes", "2"],
        ],
        "es": [
            *[PY, str(ROOT / "algos/es.py"), "--seed", "{seed}", "--exp-name", "bench"],
            *["--total-timesteps", "2000", "--eval-episodes", "2"],
        ],
    },
    "apex": {  # Ape-X with its defaults beside SB3's DQN (rl-zoo hyperparameters, given 200k steps)
        "apex": APEX,
        "sb3_dqn": [PY, str(ROOT / "benchmark/sb3_cartpole.py"), "--algo", "dqn", "--seed", "{seed}", "--out", "{out}"],
    },
    "r2d2": {  # masked CartPole (positions only): R2D2 and Ape-X, each with its defaults (both 400k environment steps)
        # plus --mask-velocity
        "r2d2": R2D2_MASKED,
        "apex": [*APEX, "--mask-velocity"],
    },
    # the two federated runs the learning tests assert: defaults (fedavg), and fedpg-br with 3 of 10 sign-flip
    "final_eval_fedpg": {
        "fedpg": [PY, str(ROOT / "algos/fedpg.py"), "--seed", "{seed}", "--exp-name", "bench"],
        "fedpg_br_signflip": [
            PY,
            str(ROOT / "algos/fedpg.py"),
            "--seed",
            "{seed}",
            "--exp-name",
            "bench",
            "--aggregator",
            "fedpg-br",
            "--num-byzantine",
            "3",
            "--attack",
            "sign-flip",
        ],
    },
    "a3c": {  # A3C with 1 and 2 Hogwild workers (defaults otherwise) beside SB3 A2C (rl-zoo)
        **{
            f"a3c_w{w}": [
                PY,
                str(ROOT / "algos/a3c.py"),
                "--seed",
                "{seed}",
                "--exp-name",
                "bench",
                "--num-workers",
                str(w),
            ]
            for w in [1, 2]
        },
        "sb3_a2c": [PY, str(ROOT / "benchmark/sb3_cartpole.py"), "--algo", "a2c", "--seed", "{seed}", "--out", "{out}"],
    },
    "fedpg": {  # trajectories per client to threshold (a greedy evaluation every round, as the papers' curves): K = 1
        # and 10 clients (fedavg), then 3 of 10 Byzantine clients per attack and aggregator
        **{
            f"fedavg_k{k}": [
                PY,
                str(ROOT / "algos/fedpg.py"),
                "--seed",
                "{seed}",
                "--exp-name",
                "bench",
                "--eval-every",
                "1",
                "--num-clients",
                str(k),
            ]
            for k in [1, 10]
        },
        **{
            f"{agg}_{attack}": [
                PY,
                str(ROOT / "algos/fedpg.py"),
                "--seed",
                "{seed}",
                "--exp-name",
                "bench",
                "--eval-every",
                "1",
                "--aggregator",
                agg,
                "--num-byzantine",
                "3",
                "--attack",
                attack,
            ]
            for attack in ["sign-flip", "random-noise", "random-action"]
            for agg in ["fedavg", "median", "trimmed-mean", "fedpg-br"]
        },
    },
    "evolution_workers": {  # episodes per second with 1 and 2 workers, same budget (the results are identical)
        f"{algo}_w{w}": [
            PY,
            str(ROOT / f"algos/{algo}.py"),
            "--seed",
            "{seed}",
            "--exp-name",
            "bench",
            "--total-timesteps",
            "1000000",
            "--num-workers",
            str(w),
        ]
        for algo in ["es", "ga"]
        for w in [1, 2]
    },
}


def machine() -> dict:
    cpu = "unknown"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = bool(
        subprocess.run(
            ["git", "status", "--porcelain", "--", "algos", "benchmark", ":!benchmark/results"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    gpu = (
        subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
        if shutil.which("nvidia-smi")
        else None
    )
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "gpu": gpu.stdout.strip() if gpu and gpu.returncode == 0 else None,
        "python": platform.python_version(),
        "commit": commit + ("+dirty" if dirty else ""),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }


@dataclass
class Config:
    """Run a suite's entries over seeds, here or as a SLURM array job, and write its tables."""

    suite: tyro.conf.Positional[Literal[tuple(SUITES)]]
    seeds: List[int] = field(default_factory=lambda: [1, 2, 3, 4, 5])
    entries: List[str] = field(default_factory=list)  # a subset of the suite's entries (default: all)
    runs_dir: Optional[str] = None  # where the runs go (default: benchmark/results/raw/<suite>; SLURM: shared disk)
    out: Optional[str] = None  # results file (default: benchmark/results/<suite>_cartpole.json; .md and .csv beside)
    parallel: int = 1  # runs at a time here (long budgets: they share the CPUs); SLURM: N > 1 caps the running tasks
    dry_run: bool = False  # print the commands (with their directories) and run nothing
    slurm: bool = False  # submit the runs as one SLURM array job (scripts/slurm_benchmark.sbatch), wait, collect
    cpus_per_task: int = 2  # SLURM: CPUs of each array task
    time_limit: str = "01:00:00"  # SLURM: time limit of each array task


@dataclass
class Job:
    entry: str
    seed: int
    command: List[str]
    cwd: Path  # the run's scratch directory, kept so that benchmark/plot.py can read its TensorBoard events


def runs_dir(config: Config) -> Path:
    return Path(config.runs_dir or ROOT / "benchmark" / "results" / "raw" / config.suite).resolve()


def expand(config: Config) -> List[Job]:
    """The suite's commands over entries and seeds, seed by seed (ours, peer, ours, peer, ...)."""
    suite = SUITES[config.suite]
    unknown = sorted(set(config.entries) - set(suite))
    if unknown:
        raise SystemExit(f"run.py: error: --entries: {unknown} not in suite {config.suite}: {sorted(suite)}")
    names = [name for name in suite if not config.entries or name in config.entries]
    jobs = []
    for seed in config.seeds:
        for name in names:
            cwd = runs_dir(config) / f"{name}_{seed}"
            command = [part.format(seed=seed, out=cwd / "summary.json") for part in suite[name]]
            jobs.append(Job(name, seed, command, cwd))
    return jobs


def prepare(job: Job) -> None:
    shutil.rmtree(job.cwd, ignore_errors=True)
    job.cwd.mkdir(parents=True)


def read_summary(job: Job) -> dict:
    """The run's summary.json (SB3's at --out, algos/ files' at runs/<run_name>/summary.json)."""
    out = job.cwd / "summary.json"
    if not out.exists():
        found = list(job.cwd.glob("runs/*/summary.json"))
        if not found:
            log = job.cwd / "stdout.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise SystemExit(f"{shlex.join(job.command)} wrote no summary.json (in {job.cwd}):\n{tail}")
        out = found[0]
    return json.loads(out.read_text())


def run_one(job: Job) -> dict:
    """Run one entry for one seed in its directory; its output goes to stdout.log there."""
    prepare(job)
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONWARNINGS="ignore")
    start = time.time()
    proc = subprocess.run(job.command, cwd=job.cwd, env=env, capture_output=True, text=True)
    external = time.time() - start
    (job.cwd / "stdout.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"{shlex.join(job.command)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    summary = read_summary(job)
    summary["external_wall_s"] = external
    return summary


def progress_bar(total: int):
    """tqdm (benchmark/requirements.txt) where it is installed, else a line per finished run is all."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="run", dynamic_ncols=True)


def run_here(jobs: List[Job], parallel: int) -> List[dict]:
    bar = progress_bar(len(jobs))
    write = bar.write if bar else print

    def one(job: Job) -> dict:
        r = run_one(job)
        write(
            f"seed {job.seed} {job.entry:10s} time_to_threshold={r['time_to_threshold_s']} s "
            f"steps={r.get('threshold_step')} sps={r['sps']:.0f} eval={r.get('eval_return_mean')} "
            f"wall={r['external_wall_s']:.1f} s"
        )
        if bar:
            bar.update(1)
        return r

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        summaries = list(pool.map(one, jobs))
    if bar:
        bar.close()
    return summaries


def run_slurm(jobs: List[Job], config: Config) -> List[dict]:
    """One array job, a task per run: renders scripts/slurm_benchmark.sbatch with the jobs file, submits it with
    `sbatch --wait` (which returns when every task has ended) and reads each run's summary.json."""
    raw = runs_dir(config)
    raw.mkdir(parents=True, exist_ok=True)
    for job in jobs:
        prepare(job)
    lines = [f"cd {shlex.quote(str(job.cwd))} && exec {shlex.join(job.command)} > stdout.log 2>&1" for job in jobs]
    jobs_file = raw / "slurm_jobs.txt"
    jobs_file.write_text("\n".join(lines) + "\n")
    template = (ROOT / "scripts" / "slurm_benchmark.sbatch").read_text()
    script = raw / "slurm_benchmark.sbatch"
    script.write_text(
        template.format(
            job_name=f"distrl-{config.suite}",
            cpus_per_task=config.cpus_per_task,
            time_limit=config.time_limit,
            array=f"0-{len(jobs) - 1}" + (f"%{config.parallel}" if config.parallel > 1 else ""),
            jobs_file=shlex.quote(str(jobs_file)),
        )
    )
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONWARNINGS="ignore")
    command = ["sbatch", "--parsable", "--wait", str(script)]  # SBATCH_PARTITION, SBATCH_ACCOUNT, ... apply
    print("submitting:", shlex.join(command), flush=True)
    proc = subprocess.run(command, cwd=raw, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        failed = [job for job in jobs if not [*job.cwd.glob("runs/*/summary.json"), *job.cwd.glob("summary.json")]]
        raise SystemExit(
            f"sbatch exited {proc.returncode} ({proc.stderr.strip()[-500:]}); runs without summary.json: "
            + ", ".join(f"{job.entry} seed {job.seed} ({job.cwd}/stdout.log)" for job in failed)
        )
    return [read_summary(job) for job in jobs]


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def mean_std(values):
    """(mean, population std) of the values that exist, or (None, None)."""
    values = [v for v in values if v is not None]
    return (statistics.fmean(values), statistics.pstdev(values)) if values else (None, None)


def aggregate(results: dict) -> dict:
    """Per entry: medians and ranges (as the pages quote them) and mean ± std over seeds."""
    table = {}
    for name, rs in results.items():
        reached = [r["time_to_threshold_s"] for r in rs if r["time_to_threshold_s"] is not None]
        evals = [r["eval_return_mean"] for r in rs if "eval_return_mean" in r]
        table[name] = {
            "time_to_threshold_median_s": median(reached),
            "time_to_threshold_range_s": [min(reached, default=None), max(reached, default=None)],
            "reached": len(reached),
            "runs": len(rs),
            "threshold_step_median": median([r.get("threshold_step") for r in rs]),
            "startup_median_s": median([r.get("startup_s") for r in rs]),
            "sps_median": median([r["sps"] for r in rs]),
            **{
                f"{key}_to_{what}": [r.get(f"trajectories_per_client_to_{what}") for r in rs]  # fedpg
                for key, what in [("trajectories", "threshold"), ("trajectories", "eval_threshold")]
                if any(f"trajectories_per_client_to_{what}" in r for r in rs)
            },
            "episodes_per_s_median": median([r.get("episodes_per_s") for r in rs]),
            "eval_return_median": median(evals),
            "eval_return_min": min(evals, default=None),
            "eval_solved": sum(
                r.get("eval_return_mean", -math.inf) >= (r.get("reward_threshold") or 475.0) for r in rs
            ),
            "eval_return_mean_std": mean_std(evals),
            "time_to_threshold_mean_std_s": mean_std(reached),
            "threshold_step_mean_std": mean_std([r.get("threshold_step") for r in rs]),
            "sps_mean_std": mean_std([r["sps"] for r in rs]),
            "startup_mean_std_s": mean_std([r.get("startup_s") for r in rs]),
        }
    return table


def show(pair, fmt: str = "{:.1f}") -> str:
    mean, std = pair
    return "-" if mean is None else f"{fmt.format(mean)} ± {fmt.format(std)}"


COLUMNS = [
    "entry",
    "runs",
    "final eval",
    "solved",
    "time to threshold (s)",
    "reached",
    "steps to threshold",
    "SPS",
    "start-up (s)",
]


def table_rows(table: dict) -> List[List[str]]:
    """One row per entry: mean ± std over seeds (time and steps over the runs that reached the threshold)."""
    return [
        [
            name,
            str(t["runs"]),
            show(t["eval_return_mean_std"]),
            f"{t['eval_solved']}/{t['runs']}" if t["eval_return_min"] is not None else "-",
            show(t["time_to_threshold_mean_std_s"], "{:.2f}"),
            f"{t['reached']}/{t['runs']}",
            show(t["threshold_step_mean_std"], "{:.0f}"),
            show(t["sps_mean_std"], "{:.0f}"),
            show(t["startup_mean_std_s"], "{:.2f}"),
        ]
        for name, t in table.items()
    ]


def write_tables(record: dict, out: Path) -> None:
    """<out>.md (the table with machine, commit and commands) and <out>.csv (the same rows)."""
    rows = table_rows(record["table"])
    m = record["machine"]
    how = "one SLURM array job" if record["slurm"] else f"{record['parallel']} run(s) at a time"
    md = [
        f"# {record['suite']}: mean ± std over seeds {record['seeds']}",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, GPU: {m.get('gpu') or 'none'}; commit `{m['commit']}`, {m['date']}.",
        f"Runner: `{record['command']}` ({how}).",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
        *["| " + " | ".join(row) + " |" for row in rows],
        "",
        f"Commands (seed {record['seeds'][0]}'s; the others differ only in --seed):",
        "",
        *[f"- {name}: `{command}`" for name, command in record["commands"].items()],
        "",
    ]
    out.with_suffix(".md").write_text("\n".join(md))
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(rows)


def main(config: Config) -> int:
    jobs = expand(config)
    if config.dry_run:
        for job in jobs:
            print(f"(cd {shlex.quote(str(job.cwd))} && {shlex.join(job.command)})")
        return 0
    missing = sorted({job.command[0] for job in jobs if not Path(job.command[0]).exists()})
    if missing:
        raise SystemExit(
            f"run.py: error: {missing[0]} does not exist: build the peers' virtualenvs with "
            "`python benchmark/peer_venvs.py`"
        )
    summaries = run_slurm(jobs, config) if config.slurm else run_here(jobs, config.parallel)
    results = {}
    for job, summary in zip(jobs, summaries, strict=True):
        results.setdefault(job.entry, []).append(summary)
    table = aggregate(results)
    record = {
        "suite": config.suite,
        "machine": machine(),
        "seeds": config.seeds,
        "command": shlex.join(["python", "benchmark/run.py", *sys.argv[1:]]),
        "commands": {job.entry: shlex.join(job.command) for job in jobs if job.seed == config.seeds[0]},
        "parallel": config.parallel,
        "slurm": config.slurm,
        **(
            {"nodes": "the runs ran on the array's nodes: each slurm-*.out in --runs-dir starts with its host"}
            if config.slurm
            else {}
        ),
        "table": table,
        "runs": results,
    }
    out = Path(config.out or ROOT / "benchmark" / "results" / f"{config.suite}_cartpole.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2))
    write_tables(record, out)
    print(out.with_suffix(".md").read_text())
    print(f"written to {out} (and .md, .csv beside it)")
    return 0


if __name__ == "__main__":
    sys.exit(main(tyro.cli(Config, description=__doc__)))

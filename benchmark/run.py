"""Benchmark runner: time to CartPole-v1's threshold, side by side with peers, seeds interleaved.

Each entry runs as its own process, one at a time, in a scratch directory; every entry writes a summary.json
whose `time_to_threshold_s` counts training time, from its own training start (the first environment step after
set-up; SB3: its first callback), and whose `startup_s` is the time from process start to training start. Entries
alternate seed by seed (ours, peer, ours, peer, ...) so that drift of a shared machine hits both alike.

  python benchmark/run.py ddppo --seeds 1 2 3 4 5        # -> benchmark/results/ddppo_cartpole.json
  python benchmark/run.py ddppo --seeds 1 --entries ddppo # ours only
"""

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
APEX = [PY, str(ROOT / "algos/apex.py"), "--seed", "{seed}", "--exp-name", "bench"]
R2D2_MASKED = [PY, str(ROOT / "algos/r2d2.py"), "--seed", "{seed}", "--exp-name", "bench", "--mask-velocity"]

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
    "actor_learner": {  # IMPALA and SEED with their defaults beside SB3 A2C (rl-zoo)
        "impala": [PY, str(ROOT / "algos/impala.py"), "--seed", "{seed}", "--exp-name", "bench"],
        "seed": [PY, str(ROOT / "algos/seed.py"), "--seed", "{seed}", "--exp-name", "bench"],
        "sb3_a2c": [PY, str(ROOT / "benchmark/sb3_cartpole.py"), "--algo", "a2c", "--seed", "{seed}", "--out", "{out}"],
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
    # the learning tests' short runs (tests/test_r2d2.py, tests/test_apex.py): the defaults with a small budget, and
    # Ape-X on masked CartPole as the control that has no memory
    "learning_proofs": {
        "r2d2_masked_120k": [*R2D2_MASKED, "--total-timesteps", "120000"],
        "apex_masked_120k": [*APEX, "--mask-velocity", "--total-timesteps", "120000"],
        "apex_100k": [*APEX, "--total-timesteps", "100000"],
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
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "commit": commit + ("+dirty" if dirty else ""),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }


def run_one(cmd_template: list, seed: int, cwd: Path) -> dict:
    """Run one entry for one seed in `cwd` (kept, so that benchmark/plot.py can read its TensorBoard events)."""
    shutil.rmtree(cwd, ignore_errors=True)
    cwd.mkdir(parents=True)
    out = cwd / "summary.json"
    cmd = [c.format(seed=seed, out=out) for c in cmd_template]
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONWARNINGS="ignore")
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    external = time.time() - t0
    (cwd / "stdout.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    if not out.exists():  # algos/ files write runs/<run_name>/summary.json
        out = next(cwd.glob("runs/*/summary.json"))
    summary = json.loads(out.read_text())
    summary["external_wall_s"] = external
    return summary


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("suite", choices=sorted(SUITES))
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    p.add_argument("--entries", nargs="+", help="subset of the suite's entries")
    p.add_argument("--out", help="results file (default: benchmark/results/<suite>_cartpole.json)")
    p.add_argument("--parallel", type=int, default=1, help="runs at a time (long budgets; they then share the CPUs)")
    a = p.parse_args()
    entries = {k: v for k, v in SUITES[a.suite].items() if not a.entries or k in a.entries}
    results = {name: [] for name in entries}
    jobs = [(seed, name) for seed in a.seeds for name in entries]

    def job(seed_name):
        seed, name = seed_name
        r = run_one(entries[name], seed, ROOT / "benchmark" / "results" / "raw" / a.suite / f"{name}_{seed}")
        print(
            f"seed {seed} {name:10s} time_to_threshold={r['time_to_threshold_s']} s steps={r.get('threshold_step')} "
            f"sps={r['sps']:.0f} eval={r.get('eval_return_mean')} wall={r['external_wall_s']:.1f} s",
            flush=True,
        )
        return r

    with ThreadPoolExecutor(max_workers=a.parallel) as pool:
        for (_, name), r in zip(jobs, pool.map(job, jobs), strict=True):
            results[name].append(r)
    table = {
        name: {
            "time_to_threshold_median_s": median([r["time_to_threshold_s"] for r in rs]),
            "time_to_threshold_range_s": [
                min((r["time_to_threshold_s"] for r in rs if r["time_to_threshold_s"]), default=None),
                max((r["time_to_threshold_s"] for r in rs if r["time_to_threshold_s"]), default=None),
            ],
            "reached": sum(r["time_to_threshold_s"] is not None for r in rs),
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
            "eval_return_median": median([r.get("eval_return_mean") for r in rs]),
            "eval_return_min": min((r["eval_return_mean"] for r in rs if "eval_return_mean" in r), default=None),
            "eval_solved": sum(
                r.get("eval_return_mean", -math.inf) >= (r.get("reward_threshold") or 475.0) for r in rs
            ),
        }
        for name, rs in results.items()
    }
    record = {
        "suite": a.suite,
        "machine": machine(),
        "seeds": a.seeds,
        "command": " ".join(sys.argv),
        "parallel": a.parallel,
        "table": table,
        "runs": results,
    }
    out = Path(a.out or ROOT / "benchmark" / "results" / f"{a.suite}_cartpole.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2))
    print(
        "\n| entry | time to threshold, median [range] | reached | steps to threshold (median) | SPS (median) "
        "| episodes/s (median) | start-up (median) | final eval: solved, median, min |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, t in table.items():
        lo, hi = t["time_to_threshold_range_s"]
        rng = f"{t['time_to_threshold_median_s']:.2f} s [{lo:.2f}-{hi:.2f}]" if lo is not None else "not reached"
        steps = f"{t['threshold_step_median']:.0f}" if t["threshold_step_median"] else "-"
        eps = f"{t['episodes_per_s_median']:.0f}" if t["episodes_per_s_median"] else "-"
        final = (
            f"{t['eval_solved']}/{t['runs']}, {t['eval_return_median']:.1f}, {t['eval_return_min']:.1f}"
            if t["eval_return_min"] is not None
            else "- (stops at the threshold)"
        )
        startup = f"{t['startup_median_s']:.2f} s" if t["startup_median_s"] is not None else "-"
        print(
            f"| {name} | {rng} | {t['reached']}/{t['runs']} | {steps} | {t['sps_median']:.0f} | {eps} "
            f"| {startup} | {final} |"
        )
    print(f"\nwritten to {out} ({record['machine']})")


if __name__ == "__main__":
    main()

"""Learning curves from the runs benchmark/run.py kept: charts/episodic_return of every seed against wall time
since training start and against environment steps, with the reward threshold.

  python benchmark/plot.py ddppo --entry ddppo --out docs/img/ddppo_cartpole.png
  python benchmark/plot.py evolution_mujoco --entry ga_hopper --key charts/elite_return --threshold 0 --out x.png
  python benchmark/plot.py final_eval --overview --out docs/img/overview_cartpole.png    # every file, a panel each
  python benchmark/plot.py final_eval --overview --runs-dir DIR --out x.png              # runs kept elsewhere
"""

import argparse
import json
from pathlib import Path

import numpy as np
import run
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = Path(__file__).resolve().parents[1]
SMOOTH_FROM = 100  # a run that logged fewer returns logs one per generation or round, not one per episode
# the overview's scalar where a file's own threshold measure is another: the GA's elite, not its population's mean
OVERVIEW_KEY = {"ga": "charts/elite_return"}


def curves(run_dir: Path, key: str = "charts/episodic_return"):
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    events = acc.Scalars(key)
    return [e.step for e in events], [e.wall_time for e in events], [e.value for e in events]


def training_start(run_dir: Path, summary: dict, steps: list, walls: list) -> float:
    """The wall time at which the run's training began. A run that reached its threshold logged the crossing at
    `threshold_step`, `time_to_threshold_s` seconds into training: the start lies that far before the event. A run
    that did not: the summary's write time less the run's wall time, plus its start-up (the final evaluation's
    seconds of error)."""
    reached = [wall for step, wall in zip(steps, walls, strict=True) if step >= (summary.get("threshold_step") or -1)]
    if summary.get("time_to_threshold_s") is not None and reached:
        return reached[0] - summary["time_to_threshold_s"]
    return (run_dir / "summary.json").stat().st_mtime - summary["wall_time_s"] + summary["startup_s"]


def seed_runs(raw: Path, entry: str, key: str):
    """Every kept seed of an entry: its summary, and the scalar's steps, seconds since training start and values."""
    for seed_dir in sorted(d for d in raw.glob(f"{entry}_*") if d.name[len(entry) + 1 :].isdigit()):
        run_dir = next(seed_dir.glob("runs/*"))
        summary = json.loads((run_dir / "summary.json").read_text())
        steps, walls, values = curves(run_dir, key)
        t0 = training_start(run_dir, summary, steps, walls)
        yield summary, steps, [w - t0 for w in walls], values


def pyplot():
    """matplotlib (benchmark/requirements.txt), imported only to draw: the curves' data needs the project's packages
    alone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def panel(raw: Path, entry: str, key: str):
    """An entry's overview panel: its title, and per seed the line (seconds since training start, return) and
    whether it is a 20-episode mean (one logged point per episode) or the logged means of generations or rounds
    (ES, GA, federated PG: each point already a mean of many episodes)."""
    runs = list(seed_runs(raw, entry, OVERVIEW_KEY.get(entry, key)))
    lines = []
    for _, _, seconds, values in runs:
        if len(values) >= SMOOTH_FROM:
            lines.append((seconds[19:], list(np.convolve(values, np.ones(20) / 20, mode="valid")), True))
        else:
            lines.append((seconds, values, False))
    masked = ", velocities masked" if runs[0][0].get("mask_velocity") else ""
    elite = ", elite" if entry in OVERVIEW_KEY else ""
    return f"{entry} ({runs[0][0]['env_id']}{masked}{elite})", lines


def overview(raw: Path, suite: str, threshold: float, key: str):
    """Every entry of the suite in its own panel: each seed's returns against seconds since training start."""
    plt = pyplot()
    entries = [name for name in run.SUITES[suite] if any(raw.glob(f"{name}_*/runs/*/summary.json"))]
    columns = 3
    rows = -(-len(entries) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4 * columns, 2.8 * rows), sharey=True, squeeze=False)
    for ax, entry in zip(axes.flat, entries, strict=False):  # the grid's last row may have empty panels
        title, lines = panel(raw, entry, key)
        for seconds, values, per_episode in lines:
            ax.plot(seconds, values, lw=0.8, marker=None if per_episode else ".")
        if threshold:
            ax.axhline(threshold, color="k", ls="--", lw=0.8)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(entries) :]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("seconds of training")
    for ax in axes[:, 0]:
        ax.set_ylabel("return")
    fig.suptitle(
        f"Every file with its defaults, one line per seed (benchmark/run.py {suite})\nthe mean of the last 20 "
        "episodes, or of each generation or round where a file logs those (dots)"
    )
    return fig


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("suite")
    p.add_argument("--entry", help="one entry: its curves against time and steps")
    p.add_argument("--overview", action="store_true", help="every entry of the suite, a panel each")
    p.add_argument("--out", required=True)
    p.add_argument("--threshold", type=float, default=475.0, help="dashed line (0: none)")
    p.add_argument("--key", default="charts/episodic_return", help="TensorBoard scalar to plot")
    p.add_argument("--runs-dir", help="the suite's runs (benchmark/run.py's --runs-dir; default: results/raw/SUITE)")
    a = p.parse_args()
    raw = Path(a.runs_dir) if a.runs_dir else ROOT / "benchmark" / "results" / "raw" / a.suite
    if a.overview:
        fig = overview(raw, a.suite, a.threshold, a.key)
    elif a.entry:
        fig = entry_figure(raw, a)
    else:
        p.error("give --entry or --overview")
    fig.tight_layout()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(a.out, dpi=110)
    print(f"written to {a.out}")


def entry_figure(raw: Path, a):
    fig, (ax_t, ax_s) = pyplot().subplots(1, 2, figsize=(11, 4))
    for summary, steps, seconds, values in seed_runs(raw, a.entry, a.key):
        label = f"seed {summary['seed']}"
        ax_t.plot(seconds, values, lw=0.8, label=label)
        ax_s.plot(steps, values, lw=0.8, label=label)
    for ax, xlabel in [(ax_t, "seconds of training"), (ax_s, "environment steps")]:
        if a.threshold:
            ax.axhline(a.threshold, color="k", ls="--", lw=0.8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(a.key)
        ax.grid(alpha=0.3)
    ax_s.legend(fontsize=8)
    fig.suptitle(f"{a.entry} on {summary['env_id']} (benchmark/run.py {a.suite})")
    return fig


if __name__ == "__main__":
    main()

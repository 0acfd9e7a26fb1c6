"""Learning curves from the runs benchmark/run.py kept: charts/episodic_return of every seed against wall time
since process start and against environment steps, with the reward threshold.

  python benchmark/plot.py ddppo --entry ddppo --out docs/img/ddppo_cartpole.png
  python benchmark/plot.py evolution_mujoco --entry ga_hopper --key charts/elite_return --threshold 0 --out x.png
"""

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def curves(run_dir: Path, key: str = "charts/episodic_return"):
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    events = acc.Scalars(key)
    return [e.step for e in events], [e.wall_time for e in events], [e.value for e in events]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("suite")
    p.add_argument("--entry", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--threshold", type=float, default=475.0, help="dashed line (0: none)")
    p.add_argument("--key", default="charts/episodic_return", help="TensorBoard scalar to plot")
    a = p.parse_args()
    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(11, 4))
    raw = ROOT / "benchmark" / "results" / "raw" / a.suite
    for seed_dir in sorted(d for d in raw.glob(f"{a.entry}_*") if d.name[len(a.entry) + 1 :].isdigit()):
        run_dir = next(seed_dir.glob("runs/*"))
        summary = json.loads((run_dir / "summary.json").read_text())
        steps, walls, values = curves(run_dir, a.key)
        start = summary["wall_time_s"]  # process start = (time the summary was written) - wall_time_s
        t0 = (run_dir / "summary.json").stat().st_mtime - start
        label = f"seed {summary['seed']}"
        ax_t.plot([w - t0 for w in walls], values, lw=0.8, label=label)
        ax_s.plot(steps, values, lw=0.8, label=label)
    for ax, xlabel in [(ax_t, "seconds since process start (imports included)"), (ax_s, "environment steps")]:
        if a.threshold:
            ax.axhline(a.threshold, color="k", ls="--", lw=0.8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(a.key)
        ax.grid(alpha=0.3)
    ax_s.legend(fontsize=8)
    fig.suptitle(f"{a.entry} on {summary['env_id']} (benchmark/run.py {a.suite})")
    fig.tight_layout()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(a.out, dpi=110)
    print(f"written to {a.out}")


if __name__ == "__main__":
    main()

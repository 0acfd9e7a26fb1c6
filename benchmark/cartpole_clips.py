"""A trained agent on each file's page: the file's default run on CartPole-v1 with `--capture-video` (seed 1, run
as a user types it), and an excerpt of its final evaluation's first episode as docs/img/cartpole_<file>.gif (every
second frame at half size, made by atari.py's `clip`). The run's figures go to benchmark/results/cartpole_clips.json
beside the commit and machine, so each page can say what the clip shows.

  python benchmark/cartpole_clips.py                    # all nine, one after another (about 15 min on 2 cores)
  python benchmark/cartpole_clips.py a3c es --seconds 8
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from atari import clip
from run import machine

ROOT = Path(__file__).resolve().parents[1]
ALGOS = ["a3c", "apex", "ddppo", "es", "fedpg", "ga", "impala", "r2d2", "seed"]
RESULTS = ROOT / "benchmark" / "results" / "cartpole_clips.json"


def record(name: str, seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as workdir:
        command = [sys.executable, str(ROOT / "algos" / f"{name}.py"), "--capture-video", "--seed", "1"]
        subprocess.run(command, cwd=workdir, check=True, stdout=subprocess.DEVNULL)
        run_dir = next(Path(workdir).glob("runs/*"))
        summary = json.loads((run_dir / "summary.json").read_text())
        out = ROOT / "docs" / "img" / f"cartpole_{name}.gif"
        frames = clip(run_dir / "videos" / "eval_episode0.mp4", out, 0.0, seconds, shrink=2)
    return {
        "command": f"python algos/{name}.py --capture-video --seed 1",
        "env_id": summary["env_id"],
        "global_step": summary["global_step"],
        "eval_return_mean": summary["eval_return_mean"],
        "wall_time_s": round(summary["wall_time_s"], 1),
        "clip": str(out.relative_to(ROOT)),
        "clip_frames": frames,
        "clip_kib": round(out.stat().st_size / 1024),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("algos", nargs="*", default=ALGOS)
    parser.add_argument("--seconds", type=float, default=8.0, help="of the evaluation episode, from its start")
    args = parser.parse_args()
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"runs": {}}
    for name in args.algos:
        results["runs"][name] = {**record(name, args.seconds), "machine": machine()}
        print(name, json.dumps(results["runs"][name]), flush=True)
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()

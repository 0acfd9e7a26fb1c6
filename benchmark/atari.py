"""Pong-v5 runs of distrl's Atari files beside CleanRL's PPO, on one machine, long enough to span sessions.

`run` starts one run at a time, alone, entries interleaved seed by seed (ours, the peer, ours, ...), each in
benchmark/results/raw/atari/<entry>_<seed>/. Our files checkpoint every few minutes; when --hours is spent the
runner sends SIGTERM (the file writes its checkpoint and exits) and the next invocation continues the run with the
file's own --resume, so their summary.json times are whole-run figures. The peer, CleanRL's ppo_atari_envpool.py
unmodified from ../shared/peers/cleanrl/ with its own hyperparameters (`peer-venv` builds its virtualenv from
benchmark/requirements-peer-atari.txt: it imports the old gym API), has no resume: it starts only with
--peer-min-hours left, and the runner stops it once it has passed 2M steps and its 20-episode training mean has
reached 18 (both measures taken; it then runs 130 s more so that its TensorBoard events are flushed), or at its
own end. A peer run cut by --hours or by a stopped runner is moved aside (<dir>.cut<time>) and started anew by the
next invocation; `report` still gives its figures up to the cut (1M and 2M steps, steps/s), marked as cut.

A run made elsewhere (a lent GPU machine) can sit beside them as <entry>_<seed>.<machine>/, with its runs/ and a
segments.jsonl of the same fields; `report` reads it like the others and the plots name each run's machine.

`report` reads the TensorBoard events of every run: the 20-episode training mean of the returns (raw game score;
for Ape-X and R2D2 only the episodes of their least-exploring envs, epsilon_i <= 0.01, as the files count them)
at 1M and 2M steps, the training time (steps / the logged steps per second, so start-up is not in it) and step at
which that mean first reached 18, steps per second, the final greedy evaluation (ours), and draws each entry's
curves against frames and against training hours into docs/img/pong_<entry>.png.

  python benchmark/atari.py peer-venv
  python benchmark/atari.py run --entries impala cleanrl_ppo --seeds 1 --hours 2
  python benchmark/atari.py report          # -> benchmark/results/atari_pong.json, docs/img/pong_*.png
  python benchmark/atari.py throughput --entries a3c apex r2d2 --minutes 5   # -> atari_throughput.json
  python benchmark/atari.py clip --entry impala --seed 1 --start 20   # -> docs/img/pong_impala.gif
  python benchmark/atari.py clip --entry impala --seed 2 --start 20   # -> docs/img/pong_impala_seed2.gif
  python benchmark/atari.py clip --entry impala_ent25 --seed 2 --start 20   # -> docs/img/pong_impala_ent25_seed2.gif
  python benchmark/atari.py clip --entry seed --seed 1 --machine h100 --start 20   # -> docs/img/pong_seed_h100.gif

`throughput` runs each entry's command alone for a few minutes in a scratch directory and records its steps/s
(for the files whose Pong runs outlast this machine's sessions, to project their time). `clip` cuts an excerpt
of a finished run's evaluation video (the file's --capture-video MP4) into a GIF small enough for its page.
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import numpy as np
from run import machine

ROOT = Path(__file__).resolve().parents[1]
RAW = ROOT / "benchmark" / "results" / "raw" / "atari"
PEER_VENV = ROOT / "benchmark" / "peer-venv"
THROUGHPUT = ROOT / "benchmark" / "results" / "atari_throughput.json"
# Sample Factory's APPO on Pong-v5 (envpool), its throughput beside ours; its own virtualenv (benchmark/peer_venvs.py)
SAMPLE_FACTORY_PONG = [str(ROOT / "benchmark" / "sf-venv" / "bin" / "python"), str(ROOT / "benchmark" / "sf_pong.py")]
PY = sys.executable
VIDEO_FPS = 30  # the files' evaluation videos (open_video)
CLIP_FPS = 15  # the pages' excerpts keep every second frame
TARGET = 18.0  # Pong: a 20-episode mean of 18 of 21 points
COUNTED_EPSILON = 0.01  # Ape-X's and R2D2's --threshold-epsilon default: the envs whose episodes count
PEER_FLUSH_S = 130  # the peer runs this long after its measures are taken (its events flush every 120 s)
PEER_FILE = ROOT.parent / "shared" / "peers" / "cleanrl" / "ppo_atari_envpool.py"
PEER_LINE = re.compile(r"global_step=(\d+), episodic_return=(-?[\d.]+)")
# what every one of our runs adds: checkpoints continued by the next invocation, the final evaluation's video
OURS = ["--exp-name", "bench", "--resume", "--capture-video"]

# entry -> command for one seed ("{seed}" filled in): each file's `--preset atari` (its PRESETS), plus how often it
# checkpoints (about every 5 minutes of this machine) and its threads. The `impala`, `impala_6m` and SEED entries:
# entropy cost 0.0006 as monobeast (IMPALA's preset now holds DeepMind's scalable_agent's 0.00025, the
# `impala_ent25` runs); with 0.01 the policy stayed uniform (entropy 1.785 of ln 6 = 1.792) over the first 1.85M
# steps here (raw/atari/impala_1.ent0.01). Batch 8 unrolls (160 steps) rather than the paper's 32: on 2 cores the
# learner is the bottleneck and a batch of 32 gives one update per 640 steps; it was still at -19.9 after 3.4M
# steps (raw/atari/impala_1.b32)
ENTRIES = {
    "impala": [PY, str(ROOT / "algos/impala.py"), "--seed", "{seed}", "--preset", "atari", "--ent-coef", "0.0006"]
    + ["--torch-threads", "2", "--checkpoint-every", "300", *OURS],
    "seed": [PY, str(ROOT / "algos/seed.py"), "--seed", "{seed}", "--preset", "atari"]
    + ["--torch-threads", "2", "--checkpoint-every", "300", *OURS],
    "ddppo": [PY, str(ROOT / "algos/ddppo.py"), "--seed", "{seed}", "--preset", "atari"]
    + ["--env-threads", "2", "--torch-threads", "2", "--checkpoint-every", "100", *OURS],
    # A3C's preset: Adam with shared moments (the file's default optimizer) at CleanRL's Atari PPO rate 2.5e-4,
    # t_max 5, entropy 0.01, clip 40; 8 envs per worker rather than the paper's 1 (batched inference: two workers
    # on two cores). The paper's shared RMSProp (lr 7e-4, decay 0.99) failed here for its unstated eps: 0.1 (3.94M
    # steps, raw/atari/a3c_1.eps01) and 1e-5 (1.03M, a3c_1.eps1e5) swamped the mean squared gradient (3e-7,
    # 1e-8): steps 1/1900 and 1/160 of RMSProp's, the policy uniform; 1e-10 (1.84M, a3c_1.eps1e10) took full
    # steps from a zero average and the conv layers died (gradients about 1e-10), the policy uniform again
    "a3c": [PY, str(ROOT / "algos/a3c.py"), "--seed", "{seed}", "--preset", "atari"]
    + ["--checkpoint-every", "2000", *OURS],
    # Ape-X's preset: the paper's n 3, alpha 0.6, beta 0.4, target copy every 2500 updates, clip 40, gamma 0.99;
    # batch 64 (512) and one update per 16 steps (4 sampled transitions per step), replay 200k (2M; 11.3 GB of
    # frames); 1.5M steps (6M frames), as 10M would take 19 h at its 144 steps/s here (seed 1 ran its first 1.14M
    # steps under --total-timesteps 10000000, which a resume may change)
    "apex": [PY, str(ROOT / "algos/apex.py"), "--seed", "{seed}", "--preset", "atari"]
    + ["--torch-threads", "2", "--checkpoint-every", "2000", *OURS],
    # R2D2's preset: the paper's burn-in 40, sequences of 80 overlapping by 40, n 5, gamma 0.997, lr 1e-4, batch
    # 64, target copy every 2500 updates; replay 4k sequences (100k; 0.88 MB each, frames stored once: 3.5 GB,
    # r2d2.md). Meant for a GPU learner; on 2 CPU cores only its throughput is measured (`throughput`)
    "r2d2": [PY, str(ROOT / "algos/r2d2.py"), "--seed", "{seed}", "--preset", "atari"]
    + ["--torch-threads", "2", "--checkpoint-every", "500", *OURS],
    "cleanrl_ppo": [str(PEER_VENV / "bin" / "python"), str(PEER_FILE), "--seed", "{seed}", "--env-id", "Pong-v5"]
    + ["--no-cuda"],
}


# DD-PPO with 4M steps (its learning rate annealed over 4M rather than CleanRL's 10M): a run that ends, with its
# final evaluation and video, in about 3 h of this machine (the 10M run needs about 8 h)
ENTRIES["ddppo_4m"] = ENTRIES["ddppo"] + ["--total-timesteps", "4000000"]
# IMPALA's candidate for the Pong time target: the learner on 1 torch thread (the file's default; beside the two
# actors on 2 cores, 2 spinning OpenMP threads cost 27% of the steps/s), its network under bf16 autocast (5% more on
# a CPU with bf16 units), and the learning rate annealed over 6M steps rather than 10M (the IMPALA and SEED runs rose
# to about +5-12 by 4M and then held a plateau; two passed 18 at 7.3M and 7.8M, once the rate had fallen to about a
# quarter, and `impala` seed 1 stayed near 10): impala_pong_threads.json
ENTRIES["impala_6m"] = [PY, str(ROOT / "algos/impala.py"), "--seed", "{seed}", "--preset", "atari", "--bf16"]
ENTRIES["impala_6m"] += ["--ent-coef", "0.0006"]
ENTRIES["impala_6m"] += ["--total-timesteps", "6000000", "--checkpoint-every", "300", *OURS]
# SEED's candidate, the same values: one learner thread (its inference and training threads each take one; 896
# steps/s against 880 with 2 threads) and bf16 autocast (1,013): seed_pong_threads.json. IMPALA's seed 1 did not
# reach 18 under them (best 14.05 by 6M steps); SEED's seed 1 under the 10M schedule passed 18 at 7.8M
ENTRIES["seed_6m"] = [PY, str(ROOT / "algos/seed.py"), "--seed", "{seed}", "--preset", "atari", "--bf16"]
ENTRIES["seed_6m"] += ["--total-timesteps", "6000000", "--checkpoint-every", "300", *OURS]

# IMPALA's preset since both its seeds reached 18 (a candidate for seed 1's plateau until then): the entropy cost of
# DeepMind's scalable_agent (0.00025) rather than monobeast's 0.0006, the rest as before (10M steps, one learner
# thread, fp32). On the plateau the policy kept 1.0-1.1 nats of ln 6 = 1.79 (impala_6m_1 from 4M to 6M steps,
# rising as the rate fell); impala_2 passed 18 as its entropy fell to about 0.65 (8M). SEED's seed 1 passed 18 at
# about 1.2 nats, so entropy is no sure cause of the plateau
ENTRIES["impala_ent25"] = [PY, str(ROOT / "algos/impala.py"), "--seed", "{seed}", "--preset", "atari"]
ENTRIES["impala_ent25"] += ["--ent-coef", "0.00025", "--checkpoint-every", "300", *OURS]
# IMPALA's candidate for the steps to 18, one change on top of the preset: the paper's clip of 40 on a loss summed
# over the batch, here over the preset's 160 steps. The file's loss is a mean over the batch's steps, where that clip
# is 40/N: 0.25 at 160 steps (0.0625 at the 640 of the paper, monobeast and Cleanba). The preset's 40 scaled down
# none of 500 Pong batches; 0.25 would have scaled 90% of them on fresh weights and 16% at the end of impala_ent25's
# seed 1, whose mean moved between +5 and +17.65 for 5.7M steps before it reached 18 (impala_grad_norms_pong.json).
# Seed 1 learned more slowly than the preset's (+3.9 at 7M steps against 11.6, best 6.65) and was stopped there
ENTRIES["impala_clip25"] = [PY, str(ROOT / "algos/impala.py"), "--seed", "{seed}", "--preset", "atari"]
ENTRIES["impala_clip25"] += ["--max-grad-norm", "0.25", "--checkpoint-every", "300", *OURS]
# IMPALA's candidate for the steps to 18, one change on top of the preset: the learning rate 6e-4 rather than 3e-4,
# the value of the IMPALA paper's Atari table (there for RMSProp at 640 steps per update). Adam moves each weight by
# at most about the rate per update, whatever the gradient's scale. CleanRL's PPO takes 16 Adam steps of 2.5e-4 per
# 1,024 environment steps (4 epochs of 4 minibatches over the same samples), up to 4.0e-3 in all; the preset takes
# 6.4 updates of 3e-4 (1.9e-3) and needed 3.1-4.2 times the peer's steps to 18; 6e-4 gives 3.8e-3, at no cost in
# steps/s. The public IMPALA configurations (the paper's, monobeast's, RLlib's) give about 1e-3 per 1,024 steps.
# Seed 1 reached the preset's plateau no sooner (+10 at 4.10M steps; +8.6 at 1.88 h, best 16.1) and was stopped there
ENTRIES["impala_lr6"] = [PY, str(ROOT / "algos/impala.py"), "--seed", "{seed}", "--preset", "atari"]
ENTRIES["impala_lr6"] += ["--learning-rate", "6e-4", "--checkpoint-every", "300", *OURS]


def make_peer_venv() -> None:
    """The peer's own virtualenv (old gym, an envpool that still speaks it), never the project's."""
    subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
    requirements = ROOT / "benchmark" / "requirements-peer-atari.txt"
    subprocess.run([str(PEER_VENV / "bin" / "pip"), "install", "-q", "-r", str(requirements)], check=True)


def finished(entry: str, run_dir: Path) -> bool:
    if entry == "cleanrl_ppo":
        return (run_dir / "peer_end.json").exists()
    return any(run_dir.glob("runs/*/summary.json"))


def peer_measured(peer_returns: list) -> bool:
    """Both of the peer's measures are taken: past 2M steps, and a 20-episode mean of 18 reached."""
    returns = [episode_return for _, episode_return in peer_returns]
    means = np.convolve(returns, np.ones(20) / 20, mode="valid") if len(returns) >= 20 else []
    return bool(peer_returns) and peer_returns[-1][0] >= 2_000_000 and any(mean >= TARGET for mean in means)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM (ours write a checkpoint and exit), then SIGKILL if it has not ended in 5 minutes."""
    proc.terminate()
    try:
        proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_segment(entry: str, seed: int, deadline: float):
    """One segment of one run, until it ends or the deadline (then SIGTERM: ours checkpoint and exit).
    Returns why the runner stopped it (None: it ended by itself)."""
    run_dir = RAW / f"{entry}_{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = [part.format(seed=seed) for part in ENTRIES[entry]]
    segment = {"command": " ".join(cmd), "machine": machine(), "start": time.time()}
    # unbuffered: the peer's episode lines reach the stop rule as they are printed
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONWARNINGS="ignore", PYTHONUNBUFFERED="1")
    peer_returns = []  # (step, return) of the peer's finished episodes, from its printed lines
    stopped = None
    measured_at = None

    def copy_output(proc):
        with open(run_dir / "stdout.log", "a", buffering=1) as log:
            for line in proc.stdout:
                log.write(line)
                match = PEER_LINE.search(line)
                if match:
                    peer_returns.append((int(match.group(1)), float(match.group(2))))

    # its own session: a Ctrl-C of the runner reaches the run only as the runner's SIGTERM
    proc = subprocess.Popen(
        cmd, cwd=run_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    copier = threading.Thread(target=copy_output, args=(proc,))
    copier.start()
    try:
        while proc.poll() is None:
            if entry == "cleanrl_ppo" and measured_at is None and peer_measured(peer_returns):
                measured_at = time.time()
            # the peer's TensorBoard writer flushes every 120 s and SIGTERM gives it no chance to: wait for it
            if measured_at is not None and time.time() > measured_at + PEER_FLUSH_S:
                stopped = "measured"
                break
            if time.time() > deadline:
                stopped = "deadline"
                break
            time.sleep(1.0)
    except KeyboardInterrupt:  # the runner itself was stopped: stop the run the same way
        stopped = "interrupted"
    finally:
        stop(proc)
        copier.join()
        segment.update(end=time.time(), returncode=proc.returncode, stopped=stopped)
        with open(run_dir / "segments.jsonl", "a") as segments:
            segments.write(json.dumps(segment) + "\n")
        if entry == "cleanrl_ppo" and stopped in (None, "measured"):
            last_step = peer_returns[-1][0] if peer_returns else 0
            (run_dir / "peer_end.json").write_text(json.dumps({"stopped": stopped or "end", "last_step": last_step}))
        elif entry == "cleanrl_ppo":
            # no resume: a cut run is kept aside for the record and the next invocation starts the peer anew
            run_dir.rename(run_dir.with_name(f"{run_dir.name}.cut{int(segment['start'])}"))
    print(f"{entry} seed {seed}: segment ended ({stopped or f'exit {proc.returncode}'})", flush=True)
    return stopped


def run(entries: list, seeds: list, hours: float, peer_min_hours: float) -> None:
    deadline = time.time() + hours * 3600
    for seed in seeds:
        for entry in entries:
            left_hours = (deadline - time.time()) / 3600
            if left_hours <= 0:
                return
            # a minute's slack, so that `--hours 2` starts a peer of `--peer-min-hours 2` as first entry
            if entry == "cleanrl_ppo" and left_hours < peer_min_hours - 1 / 60:
                print(f"cleanrl_ppo seed {seed}: {left_hours:.2f} h left, below --peer-min-hours; not started")
                continue
            if not finished(entry, RAW / f"{entry}_{seed}") and run_segment(entry, seed, deadline) == "interrupted":
                return


def all_scalars(run_dir: Path) -> dict:
    """Every scalar a run logged, {tag: points}, read in one pass over its events rather than one pass per tag."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {key: events.Scalars(key) for key in events.Tags()["scalars"]}


def scalar_points(run_dir: Path, key: str) -> list:
    return all_scalars(run_dir).get(key, [])


def scalars(logged: dict, key: str):
    """One tag of all_scalars as arrays of steps and values."""
    points = logged.get(key, [])
    return np.array([p.step for p in points], dtype=np.int64), np.array([p.value for p in points])


def second_half_rate(points: list):
    """Steps per second over the second half of a run's window, from the wall clock of its logged steps (start-up
    and a replay's learning_starts phase, actors alone, are not in it)."""
    wall = np.array([p.wall_time for p in points])
    steps = np.array([p.step for p in points])
    second_half = np.flatnonzero(wall >= (wall[0] + wall[-1]) / 2)[0]
    if wall[-1] <= wall[second_half]:
        return None  # fewer than two points in the second half: too slow to measure in this window
    return float((steps[-1] - steps[second_half]) / (wall[-1] - wall[second_half]))


def throughput(entries: list, minutes: float, seed: int, out: Optional[Path] = None) -> None:
    """Steps/s of each entry's Pong command (less --resume and --capture-video), run alone for `minutes` in a
    scratch directory: the rate over the second half of the window, from the wall clock of the logged steps, so
    that start-up and a replay's learning_starts phase (actors alone) are not in it."""
    out = out or THROUGHPUT
    results = json.loads(out.read_text()) if out.exists() else {}
    for entry in entries:
        run_dir = RAW.with_name("atari_throughput") / entry
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        if entry == "sf_appo":  # Sample Factory in its own virtualenv; it measures its own rate the same way
            out = run_dir / "summary.json"
            cmd = [*SAMPLE_FACTORY_PONG, "--seconds", str(int(minutes * 60)), "--seed", str(seed), "--out", str(out)]
            with open(run_dir / "stdout.log", "w") as log:
                subprocess.run(cmd, cwd=run_dir, stdout=log, stderr=subprocess.STDOUT, check=True)
            results[entry] = {"machine": machine(), "minutes": minutes, **json.loads(out.read_text())}
            print(entry, json.dumps(results[entry]), flush=True)
            out.write_text(json.dumps(results, indent=1))
            continue
        cmd = [part.format(seed=seed) for part in ENTRIES[entry] if part not in ("--resume", "--capture-video")]
        env = dict(os.environ, WANDB_MODE="disabled", PYTHONWARNINGS="ignore")
        with open(run_dir / "stdout.log", "w") as log:
            proc = subprocess.Popen(
                cmd, cwd=run_dir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            time.sleep(minutes * 60)
            stop(proc)
        logged = all_scalars(next(run_dir.glob("runs/*")))
        points = logged.get("charts/SPS", [])
        updates = logged.get("stats/learner_updates_per_s", [])
        results[entry] = {
            "command": " ".join(cmd),
            "machine": machine(),
            "minutes": minutes,
            "last_step": int(points[-1].step),
            "steps_per_s": second_half_rate(points),
            "learner_updates_per_s": updates[-1].value if updates else None,
        }
        print(entry, json.dumps(results[entry]), flush=True)
        out.write_text(json.dumps(results, indent=1))


def clip(video: Path, out: Path, start_s: float, seconds: float, shrink: int = 1) -> int:
    """`seconds` of `video` from `start_s`, every second frame (and every `shrink`-th pixel), as a looping GIF at
    CLIP_FPS. Returns the frame count."""
    import imageio.v2 as imageio_v2
    import imageio.v3 as imageio_v3

    first = round(start_s * VIDEO_FPS)
    last = first + round(seconds * VIDEO_FPS)
    step = VIDEO_FPS // CLIP_FPS
    frames = []
    with imageio_v2.get_reader(video) as reader:
        for index, frame in enumerate(reader):
            if index >= last:
                break
            if index >= first and (index - first) % step == 0:
                frames.append(frame[::shrink, ::shrink])
    imageio_v3.imwrite(out, np.stack(frames), duration=1000 / CLIP_FPS, loop=0)
    return len(frames)


def machine_name(machine: dict) -> str:
    gpu = f", {machine['gpu']}" if machine.get("gpu") else ""
    return f"{machine['cpu']} ({machine['cores']} cores{gpu})"


def measures(entry: str, seed: int, seed_dir: Optional[Path] = None) -> dict:
    """The report's figures of one run, from its TensorBoard events (and summary.json when it ended). A peer run
    that was cut (<dir>.cut<time>) still gives its figures up to the cut: `cut` says so."""
    seed_dir = seed_dir or RAW / f"{entry}_{seed}"
    run_dir = next(seed_dir.glob("runs/*"))
    logged = all_scalars(run_dir)
    steps, returns = scalars(logged, "charts/episodic_return")
    # Ape-X and R2D2 log each episode's epsilon_i: like their own train_return_last20, count only the envs that
    # explore least (epsilon_i at most COUNTED_EPSILON, or the least), not those that explore up to 0.4
    _, epsilons = scalars(logged, "charts/epsilon")
    if len(epsilons):
        counted = epsilons <= max(COUNTED_EPSILON, epsilons.min())
        steps = steps[counted]
        returns = returns[counted]
    sps_steps, sps = scalars(logged, "charts/SPS")
    # training time at each logged step: the files log SPS = global_step / training time
    train_hours = np.interp(steps, sps_steps, sps_steps / np.maximum(sps, 1e-9)) / 3600
    means = np.array([returns[max(0, i - 19) : i + 1].mean() for i in range(len(returns))])
    full = np.arange(len(returns)) >= 19
    reached = np.flatnonzero(full & (means >= TARGET))

    def mean_at(step: int):
        before = np.flatnonzero(full & (steps <= step))
        return float(means[before[-1]]) if len(before) and steps[-1] >= step else None

    segments = [json.loads(line) for line in (seed_dir / "segments.jsonl").read_text().splitlines()]
    summaries = list(seed_dir.glob("runs/*/summary.json"))
    summary = json.loads(summaries[0].read_text()) if summaries else {}
    return {
        "entry": entry,
        "seed": seed,
        "cut": ".cut" in seed_dir.name,
        "command": segments[-1]["command"],
        "segments": [{k: s[k] for k in ("start", "end", "stopped", "returncode")} for s in segments],
        "machines": sorted({machine_name(s["machine"]) for s in segments}),
        "commits": sorted({s["machine"]["commit"] for s in segments}),
        "last_step": int(sps_steps[-1]) if len(sps_steps) else 0,
        "train_hours": float(train_hours[-1]) if len(train_hours) else 0.0,
        "sps": float(sps[-1]) if len(sps) else None,
        "mean20_at_1M": mean_at(1_000_000),
        "mean20_at_2M": mean_at(2_000_000),
        "step_to_18": int(steps[reached[0]]) if len(reached) else None,
        "train_hours_to_18": float(train_hours[reached[0]]) if len(reached) else None,
        "best_mean20": float(means[full].max()) if full.any() else None,
        "eval_return_mean": summary.get("eval_return_mean"),
        "eval_return_std": summary.get("eval_return_std"),
        "startup_s": summary.get("startup_s"),
        "curve": {"steps": steps.tolist(), "train_hours": train_hours.tolist(), "mean20": means.tolist()},
    }


def plot(entry: str, runs: list, peer_runs: list) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_frames, ax_hours) = plt.subplots(1, 2, figsize=(11, 4.6))
    for r, colour in [(r, None) for r in runs] + [(r, "0.6") for r in peer_runs]:
        curve = r["curve"]
        label = f"{r['entry']} seed {r['seed']}"
        if sum(other["seed"] == r["seed"] for other in runs) > 1:
            # runs of one seed told apart by their start
            label += time.strftime(", run of %Y-%m-%d %H:%M UTC", time.gmtime(r["segments"][0]["start"]))
        if len({tuple(other["machines"]) for other in runs}) > 1:
            # the cores (and GPU) of the machine, "2 cores" or "16 cores, NVIDIA H100 80GB HBM3"
            label += ", " + " + ".join(name.split(" (", 1)[1].rstrip(")") for name in r["machines"])
        if r["cut"]:
            label += f" (cut at {curve['steps'][-1] / 1e6:.2f}M steps)"
        frames = np.array(curve["steps"]) * 4
        ax_frames.plot(frames / 1e6, curve["mean20"], lw=1, color=colour, label=label)
        ax_hours.plot(curve["train_hours"], curve["mean20"], lw=1, color=colour, label=label)
    for ax, xlabel in [(ax_frames, "frames (millions; 4 per step)"), (ax_hours, "training hours (start-up excluded)")]:
        ax.axhline(TARGET, color="k", ls="--", lw=0.8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("20-episode mean training return")
        ax.set_ylim(-21.5, 21.5)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{entry} on Pong-v5 (benchmark/atari.py; CleanRL PPO in grey)")
    fig.tight_layout()
    handles, labels = ax_frames.get_legend_handles_labels()
    rows = (len(labels) + 1) // 2
    fig.subplots_adjust(bottom=0.12 + 0.05 * rows)
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8, frameon=False)
    out = ROOT / "docs" / "img" / f"pong_{entry}.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def report() -> None:
    runs = []
    for seed_dir in sorted(RAW.glob("*_*")):
        # <entry>_<seed>, or with a suffix: .cut<time> (a cut peer run), .<machine> (a run made elsewhere)
        name = re.fullmatch(r"([a-z0-9]+(?:_[a-z0-9]+)*?)_(\d+)(\.\w+)?", seed_dir.name)
        if name and name.group(1) in ENTRIES and (seed_dir / "segments.jsonl").exists():
            runs.append(measures(name.group(1), int(name.group(2)), seed_dir))
    # runs whose directories are gone (lost with an earlier work tree) keep their recorded figures
    out = ROOT / "benchmark" / "results" / "atari_pong.json"
    present = {(r["entry"], r["seed"], r["segments"][0]["start"]) for r in runs}
    recorded = json.loads(out.read_text())["runs"] if out.exists() else []
    runs += [r for r in recorded if (r["entry"], r["seed"], r["segments"][0]["start"]) not in present]
    peer_runs = [r for r in runs if r["entry"] == "cleanrl_ppo"]
    for entry in sorted({r["entry"] for r in runs} - {"cleanrl_ppo"}):
        print("plot:", plot(entry, [r for r in runs if r["entry"] == entry], peer_runs))
    out.write_text(json.dumps({"target": TARGET, "runs": runs}, indent=1))
    print("| run | steps | training h | steps/s | mean at 1M | at 2M | to 18: steps, training h | final eval |")
    print("|---|---|---|---|---|---|---|---|")
    for r in runs:

        def show(value, fmt="{:.1f}"):
            return "-" if value is None else fmt.format(value)

        print(
            f"| {r['entry']} {r['seed']}{' (cut)' if r['cut'] else ''} | {r['last_step']:,} | {r['train_hours']:.2f} "
            f"| {show(r['sps'], '{:.0f}')} "
            f"| {show(r['mean20_at_1M'])} | {show(r['mean20_at_2M'])} "
            f"| {show(r['step_to_18'], '{:,}')}, {show(r['train_hours_to_18'], '{:.2f}')} "
            f"| {show(r['eval_return_mean'])} |"
        )
    print(f"written to {out}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    sub.add_parser("peer-venv", help="build the peer's virtualenv")
    go = sub.add_parser("run", help="run or continue the runs, one at a time")
    go.add_argument("--entries", nargs="+", choices=sorted(ENTRIES), default=sorted(ENTRIES))
    go.add_argument("--seeds", type=int, nargs="+", default=[1])
    go.add_argument("--hours", type=float, required=True, help="this invocation's time; then SIGTERM, resume later")
    go.add_argument("--peer-min-hours", type=float, default=2.0, help="start the peer (no resume) only with this left")
    sub.add_parser("report", help="figures and plots of every run so far")
    speed = sub.add_parser("throughput", help="steps/s of entries run alone for a few minutes each (no learning)")
    speed.add_argument(
        "--entries", nargs="+", choices=sorted(set(ENTRIES) - {"cleanrl_ppo"} | {"sf_appo"}), required=True
    )
    speed.add_argument("--minutes", type=float, default=5.0)
    speed.add_argument("--seed", type=int, default=1)
    speed.add_argument(
        "--out", default=None, help="the results file (default atari_throughput.json; its entries are kept)"
    )
    cut = sub.add_parser("clip", help="an excerpt of a run's evaluation video as docs/img/pong_<entry>[_seed<N>].gif")
    cut.add_argument("--entry", choices=sorted(set(ENTRIES) - {"cleanrl_ppo"}), required=True)
    cut.add_argument("--seed", type=int, default=1)
    cut.add_argument("--start", type=float, default=0.0, help="seconds into the video")
    cut.add_argument("--seconds", type=float, default=10.0)
    cut.add_argument("--machine", default="", help="a run made elsewhere: <entry>_<seed>.<machine>/")
    a = p.parse_args()
    if a.what == "peer-venv":
        make_peer_venv()
    elif a.what == "run":
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        run(a.entries, a.seeds, a.hours, a.peer_min_hours)
    elif a.what == "throughput":
        throughput(a.entries, a.minutes, a.seed, Path(a.out) if a.out else None)
    elif a.what == "clip":
        suffix = f".{a.machine}" if a.machine else ""
        video = next((RAW / f"{a.entry}_{a.seed}{suffix}").glob("runs/*/videos/eval_episode0.mp4"))
        seed_suffix = f"_seed{a.seed}" if a.seed != 1 else ""
        out = ROOT / "docs" / "img" / f"pong_{a.entry}{seed_suffix}{suffix.replace('.', '_')}.gif"
        frames = clip(video, out, a.start, a.seconds)
        print(f"{out}: {frames} frames, {out.stat().st_size / 1024:.0f} KiB")
    else:
        report()


if __name__ == "__main__":
    main()

"""benchmark/: the runner (run.py: commands, a suite run here, its tables), and atari.py's figures, read back from
TensorBoard events written here with known values, the rule that stops the peer, the start-up forked workers
report, and grad_norms.py's batches in the learner's layout."""

import csv
import json
import queue
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.tensorboard import SummaryWriter

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))
import atari  # noqa: E402
import results_table  # noqa: E402
import run  # noqa: E402
from conftest import check_ok, child_env  # noqa: E402

RUNNER = Path(run.__file__)
NINE = ["a3c", "apex", "ddppo", "es", "fedpg", "ga", "impala", "r2d2", "seed"]


def test_readme_results_table_agrees_with_the_results_files():
    """README's table is what benchmark/results_table.py makes of the committed results files, a row per file."""
    block = results_table.block(results_table.README.read_text())
    assert block == results_table.table(), "README's results table is stale: run python benchmark/results_table.py"
    rows = [line for line in block.splitlines() if line.startswith("| ")][1:]
    assert [row.split(" | ")[0][2:] for row in rows] == [name for name, *_ in results_table.SOURCES]
    assert {entry.split("_")[0] for *_, entry in results_table.SOURCES} == set(NINE)  # every file has a row


def test_index_comparison_table_agrees_with_the_results_files():
    """docs/index.md's table of the nine files is what benchmark/results_table.py makes of the results, a row each."""
    page = results_table.INDEX.read_text()
    block = results_table.block(page, results_table.INDEX_START, results_table.INDEX_END)
    assert block == results_table.index_table(), "docs/index.md's table is stale: run python benchmark/results_table.py"
    rows = [line for line in block.splitlines() if line.startswith("| [")]
    assert sorted(re.match(r"\| \[[^\]]*\]\((\w+)\.md\)", row).group(1) for row in rows) == NINE


def test_dry_run_prints_every_command_and_runs_nothing(tmp_path):
    runs = tmp_path / "runs"
    proc = subprocess.run(
        [sys.executable, RUNNER, "final_eval", "--seeds", "1", "2", "--dry-run", "--runs-dir", runs],
        capture_output=True,
        text=True,
        timeout=120,
    )
    check_ok(proc)
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 2 * len(NINE)
    for algo in NINE:
        mine = [line for line in lines if f"algos/{algo}.py" in line]
        assert [f"--seed {seed}" in line for seed, line in zip([1, 2], mine, strict=True)] == [True, True], mine
    assert all(f"{runs}/" in line for line in lines) and not runs.exists()


def test_unknown_entry_is_refused(tmp_path):
    proc = subprocess.run(
        [sys.executable, RUNNER, "smoke", "--entries", "nosuch", "--dry-run"], capture_output=True, text=True
    )
    assert proc.returncode != 0 and "nosuch" in proc.stderr


def test_a_peer_without_its_virtualenv_is_refused_naming_the_script_that_builds_it(tmp_path, monkeypatch):
    monkeypatch.setitem(run.SUITES, "smoke", {"peer": [str(tmp_path / "no-venv/bin/python"), "peer.py"]})
    with pytest.raises(SystemExit, match="no-venv/bin/python does not exist.*benchmark/peer_venvs.py"):
        run.main(run.Config(suite="smoke", seeds=[1], runs_dir=str(tmp_path / "runs")))
    assert not (tmp_path / "runs").exists()


def test_table_is_mean_and_std_over_seeds_of_the_runs_that_have_the_figure():
    runs = {
        "a": [
            {
                "time_to_threshold_s": 2.0,
                "threshold_step": 100,
                "sps": 10.0,
                "eval_return_mean": 500.0,
                "startup_s": 1.0,
            },
            {
                "time_to_threshold_s": 4.0,
                "threshold_step": 300,
                "sps": 30.0,
                "eval_return_mean": 400.0,
                "startup_s": 3.0,
            },
            {"time_to_threshold_s": None, "threshold_step": None, "sps": 20.0, "eval_return_mean": 100.0},
        ]
    }
    t = run.aggregate(runs)["a"]
    assert t["time_to_threshold_mean_std_s"] == (3.0, 1.0) and t["threshold_step_mean_std"] == (200.0, 100.0)
    assert t["sps_mean_std"][0] == 20.0 and t["eval_return_mean_std"][0] == pytest.approx(1000 / 3)
    assert t["reached"] == 2 and t["eval_solved"] == 1 and t["runs"] == 3  # solved: 475 or more
    # eval 500, 400, 100: mean 333.3, std 170.0; SPS 10, 30, 20: 20 ± 8.2; time and steps over the 2 that reached it
    assert run.table_rows({"a": t})[0] == [
        "a",
        "3",
        "333.3 ± 170.0",
        "1/3",
        "3.00 ± 1.00",
        "2/3",
        "200 ± 100",
        "20 ± 8",
        "2.00 ± 1.00",  # start-up, over the runs that report it
    ]


def test_a_suite_runs_here_two_at_a_time_and_writes_its_tables(tmp_path):
    """The tiny `smoke` suite, 2 seeds, 2 runs at a time: every run's summary in the record, and the .md and .csv
    tables agree with it."""
    out = tmp_path / "smoke.json"
    proc = subprocess.run(
        [sys.executable, RUNNER, "smoke", "--seeds", "1", "2", "--parallel", "2", "--runs-dir", tmp_path, "--out", out],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=300,
    )
    check_ok(proc)
    record = json.loads(out.read_text())
    assert record["command"].startswith("python benchmark/run.py smoke") and record["machine"]["cpu"]
    for entry in ["ddppo", "es"]:
        assert [summary["seed"] for summary in record["runs"][entry]] == [1, 2]
        assert (tmp_path / f"{entry}_2" / "stdout.log").exists()
    rows = list(csv.reader(open(out.with_suffix(".csv"))))
    assert rows[0] == run.COLUMNS and [row[0] for row in rows[1:]] == ["ddppo", "es"]
    evals = [summary["eval_return_mean"] for summary in record["runs"]["ddppo"]]
    assert rows[1][2] == f"{sum(evals) / 2:.1f} ± {abs(evals[0] - evals[1]) / 2:.1f}"
    assert "| ddppo | 2 | " + rows[1][2] in out.with_suffix(".md").read_text()


# 60 episodes, one every 50k steps, scores climbing from -21 by 1 a time (to +21 at episode 42)
PONG_EPISODES = [(50_000 * (i + 1), min(-21 + i, 21)) for i in range(60)]
# steps per second logged every 30k steps (between the episodes), falling from 1000 to 500
PONG_SPS = [(30_000 * (k + 1), 1000 - 500 * k / 99) for k in range(100)]
PONG_MACHINE = {"cpu": "test", "cores": 2, "commit": "abc"}
PONG_SEGMENT = {"command": "x", "machine": PONG_MACHINE, "start": 0, "end": 1, "returncode": 0, "stopped": None}


def write_pong_run(seed_dir: Path, epsilons=None) -> None:
    """PONG_EPISODES and PONG_SPS as a file logs them. With `epsilons` (Ape-X, R2D2): each of those episodes comes
    from an env at epsilon_i epsilons[0], and after it, at the same step, one from an env at epsilons[1] that lost
    21-0."""
    writer = SummaryWriter(seed_dir / "runs" / "Pong-v5__bench__1")
    for step, score in PONG_EPISODES:
        for return_, epsilon in [(score, None)] if epsilons is None else [(score, epsilons[0]), (-21, epsilons[1])]:
            writer.add_scalar("charts/episodic_return", return_, step)
            if epsilon is not None:
                writer.add_scalar("charts/epsilon", epsilon, step)
    for step, sps in PONG_SPS:
        writer.add_scalar("charts/SPS", sps, step)
    writer.close()
    (seed_dir / "segments.jsonl").write_text(json.dumps(PONG_SEGMENT) + "\n")


def test_pong_figures_from_a_runs_events(tmp_path, monkeypatch):
    monkeypatch.setattr(atari, "RAW", tmp_path)
    seed_dir = tmp_path / "impala_1"
    write_pong_run(seed_dir)
    episodes = PONG_EPISODES
    sps_points = PONG_SPS
    machine = PONG_MACHINE
    segment = PONG_SEGMENT

    r = atari.measures("impala", 1)

    # the slow references: the mean of the 20 episodes ending at each one, read where the text says; training
    # time at a step by straight-line interpolation of step / SPS between the two SPS points around it
    def mean20(i):
        return sum(score for _, score in episodes[i - 19 : i + 1]) / 20

    def train_seconds(step):
        (a, sps_a), (b, sps_b) = next(
            (p, q) for p, q in zip(sps_points[:-1], sps_points[1:], strict=True) if p[0] <= step <= q[0]
        )
        return a / sps_a + (b / sps_b - a / sps_a) * (step - a) / (b - a)

    at_1m = max(i for i, (step, _) in enumerate(episodes) if step <= 1_000_000)  # episode 19 ends at 1M
    assert r["mean20_at_1M"] == pytest.approx(mean20(at_1m))
    first = next(i for i in range(19, 60) if mean20(i) >= 18)
    assert r["step_to_18"] == episodes[first][0]
    assert r["train_hours_to_18"] == pytest.approx(train_seconds(episodes[first][0]) / 3600, rel=1e-5)
    assert r["last_step"] == 3_000_000 and r["sps"] == pytest.approx(500)
    assert r["eval_return_mean"] is None  # no summary.json: the run has not ended
    assert not r["cut"]
    # a peer run cut by the deadline (moved aside) still gives its figures up to the cut, marked as cut
    cut_dir = seed_dir.rename(tmp_path / "cleanrl_ppo_1.cut1700000000")
    cut = atari.measures("cleanrl_ppo", 1, cut_dir)
    assert cut["cut"] and cut["mean20_at_1M"] == r["mean20_at_1M"] and cut["step_to_18"] == r["step_to_18"]
    # a run made on another machine (a GPU one) sits beside them as <entry>_<seed>.<machine>, named with its GPU
    elsewhere = tmp_path / "impala_2.h100"
    shutil.copytree(cut_dir, elsewhere)
    gpu_machine = dict(machine, cores=16, gpu="GPU X")
    (elsewhere / "segments.jsonl").write_text(json.dumps(dict(segment, machine=gpu_machine)) + "\n")
    # a candidate entry whose name holds digits (impala_6m) is read like the others
    shutil.copytree(cut_dir, tmp_path / "impala_6m_3")
    # `report` records the runs found here and keeps, as recorded, the runs whose directories are gone
    monkeypatch.setattr(atari, "ROOT", tmp_path)
    monkeypatch.setattr(atari, "plot", lambda entry, runs, peer_runs: entry)
    out = tmp_path / "benchmark" / "results" / "atari_pong.json"
    out.parent.mkdir(parents=True)
    gone = dict(cut, entry="ddppo", cut=False, segments=[dict(cut["segments"][0], start=5)])
    out.write_text(json.dumps({"runs": [gone, dict(cut, last_step=1)]}))
    atari.report()
    runs = json.loads(out.read_text())["runs"]
    assert [(run["entry"], run["cut"], run["last_step"]) for run in runs] == [
        ("cleanrl_ppo", True, cut["last_step"]),  # read again from its directory, not the recorded copy
        ("impala", False, cut["last_step"]),
        ("impala_6m", False, cut["last_step"]),
        ("ddppo", False, cut["last_step"]),
    ]
    assert runs[0]["machines"] == ["test (2 cores)"] and runs[1]["machines"] == ["test (16 cores, GPU X)"]
    assert runs[1]["seed"] == 2 and runs[2]["seed"] == 3


def test_the_peer_is_stopped_only_past_2m_steps_with_a_20_episode_mean_of_18():
    good = [(100_000 * (i + 1), 19.0) for i in range(25)]  # mean 19 from episode 20 on, last step 2.5M
    assert atari.peer_measured(good)
    assert not atari.peer_measured(good[:19])  # fewer than 20 episodes: no mean yet
    assert not atari.peer_measured([(step // 2, score) for step, score in good])  # only 1.25M steps
    assert not atari.peer_measured([(step, 17.0) for step, _ in good])
    assert not atari.peer_measured([])


FAKE_RUN = """
import sys, time
from torch.utils.tensorboard import SummaryWriter
writer = SummaryWriter("runs/Pong-v5__bench__1")
# start-up of 100 s at 10 steps/s, then 100 steps/s: the steps/s of the window's second half is 100
t0 = time.time() - 1000
for i in range(11):
    writer.add_scalar("charts/SPS", 0.0, 10 * i, walltime=t0 + 10 * i)
for i in range(1, 91):
    writer.add_scalar("charts/SPS", 0.0, 100 + 100 * i, walltime=t0 + 100 + i)
writer.close()
print("ready", flush=True)
time.sleep(600)
"""


def test_throughput_is_the_rate_of_the_windows_second_half(tmp_path, monkeypatch):
    script = tmp_path / "fake_run.py"
    script.write_text(FAKE_RUN)
    monkeypatch.setattr(atari, "RAW", tmp_path / "raw" / "atari")
    monkeypatch.setattr(atari, "THROUGHPUT", tmp_path / "atari_throughput.json")
    monkeypatch.setitem(atari.ENTRIES, "fake", [sys.executable, str(script), "--seed", "{seed}", "--resume"])

    atari.throughput(["fake"], minutes=5 / 60, seed=1)

    result = json.loads((tmp_path / "atari_throughput.json").read_text())["fake"]
    assert result["steps_per_s"] == pytest.approx(100.0)
    assert result["last_step"] == 9100
    assert "--resume" not in result["command"] and "--seed 1" in result["command"]
    assert (tmp_path / "raw" / "atari_throughput" / "fake" / "stdout.log").read_text().startswith("ready")


def test_clip_keeps_every_second_frame_of_the_window(tmp_path):
    """A video whose frame i shows a bright column at x = i: the clip from second 1 for 1 second holds the
    frames 30, 32, ..., 58 in order."""
    import imageio.v2 as imageio_v2
    import imageio.v3 as imageio_v3
    import numpy as np

    video = tmp_path / "eval_episode0.mp4"
    with imageio_v2.get_writer(video, fps=atari.VIDEO_FPS, macro_block_size=1) as writer:
        for i in range(90):
            frame = np.zeros((32, 96, 3), dtype=np.uint8)
            frame[:, i] = 255
            writer.append_data(frame)
    out = tmp_path / "clip.gif"
    assert atari.clip(video, out, start_s=1.0, seconds=1.0) == 15
    frames = imageio_v3.imread(out, index=None)
    columns = [int(frame[..., :3].sum(axis=(0, 2)).argmax()) for frame in frames]
    assert columns == list(range(30, 60, 2))
    # every second pixel too (the CartPole clips): half the size, the column at x = i / 2
    assert atari.clip(video, out, start_s=1.0, seconds=1.0, shrink=2) == 15
    frames = imageio_v3.imread(out, index=None)
    assert frames.shape[1:3] == (16, 48)
    assert [int(frame[..., :3].sum(axis=(0, 2)).argmax()) for frame in frames] == list(range(15, 30))


def test_memory_growth_is_the_slope_of_the_jobs_total_after_warm_up():
    """Two processes whose PSS add up to 200 MiB + 3 MiB per minute once warm (and anything before): the summary
    fits 3 MiB/min after the warm-up, and reports the peak of the total and of one process's RSS."""
    import memory

    mib = memory.MIB
    samples = []
    for t in range(0, 600, 2):
        total = 50 * mib if t < 60 else 200 * mib + 3 * mib * t / 60
        samples.append(
            {"t": t, "rss": {"main": total * 0.8, "9": total * 0.5}, "pss": {"main": total / 2, "9": total / 2}}
        )
    summary = memory.summarize({"samples": samples}, warm_up=60)
    assert summary["growth_after_warm_up_mib_per_min"] == pytest.approx(3.0)
    assert summary["peak_total_pss_mib"] == pytest.approx(200 + 3 * 598 / 60, abs=0.05)
    assert summary["peak_process_rss_mib"] == pytest.approx(0.8 * (200 + 3 * 598 / 60), abs=0.05)
    assert summary["processes"] == 2


def test_follow_samples_a_running_job_from_its_start_until_it_ends(tmp_path):
    """A job already a second old, leader and one child in a session of their own: follow() writes a header naming
    it, then samples of both processes with t counted from the leader's start, and returns once the job ends."""
    import time

    import memory

    job = tmp_path / "job.py"
    child = "import time; time.sleep(2)"
    # the job writes the moment it ends (CLOCK_MONOTONIC, the same in every process)
    end = tmp_path / "end"
    job.write_text(
        f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {child!r}]).wait()\n"
        f"open({str(end)!r}, 'w').write(repr(time.monotonic()))\n"
    )
    leader = subprocess.Popen([sys.executable, str(job), "--env-id", "Toy-v0"], start_new_session=True)
    leader_start = time.monotonic() - memory.seconds_since_start(leader.pid)
    time.sleep(1.0)
    out = tmp_path / "memory_job.jsonl"
    memory.follow(leader.pid, 0.25, out)
    assert leader.wait(timeout=5) == 0
    record = memory.read_followed(out)["runs"][0]
    assert record["algo"] == "job"
    assert record["command"] == [str(job), "--env-id", "Toy-v0"]
    times = [sample["t"] for sample in record["samples"]]
    assert 0.9 <= times[0] < 1.6
    assert times == sorted(times)
    # the last sample within a second of the job's end, however long its interpreters took to start on a
    # busy machine (a fixed bound of 4 s failed once with another test beside it)
    job_end = float(end.read_text()) - leader_start
    assert job_end - 1.0 <= times[-1] <= job_end + 1.0
    assert {"main"} < set(record["samples"][2]["pss"])
    assert all(rss > 1e6 for sample in record["samples"] for rss in sample["rss"].values())
    memory.plot(out, tmp_path)
    assert (tmp_path / "memory_job_toy.png").stat().st_size > 0


def test_overview_panel_is_a_20_episode_mean_per_seed_or_the_logged_generation_means(tmp_path):
    import plot

    # ddppo logs every episode (120: a 20-episode mean of 101 points); es one mean per generation (6: as logged)
    for entry, seeds, points in [("ddppo", [1, 2], 120), ("es", [1], 6)]:
        for seed in seeds:
            run_dir = tmp_path / f"{entry}_{seed}" / "runs" / f"CartPole-v1__bench__{seed}"
            writer = SummaryWriter(run_dir)
            for episode in range(points):
                writer.add_scalar("charts/episodic_return", 2.0 * episode, 100 * (episode + 1))
            writer.close()
            summary = {"env_id": "CartPole-v1", "seed": seed, "wall_time_s": 1, "startup_s": 0.5}
            (run_dir / "summary.json").write_text(json.dumps(summary))
    title, lines = plot.panel(tmp_path, "ddppo", "charts/episodic_return")
    assert title == "ddppo (CartPole-v1)" and len(lines) == 2
    seconds, values, per_episode = lines[0]
    assert per_episode and len(seconds) == 101
    assert values == pytest.approx([2.0 * (i + 9.5) for i in range(101)])
    title, lines = plot.panel(tmp_path, "es", "charts/episodic_return")
    assert title == "es (CartPole-v1)" and lines[0][1:] == ([2.0 * i for i in range(6)], False)


def test_the_curves_count_seconds_from_training_start(tmp_path):
    """A run that reached its threshold at step 300, 7 s into training, logged that step at wall time 1007: its
    training began at 1000. A run that did not: the summary's write time less its wall time, plus its start-up."""
    import plot

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text("{}")
    reached = {"threshold_step": 300, "time_to_threshold_s": 7.0, "wall_time_s": 30.0, "startup_s": 2.0}
    assert plot.training_start(run_dir, reached, [100, 200, 300, 400], [1001.0, 1004.0, 1007.0, 1009.0]) == 1000.0
    written = (run_dir / "summary.json").stat().st_mtime
    missed = {"threshold_step": None, "time_to_threshold_s": None, "wall_time_s": 30.0, "startup_s": 2.0}
    assert plot.training_start(run_dir, missed, [100], [1001.0]) == pytest.approx(written - 28.0)


def test_pong_figures_of_apex_and_r2d2_count_only_their_least_exploring_envs(tmp_path, monkeypatch):
    """Beside each episode of an env at epsilon_i 0.01 (counted, as in the files) an env at 0.4 loses 21-0: the
    figures are those of the counted episodes alone; and with no env at 0.01 or below, those of the least
    epsilon."""
    monkeypatch.setattr(atari, "RAW", tmp_path)
    write_pong_run(tmp_path / "impala_1")
    write_pong_run(tmp_path / "apex_1", epsilons=(0.01, 0.4))
    write_pong_run(tmp_path / "r2d2_1", epsilons=(0.02, 0.4))
    alone = atari.measures("impala", 1)
    assert alone["step_to_18"] is not None
    figures = ["mean20_at_1M", "mean20_at_2M", "step_to_18", "train_hours_to_18", "best_mean20", "curve"]
    for entry in ["apex", "r2d2"]:
        assert {key: atari.measures(entry, 1)[key] for key in figures} == {key: alone[key] for key in figures}


# spawn_workers with a worker_entry that prints how far its process start lies from the launcher's
FORKED_START = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("algo", sys.argv[1])
algo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(algo)
# read without filling the cache: the launcher's own start, a second before it forks
launcher = algo.process_start_time.__wrapped__()
time.sleep(1.0)
algo.worker_entry = lambda index, *_: print(index, algo.process_start_time() - launcher, flush=True)
flags = getattr(algo, "RunArgs", algo.Args)
sys.exit(algo.spawn_workers(flags(num_workers=2), algo.install_stop_handlers()))
"""


@pytest.mark.parametrize("name", ["es", "fedpg", "ga"])
def test_forked_workers_count_start_up_from_the_launchers_start(name):
    """A worker forked by --num-workers starts at the fork; its startup_s must still count from the launcher's start
    (its imports), which spawn_workers caches before forking. Not from a timed run: a fork a second after the start
    shows the difference whatever the machine's speed."""
    script = Path(__file__).resolve().parents[1] / "algos" / f"{name}.py"
    proc = subprocess.run(
        [sys.executable, "-c", FORKED_START, str(script)], env=child_env(), capture_output=True, text=True, timeout=60
    )
    check_ok(proc)
    offsets = dict(line.split() for line in proc.stdout.splitlines())
    assert sorted(offsets) == ["0", "1"] and all(abs(float(s)) < 0.05 for s in offsets.values()), offsets


def test_a_peers_summary_has_the_keys_run_py_reads_with_start_up_apart_from_training():
    import time

    import peer_timing

    train_start = time.time()
    summary = peer_timing.cartpole_summary("rllib_impala", 3, 1000, train_start, train_start + 10.0, (4.0, 400), x=1)
    assert summary["sps"] == pytest.approx(100.0) and summary["train_time_s"] == pytest.approx(10.0)
    assert (summary["time_to_threshold_s"], summary["threshold_step"], summary["x"]) == (4.0, 400, 1)
    # this test's process started before train_start
    assert 0 < summary["startup_s"] < summary["wall_time_s"]
    assert run.aggregate({"peer": [summary]})["peer"]["time_to_threshold_median_s"] == 4.0


def test_grad_norms_collects_batches_in_the_learners_layout_and_reports_their_norms():
    """grad_norms.py's batches are what impala.py's learner takes (keys, shapes, dtypes of take_batch on one unroll),
    and its shares of clipped batches follow from the norms it reports."""
    import grad_norms

    module = grad_norms.load_impala()
    args = module.Args(**module.PRESETS["atari"])
    spec = module.envpool.make_spec(args.env_id)
    buffers = module.unroll_buffers(args, spec, 1, 0)
    expected, _, _, _ = module.take_batch(buffers, [0], queue.Queue(), "cpu")
    envs = module.make_env(args.env_id, args.num_envs, 1)
    agent = module.Agent(spec.observation_space.shape, spec.action_space.n)
    carry = {"obs": torch.as_tensor(envs.reset()[0]), "valid": torch.ones(args.num_envs)}
    batch = grad_norms.collect(module, args, agent, envs, carry)
    envs.close()
    assert sorted(batch) == sorted(expected)
    for key in expected:
        assert batch[key].shape == expected[key].shape, key
        assert batch[key].dtype == expected[key].dtype, key
    row = grad_norms.norms_of(module, "fresh", 2, 1)
    assert len(row["norms"]) == 2 and all(norm > 0 for norm in row["norms"])
    for clip, share in row["share_clipped"].items():
        assert share == sum(norm > float(clip) for norm in row["norms"]) / 2
    assert row["norm_p10_p50_p90_max"][-1] == pytest.approx(max(row["norms"]), abs=1e-3)

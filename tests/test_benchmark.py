"""benchmark/atari.py's figures, read back from TensorBoard events written here with known values, and the
rule that stops the peer."""

import json
import sys
from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))
import atari  # noqa: E402


def test_pong_figures_from_a_runs_events(tmp_path, monkeypatch):
    monkeypatch.setattr(atari, "RAW", tmp_path)
    seed_dir = tmp_path / "impala_1"
    writer = SummaryWriter(seed_dir / "runs" / "Pong-v5__bench__1")
    # 60 episodes, one every 50k steps, scores climbing from -21 by 1 a time (to +21 at episode 42)
    episodes = [(50_000 * (i + 1), min(-21 + i, 21)) for i in range(60)]
    for step, score in episodes:
        writer.add_scalar("charts/episodic_return", score, step)
    # steps per second logged every 30k steps (between the episodes), falling from 1000 to 500
    sps_points = [(30_000 * (k + 1), 1000 - 500 * k / 99) for k in range(100)]
    for step, sps in sps_points:
        writer.add_scalar("charts/SPS", sps, step)
    writer.close()
    machine = {"cpu": "test", "cores": 2, "commit": "abc"}
    segment = {"command": "x", "machine": machine, "start": 0, "end": 1, "returncode": 0, "stopped": None}
    (seed_dir / "segments.jsonl").write_text(json.dumps(segment) + "\n")

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

"""benchmark/atari.py's figures, read back from TensorBoard events written here with known values."""

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
    # 60 episodes, one every 50k steps, scores climbing from -21 by 1 a time (to +21 at episode 42);
    # the logged steps per second fall from 1000 to 500, as a file's whole-run SPS may
    episodes = [(50_000 * (i + 1), min(-21 + i, 21)) for i in range(60)]
    for i, (step, score) in enumerate(episodes):
        writer.add_scalar("charts/episodic_return", score, step)
        writer.add_scalar("charts/SPS", 1000 - 500 * i / 59, step)
    writer.close()
    machine = {"cpu": "test", "cores": 2, "commit": "abc"}
    segment = {"command": "x", "machine": machine, "start": 0, "end": 1, "returncode": 0, "stopped": None}
    (seed_dir / "segments.jsonl").write_text(json.dumps(segment) + "\n")

    r = atari.measures("impala", 1)

    # the slow reference: the mean of the 20 episodes ending at each one, read where the text says
    def mean20(i):
        return sum(score for _, score in episodes[i - 19 : i + 1]) / 20

    at_1m = max(i for i, (step, _) in enumerate(episodes) if step <= 1_000_000)  # episode 19 ends at 1M
    assert r["mean20_at_1M"] == pytest.approx(mean20(at_1m))
    first = next(i for i in range(19, 60) if mean20(i) >= 18)
    assert r["step_to_18"] == episodes[first][0]
    sps_then = 1000 - 500 * first / 59
    assert r["train_hours_to_18"] == pytest.approx(episodes[first][0] / sps_then / 3600, rel=1e-5)
    assert r["last_step"] == 3_000_000 and r["sps"] == pytest.approx(500)
    assert r["eval_return_mean"] is None  # no summary.json: the run has not ended

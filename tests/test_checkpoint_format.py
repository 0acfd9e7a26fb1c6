"""Every file refuses a checkpoint it cannot resume from with exit 2 and one line naming --resume, and leaves the
file as it was (docs/conventions.md §1a): a checkpoint written before the progress format, one that torch.load
cannot read (empty, random bytes, truncated), one that holds no dict, one written by another file, one without
this file's counters, one of a run with other flags (its recorded run_config), and one whose weights do not fit
this run's network."""

import io
import random
import time

import pytest
import torch
from conftest import load_algo

ALGOS = ["a3c", "apex", "ddppo", "es", "fedpg", "ga", "impala", "r2d2", "seed"]
# the arguments of new_progress after the configuration, where it takes one (its keys do not depend on the value)
PROGRESS_ARGS = {"es": [0]}


def saved(payload) -> bytes:
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


def progress_of(name: str) -> dict:
    """A fresh progress dict of `name` with the configuration of its default flags."""
    module = load_algo(name)
    progress = module.new_progress(module.run_config(module.Args()), *PROGRESS_ARGS.get(name, []))
    return {**progress, "recent_returns": list(progress["recent_returns"])}


def refused(runner, name: str, content: bytes, tmp_name: str, *extra) -> str:
    """Resume from a checkpoint holding `content`: exit 2 within 10 s, one line on stderr naming --resume, the
    file unchanged. Returns the line."""
    run_dir = runner.run_dir("CartPole-v1", tmp_name)
    run_dir.mkdir(parents=True)
    checkpoint = run_dir / "checkpoint.pt"
    checkpoint.write_bytes(content)
    started = time.monotonic()
    proc = runner.run(name, "--exp-name", tmp_name, "--resume", "--total-timesteps", 20000, *extra)
    elapsed = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--resume" in lines[0], proc.stderr[-2000:]
    assert elapsed < 10, f"took {elapsed:.1f} s"
    assert checkpoint.read_bytes() == content
    return lines[0]


@pytest.mark.parametrize("name", ALGOS)
def test_a_damaged_checkpoint_is_refused(runner, name):
    """Random bytes, end to end (the other cases meet the same checks in read_checkpoint, tested in-process)."""
    line = refused(runner, name, random.Random(0).randbytes(4096), "random")
    assert "not a readable checkpoint" in line


@pytest.mark.parametrize("name", [name for name in ALGOS if name != "ga"])  # the GA checkpoints no weights
def test_a_checkpoint_of_another_network_is_refused(runner, name):
    refused(runner, name, another_network(name), "shape")


def another_network(name: str) -> bytes:
    """Every counter of this file's progress, with weights of another shape under each key the file loads, and
    no configuration (as written before configurations were recorded: taken as the run's), so that the weights
    are what is refused."""
    weights = torch.zeros(3) if name in ("es", "fedpg") else {"other_layer.weight": torch.zeros(3)}
    payload = {**progress_of(name), "model": weights, "target": weights, "optimizer": {}, "obstat": torch.zeros(3)}
    del payload["config"]
    return saved(payload)


@pytest.mark.parametrize(
    ("name", "damage"), [("es", "bytes"), ("es", "shape"), ("fedpg", "bytes"), ("fedpg", "shape"), ("ga", "bytes")]
)
def test_forked_workers_refuse_a_bad_checkpoint_in_one_line(runner, name, damage):
    """With two forked workers, one line still: the parent reads the checkpoint before it forks (a file no worker
    could read), and a checkpoint that does not fit the network fails every worker alike, rank 0 says why, and
    the parent exits 2 without a line of its own."""
    content = random.Random(0).randbytes(4096) if damage == "bytes" else another_network(name)
    refused(runner, name, content, damage, "--num-workers", 2)


def read_in_process(name: str, content: bytes, tmp_path, capsys) -> str:
    module = load_algo(name)
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(content)
    with pytest.raises(SystemExit) as exit_info:
        module.read_checkpoint(str(path), progress_of(name))
    assert exit_info.value.code == 2
    assert path.read_bytes() == content
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--resume" in lines[0], lines
    return lines[0]


@pytest.mark.parametrize("name", ALGOS)
def test_read_checkpoint_names_what_is_wrong(name, tmp_path, capsys):
    good = saved({**progress_of(name), "model": torch.zeros(3)})
    config = progress_of(name)["config"]
    cases = {
        # the old files kept their counters at the top level under other names ("generation", "updates", ...)
        "old format": (saved({"global_step": 1000, "generation": 3, "wall_time_s": 5.0}), "progress format"),
        "empty": (b"", "not a readable checkpoint"),
        "truncated": (good[: len(good) // 2], "not a readable checkpoint"),
        "not a dict": (saved([1, 2, 3]), "holds a list"),
        "another file": (saved({**progress_of(name), "algo": "other"}), "written by other.py"),
        "no counters": (saved({"update": 3}), "lacks"),
        "other flags": (saved({**progress_of(name), "config": {**config, "seed": 7}}), "with seed=7 (now 1)"),
    }
    for case, (content, expected) in cases.items():
        line = read_in_process(name, content, tmp_path, capsys)
        assert expected in line, (case, line)


@pytest.mark.parametrize("name", ALGOS)
def test_save_checkpoint_writes_what_read_checkpoint_takes(name, tmp_path):
    module = load_algo(name)
    path = str(tmp_path / "checkpoint.pt")
    module.save_checkpoint(path, {**progress_of(name), "model": torch.ones(2)})
    checkpoint = module.read_checkpoint(path, progress_of(name))
    assert "algo" not in checkpoint and torch.equal(checkpoint["model"], torch.ones(2))
    assert torch.load(path, weights_only=True)["algo"] == name


def test_federated_pgs_earlier_string_configuration_is_refused(tmp_path, capsys):
    """Federated PG recorded eleven of its flags in a string before every file recorded its run_config."""
    earlier = "CartPole-v1 fedavg K=10 M=0 none B=16 b=4 E=4 h=0.0 seed=1 hidden=(16, 16)"
    line = read_in_process("fedpg", saved({**progress_of("fedpg"), "config": earlier}), tmp_path, capsys)
    assert "earlier format" in line


@pytest.mark.parametrize("name", ["ddppo", "impala"])
def test_a_checkpoint_of_another_world_size_is_refused(name, tmp_path, capsys):
    """DD-PPO's and IMPALA's ranks are learners whose batches make one update's: the world size (torchrun's
    process count, no flag) is part of their configuration."""
    progress = progress_of(name)
    assert progress["config"]["world_size"] == 1
    content = saved({**progress, "config": {**progress["config"], "world_size": 2}})
    assert "world_size=2 (now 1)" in read_in_process(name, content, tmp_path, capsys)

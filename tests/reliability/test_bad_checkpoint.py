"""Every file refuses a checkpoint it cannot resume from with exit 2 and one line naming --resume, and leaves the
file as it was (docs/conventions.md §1a, §8): a checkpoint of another format version (the folded files, whose
checkpoints carry one) or written before the progress format (the others), one that torch.load
cannot read (empty, random bytes, truncated), one that holds no dict, one written by another file, one without
this file's counters, one of a run with other flags (its recorded run_config), and one whose weights do not fit
this run's network. And what `restore` takes from a good one is the checkpoint's, bit for bit."""

import io
import random
import time

import pytest
import torch
from conftest import command_line_args, load_algo, progress_of

ALGOS = ["a3c", "apex", "ddppo", "es", "fedpg", "ga", "impala", "r2d2", "seed"]


def stamped(name: str, payload: dict) -> dict:
    """`payload` as save_checkpoint writes it: with the file's name and format version (docs/conventions.md §8; a
    checkpoint without a version, "unversioned", is refused)."""
    return {**payload, "algo": name, "version": load_algo(name).CHECKPOINT_VERSION}


def saved(payload) -> bytes:
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


def refused(runner, name: str, content: bytes, tmp_name: str, *extra) -> str:
    """Resume from a checkpoint holding `content`: exit 2 within 20 s (a guard against a hang: with imports and
    two forked workers, ES took 9-10 s on a loaded 2-core Zen 3), one line on stderr naming --resume, the file
    unchanged. Returns the line."""
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
    assert elapsed < 20, f"took {elapsed:.1f} s"
    assert checkpoint.read_bytes() == content
    return lines[0]


@pytest.mark.parametrize("name", ALGOS)
def test_a_damaged_checkpoint_is_refused(runner, name):
    """Random bytes, end to end (the other cases meet the same checks in read_checkpoint, tested in-process)."""
    line = refused(runner, name, random.Random(0).randbytes(4096), "random")
    assert "not a readable checkpoint" in line


def another_network(name: str) -> bytes:
    """Every counter of this file's progress and its configuration, with weights of another shape under each key
    the file loads, so that the weights are what is refused."""
    weights = torch.zeros(3) if name in ("es", "fedpg") else {"other_layer.weight": torch.zeros(3)}
    payload = {**progress_of(name), "model": weights, "target": weights, "optimizer": {}, "obstat": torch.zeros(3)}
    return saved(stamped(name, payload))


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
    good = saved(stamped(name, {**progress_of(name), "model": torch.zeros(3)}))
    config = progress_of(name)["config"]
    # the old files kept their counters at the top level under other names ("generation", "updates", ...)
    old = saved({"global_step": 1000, "generation": 3, "wall_time_s": 5.0})
    cases = {
        "old format": (old, "unversioned"),
        "empty": (b"", "not a readable checkpoint"),
        "truncated": (good[: len(good) // 2], "not a readable checkpoint"),
        "not a dict": (saved([1, 2, 3]), "holds a list"),
        "another file": (saved({**stamped(name, progress_of(name)), "algo": "other"}), "written by other.py"),
        "no counters": (saved(stamped(name, {"update": 3})), "lacks"),
        "other flags": (
            saved(stamped(name, {**progress_of(name), "config": {**config, "seed": 7}})),
            "with --seed 7 (now --seed 1)",
        ),
    }
    version = load_algo(name).CHECKPOINT_VERSION
    cases["unversioned"] = (saved({**progress_of(name), "algo": name}), "format unversioned")
    cases["another version"] = (
        saved({**stamped(name, progress_of(name)), "version": version + 1}),
        f"format {version + 1}, this file reads format {version}",
    )
    cases["no configuration"] = (
        saved(stamped(name, {k: v for k, v in progress_of(name).items() if k != "config"})),
        "lacks config",
    )
    for case, (content, expected) in cases.items():
        line = read_in_process(name, content, tmp_path, capsys)
        assert expected in line, (case, line)


@pytest.mark.parametrize("name", ALGOS)
def test_save_checkpoint_writes_what_read_checkpoint_takes(name, tmp_path):
    module = load_algo(name)
    path = str(tmp_path / "checkpoint.pt")
    module.save_checkpoint(path, {**progress_of(name), "model": torch.ones(2)})
    checkpoint = module.read_checkpoint(path, progress_of(name))
    assert "algo" not in checkpoint and "version" not in checkpoint and torch.equal(checkpoint["model"], torch.ones(2))
    written = torch.load(path, weights_only=True)
    assert written["algo"] == name
    assert written["version"] == module.CHECKPOINT_VERSION


def test_federated_pgs_earlier_string_configuration_is_refused(tmp_path, capsys):
    """Federated PG recorded eleven of its flags in a string before every file recorded its run_config: such a
    checkpoint has no format version."""
    earlier = "CartPole-v1 fedavg K=10 M=0 none B=16 b=4 E=4 h=0.0 seed=1 hidden=(16, 16)"
    line = read_in_process("fedpg", saved({**progress_of("fedpg"), "config": earlier}), tmp_path, capsys)
    assert "format unversioned" in line


@pytest.mark.parametrize("name", ["ddppo", "impala"])
def test_a_checkpoint_of_another_world_size_is_refused(name, tmp_path, capsys):
    """DD-PPO's and IMPALA's ranks are learners whose batches make one update's: the world size (torchrun's
    process count, no flag) is part of their configuration."""
    progress = progress_of(name)
    assert progress["config"]["world_size"] == 1
    content = saved(stamped(name, {**progress, "config": {**progress["config"], "world_size": 2}}))
    assert "world size 2 (now world size 1)" in read_in_process(name, content, tmp_path, capsys)


# the files whose resume is not bitwise against an uninterrupted run (their episodes restart): what they restore
LEARNERS = ["a3c", "apex", "ddppo", "impala", "r2d2", "seed"]


def learner(name: str) -> tuple:
    """(networks, optimizer) as main() builds them for CartPole: the model (and Ape-X's and R2D2's target network),
    freshly initialized, and the optimizer over the flat parameter vector."""
    module = load_algo(name)
    args = module.Args()
    spec = module.envpool.make_spec("CartPole-v1")
    shape = spec.observation_space.shape
    if name in ("apex", "r2d2"):
        networks = [module.make_network(args, spec), module.make_network(args, spec)]
    elif name == "a3c":
        networks = [module.Agent(shape, spec.action_space, args.use_lstm)]
    elif name == "ddppo":
        networks = [module.Agent(shape, spec.action_space, False, False, args.clip_obs)]
    else:
        networks = [module.Agent(shape, spec.action_space.n, args.network, args.use_lstm, False)]
    flat = module.flatten_parameters(networks[0])
    if name == "a3c":
        optimizer = module.SharedRMSprop([flat], args.learning_rate, args.rmsprop_alpha, args.rmsprop_eps)
    elif name in ("apex", "r2d2"):
        optimizer = torch.optim.Adam([flat], lr=args.learning_rate, eps=args.adam_eps)
    else:
        optimizer = module.make_optimizer(args, flat)
    return networks, optimizer


def same_state(a, b) -> bool:
    """Equal nested state (state_dicts, optimizer state): tensors bit for bit, the rest by value."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.parametrize("name", LEARNERS)
def test_restore_loads_weights_optimizer_state_and_counters_exactly(name, tmp_path):
    """What a resumed run continues from is the checkpoint's, bit for bit: the weights (and the target network),
    the optimizer's state after some steps, the counters; the run segment, which seeds the restarted envs, is one
    more where the file counts segments."""
    module = load_algo(name)
    torch.manual_seed(0)
    networks, optimizer = learner(name)
    flat = optimizer.param_groups[0]["params"][0]
    for _ in range(3):
        flat.grad = torch.randn_like(flat)
        optimizer.step()
    progress = progress_of(name)
    progress.update(update=3, global_step=1234, train_time_s=5.5, recent_returns=[10.0, 12.0])
    payload = {**progress, "model": networks[0].state_dict(), "optimizer": optimizer.state_dict()}
    if len(networks) == 2:
        payload["target"] = networks[1].state_dict()
    module.save_checkpoint(str(tmp_path / "checkpoint.pt"), payload)

    torch.manual_seed(1)
    fresh, fresh_optimizer = learner(name)
    assert not same_state(fresh[0].state_dict(), networks[0].state_dict())
    args = command_line_args(module)(resume=True)
    restored = module.restore(
        args, fresh[0], fresh_optimizer, torch.device("cpu"), str(tmp_path / "checkpoint.pt"), *fresh[1:]
    )
    assert same_state(fresh[0].state_dict(), networks[0].state_dict())
    assert len(fresh) == 1 or same_state(fresh[1].state_dict(), networks[1].state_dict())
    assert same_state(fresh_optimizer.state_dict(), optimizer.state_dict())
    expected = {**progress, "segment": progress["segment"] + 1} if "segment" in progress else progress
    assert {**restored, "recent_returns": list(restored["recent_returns"])} == expected


@pytest.mark.parametrize("name", LEARNERS)
def test_a_checkpoint_of_another_network_is_refused(name, tmp_path, capsys):
    """Weights of another shape under each key `restore` loads: exit 2 and one line naming --resume, the file
    untouched (in-process; ES and federated PG, whose workers load the weights, end to end above; the GA
    checkpoints no weights)."""
    module = load_algo(name)
    networks, optimizer = learner(name)
    path = tmp_path / "checkpoint.pt"
    content = another_network(name)
    path.write_bytes(content)
    with pytest.raises(SystemExit) as exit_info:
        module.restore(
            command_line_args(module)(resume=True),
            networks[0],
            optimizer,
            torch.device("cpu"),
            str(path),
            *networks[1:],
        )
    assert exit_info.value.code == 2
    assert path.read_bytes() == content
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--resume" in lines[0] and "does not fit this run" in lines[0], lines


@pytest.mark.parametrize("name", ALGOS)
def test_a_refused_setting_is_named_as_a_user_types_it(name):
    module = load_algo(name)
    assert module.as_typed("learning_rate", 0.00025) == "--learning-rate 0.00025"
    assert module.as_typed("anneal_lr", False) == "--no-anneal-lr"
    assert module.as_typed("anneal_lr", True) == "--anneal-lr"
    assert module.as_typed("hidden_sizes", [64, 64]) == "--hidden-sizes 64 64"
    assert module.as_typed("hidden_sizes", ()) == "--hidden-sizes"
    assert module.as_typed("world_size", 2) == "world size 2"

"""The layout of docs/conventions.md §1: each folded file reads as its algorithm down to main(), one fold line
follows main(), the infrastructure lies below it, and the part above the fold stays near its recorded size. And
every flag that a command in README.md, docs/, scripts/ or the benchmark suites passes to a file exists."""

import ast
import re
import sys
from dataclasses import fields

import pytest
from conftest import ALGOS, ROOT, command_line_args, load_algo

sys.path.insert(0, str(ROOT / "benchmark"))
import atari  # noqa: E402
import run  # noqa: E402

ALL = ["a3c", "apex", "ddppo", "es", "fedpg", "ga", "impala", "r2d2", "seed"]
# definitions that belong below the fold in every file that has them: flags, checks, checkpoints, determinism,
# health checks, signals, torchrun plumbing and bookkeeping
INFRASTRUCTURE = {
    "Infra",
    "RunArgs",
    "Run",
    "CHECKPOINT_VERSION",
    "fail",
    "validate",
    "process_start_time",
    "new_progress",
    "start_clock",
    "advance_clock",
    "record_returns",
    "record_filter",
    "log_update",
    "update_scalars",
    "round_scalars",
    "print_progress",
    "save_checkpoint",
    "as_typed",
    "read_checkpoint",
    "refuse_checkpoint",
    "run_config",
    "restore",
    "install_stop_handlers",
    "open_writer",
    "write_summary",
    "evaluate_round",
    "global_sum",
    "update_totals",
    "setup_distributed",
    "seed_everything",
    "finish_distributed",
    "available_cpus",
    "worker_entry",
    "forward_signal",
    "spawn_workers",
    "Heartbeats",
    "check_actors",
    "ActorDied",
    "ActorWatch",
    "tie_to_learner",
    "tie_to_parent",
    "Schedule",
    "ActorHealth",
    "WorkerWatch",
    "WorkerDied",
    "WorkerReport",
    "RemoteLink",
    "remote_bridge",
    "start_bridges",
    "run_remote_actor",
}
CONVENTIONS = ROOT / "docs" / "conventions.md"
# a row of the fold table in docs/conventions.md: | file | lines above the fold | ...
ROW = re.compile(r"^\| (\w+) \| (\d+) \| (\d+) \|", re.M)


def top_level_names(tree: ast.Module) -> list:
    """(line, name) of each top-level definition and assignment, in file order."""
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.append((node.lineno, node.name))
        elif isinstance(node, ast.Assign):
            names += [(node.lineno, target.id) for target in node.targets if isinstance(target, ast.Name)]
    return names


def fold_lines(lines: list) -> list:
    return [number for number, line in enumerate(lines, 1) if line.startswith("# ====") and "infrastructure" in line]


def recorded_sizes() -> dict:
    """Lines above the fold per file, as docs/conventions.md's fold table records them."""
    text = CONVENTIONS.read_text()
    table = text[text.index("<!-- fold table -->") :]
    return {name: int(above) for name, above, _ in ROW.findall(table)}


@pytest.mark.parametrize("name", ALL)
def test_the_file_reads_as_its_algorithm_down_to_main_and_the_infrastructure_lies_below_one_fold(name):
    source = (ALGOS / f"{name}.py").read_text()
    lines = source.splitlines()
    folds = fold_lines(lines)
    assert len(folds) == 1, f"{name}.py: {len(folds)} fold lines"
    fold = folds[0]
    names = top_level_names(ast.parse(source))
    above = [(line, definition) for line, definition in names if line < fold]
    assert above[-1][1] == "main", f"{name}.py: the last definition above the fold is {above[-1][1]}, not main"
    misplaced = sorted(definition for _, definition in above if definition in INFRASTRUCTURE)
    assert not misplaced, f"{name}.py: infrastructure above the fold: {misplaced}"
    assert lines[-2:] == ['if __name__ == "__main__":', "    sys.exit(main(tyro.cli(RunArgs)))"]


@pytest.mark.parametrize("name", ALL)
def test_the_part_above_the_fold_stays_near_its_recorded_size(name):
    """docs/conventions.md records each file's lines above the fold; growing more than 10% past the figure fails
    (update it deliberately, in the same commit, when the algorithm itself grows)."""
    recorded = recorded_sizes()
    assert name in recorded, f"{name}.py has no row in the fold table of docs/conventions.md"
    above = fold_lines((ALGOS / f"{name}.py").read_text().splitlines())[0] - 1
    assert above <= 1.1 * recorded[name], f"{name}.py: {above} lines above the fold, recorded {recorded[name]}"


@pytest.mark.parametrize("name", ALL)
def test_every_infrastructure_flag_is_below_the_fold_and_the_algorithms_come_first(name):
    module = load_algo(name)
    algorithm = [flag.name for flag in fields(module.Args) if flag.init]
    infrastructure = [flag.name for flag in fields(module.Infra)]
    everything = [flag.name for flag in fields(module.RunArgs) if flag.init]
    assert everything == algorithm + infrastructure
    assert {"seed", "env_id", "total_timesteps"} <= set(algorithm)
    assert {"exp_name", "checkpoint_every", "resume", "eval_episodes", "save_model", "track"} <= set(infrastructure)


def flags_of(name: str) -> set:
    """Every flag the file's command line takes: --kebab-case per field, and --no-... for booleans."""
    module = load_algo(name)
    names = {"--help"}
    for flag in fields(command_line_args(module)):
        if flag.init:
            kebab = flag.name.replace("_", "-")
            names.add(f"--{kebab}")
            names.add(f"--no-{kebab}")
    return names


def documented_commands() -> list:
    """(where, file, flags) of each command in README.md, docs/ and scripts/ that runs an algos/*.py file: the
    flags after the file's name up to the end of the command (a line, joined over trailing backslashes)."""
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "scripts").iterdir())]
    found = []
    for path in paths:
        text = path.read_text().replace("\\\n", " ")
        for number, line in enumerate(text.splitlines(), 1):
            for match in re.finditer(r"algos/(\w+)\.py((?:\s+[^\s`|;&)]+)*)", line):
                if match.group(1) in ALL:
                    flags = [word.split("=")[0] for word in match.group(2).split() if word.startswith("--")]
                    found.append((f"{path.relative_to(ROOT)}:{number}", match.group(1), flags))
    return found


def suite_commands() -> list:
    """(where, file, flags) of each command list in benchmark/run.py's SUITES and benchmark/atari.py's ENTRIES."""
    found = []

    def walk(where, value):
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{where}[{key}]", inner)
        elif isinstance(value, list) and value and all(isinstance(part, str) for part in value):
            for index, part in enumerate(value):
                match = re.search(r"algos/(\w+)\.py$", part)
                if match:
                    flags = [word for word in value[index + 1 :] if word.startswith("--")]
                    found.append((where, match.group(1), flags))
        elif isinstance(value, (list, tuple)):
            for index, inner in enumerate(value):
                walk(f"{where}[{index}]", inner)
        elif hasattr(value, "__dict__") and not isinstance(value, type):
            walk(where, vars(value))

    walk("benchmark/run.py SUITES", run.SUITES)
    walk("benchmark/atari.py ENTRIES", atari.ENTRIES)
    return found


def test_every_flag_of_every_documented_command_exists():
    commands = documented_commands() + suite_commands()
    assert len({name for _, name, _ in commands}) == len(ALL), "a file with no command found"
    known = {name: flags_of(name) for name in ALL}
    unknown = [(where, name, flag) for where, name, flags in commands for flag in flags if flag not in known[name]]
    assert not unknown, unknown


def flag_values(words: list) -> dict:
    """--flag value pairs of a command's words (a flag without a value, such as --clip-vloss, maps to True)."""
    values = {}
    for index, word in enumerate(words):
        if word.startswith("--"):
            following = words[index + 1] if index + 1 < len(words) else "--"
            values[word] = True if following.startswith("--") else following
    return values


def test_the_readmes_multi_node_pong_command_trains_with_the_tested_pong_values():
    """README's two-node DD-PPO command on Pong-v5 uses the learning values of the Pong run that reached 18
    (benchmark/atari.py's `ddppo` entry): every algorithm flag of that entry, with the same value."""
    text = (ROOT / "README.md").read_text().replace("\\\n", " ")
    lines = [line for line in text.splitlines() if "--nnodes" in line and "algos/ddppo.py" in line]
    assert len(lines) == 1, lines
    documented = flag_values(lines[0].split("algos/ddppo.py", 1)[1].split())
    entry = atari.ENTRIES["ddppo"]
    tested = flag_values(
        [str(word) for word in entry[entry.index(next(w for w in entry if w.endswith("ddppo.py"))) + 1 :]]
    )
    algorithm = {f"--{flag.name.replace('_', '-')}" for flag in fields(load_algo("ddppo").Args) if flag.init}
    learning = {flag: value for flag, value in tested.items() if flag in algorithm - {"--seed", "--total-timesteps"}}
    assert "--learning-rate" in learning and "--env-id" in learning, learning
    differs = {flag: (documented.get(flag), value) for flag, value in learning.items() if documented.get(flag) != value}
    assert not differs, differs

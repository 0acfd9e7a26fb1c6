"""The layout of docs/conventions.md §1: each folded file reads as its algorithm down to main(), one fold line
follows main(), the infrastructure lies below it, and the part above the fold stays near its recorded size. And
every command in README.md, docs/, scripts/ or the benchmark suites runs a file with flags it has: each documented
command parses with the file's own parser, and each Atari preset holds the values of the file's recorded Pong run."""

import ast
import functools
import json
import math
import re
import sys
import warnings
from dataclasses import fields

import pytest
import tyro
from conftest import ALGOS, ROOT, command_line_args, load_algo

sys.path.insert(0, str(ROOT / "benchmark"))
import atari  # noqa: E402
import run  # noqa: E402

ALL = ["a3c", "apex", "ddppo", "es", "fedpg", "ga", "impala", "r2d2", "seed"]
ATARI = ["a3c", "apex", "ddppo", "impala", "r2d2", "seed"]  # the files with `--preset atari`
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
    "parse_args",
    "preset_words",
    "preset_named",
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
    # the files with presets parse the command line below the fold (parse_args), the others with tyro alone
    parse = "parse_args()" if name in ATARI else "tyro.cli(RunArgs)"
    assert lines[-2:] == ['if __name__ == "__main__":', f"    sys.exit(main({parse}))"]


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


def documented_commands(code_only: bool = False) -> list:
    """(where, file, words) of each command in README.md, docs/ and scripts/ that runs an algos/*.py file: the
    words after the file's name up to the end of the command (a line, joined over trailing backslashes). With
    code_only, only the commands a reader copies: those in the pages' code blocks (not docs/diffs.md, which
    quotes the files' own docstrings) and the scripts'."""
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "scripts").iterdir())]
    found = []
    for path in paths:
        if code_only and path.name == "diffs.md":
            continue
        in_code = path.suffix != ".md"
        for number, line in enumerate(path.read_text().replace("\\\n", " ").splitlines(), 1):
            if line.startswith("```"):
                in_code = not in_code
            if code_only and not in_code:
                continue
            for match in re.finditer(r"algos/(\w+)\.py((?:\s+[^\s`|;&)#]+)*)", line):
                if match.group(1) in ALL:
                    found.append((f"{path.relative_to(ROOT)}:{number}", match.group(1), match.group(2).split()))
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
    documented = [
        (where, name, [word.split("=")[0] for word in words if word.startswith("--")])
        for where, name, words in documented_commands()
    ]
    commands = documented + suite_commands()
    assert len({name for _, name, _ in commands}) == len(ALL), "a file with no command found"
    known = {name: flags_of(name) for name in ALL}
    unknown = [(where, name, flag) for where, name, flags in commands for flag in flags if flag not in known[name]]
    assert not unknown, unknown


@functools.lru_cache(maxsize=None)
def algo(name: str):
    """The file as a module, registered in sys.modules: tyro reads the flags' help from the source, which
    inspect finds through it."""
    module = load_algo(name)
    sys.modules[module.__name__] = module
    return module


def parsed(name: str, words: list):
    """What the file's own parser makes of a command's words: its parse_args (with its presets) where it has
    one, tyro's otherwise. A word the parser refuses ends it with SystemExit, as on the command line."""
    module = algo(name)
    saved = sys.argv
    sys.argv = [f"{name}.py", *words]
    try:
        return module.parse_args() if hasattr(module, "parse_args") else tyro.cli(module.RunArgs)
    finally:
        sys.argv = saved


def shell_words(words: list) -> list:
    """A documented command's words as the shell would pass them: `${NAME:-default}` its default, `$NAME` a 1,
    quotes dropped; `"$@"` (the script's own arguments) and placeholders in angle brackets left out."""
    out = []
    for word in words:
        word = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", word.strip("\"'"))
        word = re.sub(r"\$\{?\w+\}?", "1", word)
        if word and word != "$@" and not word.startswith("<") and word != "...":
            out.append(word)
    return out


def test_every_documented_command_parses_with_its_files_own_parser(capsys):
    refused = []
    commands = documented_commands(code_only=True)
    for where, name, words in commands:
        try:
            parsed(name, shell_words(words))
        except SystemExit as exit:
            if exit.code:
                refused.append((where, name, " ".join(words), capsys.readouterr().err.strip().splitlines()[-3:]))
    assert len({name for _, name, _ in commands}) == len(ALL), "a file with no command in a code block"
    assert not refused, "\n".join(map(str, refused))


def learning_values(name: str, args) -> dict:
    """The algorithm's flags (its `Args`) but the seed: what a Pong run learns with (the budget too, over which
    the learning rate anneals)."""
    same_anyway = {"seed"}
    return {
        flag.name: getattr(args, flag.name)
        for flag in fields(algo(name).Args)
        if flag.init and flag.name not in same_anyway
    }


# where the preset holds the values of a later entry: its record names `--preset atari` and the flags it changed
PRESET_ENTRY = {"impala": "impala_ent25"}


def best_recorded_words(runs: list, entry: str) -> list:
    """The command words after the file's path of the entry's best-evaluated run on the 2-core machine."""
    ours = [run for run in runs if run["entry"] == entry and run["machines"] == ["AMD EPYC (2 cores)"]]
    best = max(ours, key=lambda run: -math.inf if run["eval_return_mean"] is None else run["eval_return_mean"])
    return best["command"].split()[2:]


def recorded_pong_command(name: str) -> list:
    """The recorded command of the file's own Pong-v5 entry on the 2-core machine, its best-evaluated run
    (benchmark/results/atari_pong.json: DD-PPO's `ddppo` entry, the 10M-step one); R2D2, which has no Pong result,
    its measured throughput run's (atari_throughput.json). IMPALA's preset is its `impala_ent25` runs': the flags
    that record names beside `--preset atari`, read on top of the explicit values of the file's own entry (the
    preset those runs started from)."""
    results = ROOT / "benchmark" / "results"
    if name == "r2d2":
        return json.loads((results / "atari_throughput.json").read_text())["r2d2"]["command"].split()[2:]
    runs = json.loads((results / "atari_pong.json").read_text())["runs"]
    words = best_recorded_words(runs, name)
    if name in PRESET_ENTRY:
        assert "--preset" not in words, "the file's own record should name its values, not a preset"
        changed = best_recorded_words(runs, PRESET_ENTRY[name])
        at = changed.index("--preset")
        later = words + changed[:at] + changed[at + 2 :]
        # only the flags the later record names may differ from the file's own record
        before, after = learning_values(name, parsed(name, words)), learning_values(name, parsed(name, later))
        named = {word[2:].replace("-", "_") for word in changed if word.startswith("--")}
        assert {flag for flag in after if after[flag] != before[flag]} <= named
        words = later
    return words


@pytest.mark.parametrize("name", ATARI)
def test_the_atari_preset_holds_the_values_of_the_tested_pong_run(name):
    preset = parsed(name, ["--preset", "atari"])
    assert preset.env_id == "Pong-v5" and preset.preset == "atari"
    assert learning_values(name, preset) == learning_values(name, parsed(name, recorded_pong_command(name)))


@pytest.mark.parametrize("name", ATARI)
def test_flags_beside_a_preset_still_apply_and_atari_without_one_warns(name, capsys):
    for words in (["--preset", "atari", "--learning-rate", "0.001"], ["--learning-rate=0.001", "--preset=atari"]):
        args = parsed(name, words)
        assert (args.learning_rate, args.env_id) == (0.001, "Pong-v5")
    # given twice, the last --preset counts, for the values as for the recorded name (as tyro reads it)
    assert (parsed(name, ["--preset=None", "--preset", "atari"]).env_id, args.preset) == ("Pong-v5", "atari")
    twice = parsed(name, ["--preset", "atari", "--preset", "None"])
    assert (twice.env_id, twice.preset) == ("CartPole-v1", None)
    assert "warning" not in capsys.readouterr().err
    assert parsed(name, ["--env-id", "Pong-v5"]).learning_rate == algo(name).Args().learning_rate
    assert "--preset atari" in capsys.readouterr().err
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parsed(name, [])
    assert capsys.readouterr().err == "" and not caught, [str(warning.message) for warning in caught]
    # an unknown preset, and the fields computed at run time, are no flags, with a preset or without
    for words in (["--preset", "mujoco"], ["--preset", "atari", "--world-size", "3"], ["--world-size", "3"]):
        with pytest.raises(SystemExit):
            parsed(name, words)


def test_the_readmes_multi_node_pong_command_trains_with_the_tested_pong_values():
    """README's two-node DD-PPO command on Pong-v5 learns with the values of the Pong run that reached 18
    (benchmark/atari.py's `ddppo` entry; the test above ties that preset to the recorded run)."""
    commands = [
        words for where, name, words in documented_commands() if where.startswith("README.md") and name == "ddppo"
    ]
    pong = [words for words in commands if "--help" not in words and parsed("ddppo", words).env_id == "Pong-v5"]
    assert len(pong) == 1, commands
    entry = [str(word) for word in atari.ENTRIES["ddppo"]]
    tested = parsed(
        "ddppo",
        [word.format(seed=1) for word in entry[entry.index(next(w for w in entry if w.endswith("ddppo.py"))) + 1 :]],
    )
    assert learning_values("ddppo", parsed("ddppo", pong[0])) == learning_values("ddppo", tested)

"""scripts/: one benchmark script per algorithm (each runs dry here), valid shell, and no path that does not exist."""

import re
import subprocess

import pytest
from conftest import ALGOS, ROOT, check_ok, child_env

SCRIPTS = sorted(path for path in (ROOT / "scripts").iterdir() if path.suffix in (".sh", ".sbatch"))
NINE = sorted(path.stem for path in ALGOS.glob("*.py"))
PATH = re.compile(r"(?<![\w$/.])((?:algos|benchmark|scripts|docs|tests)/[\w./-]*\w)")


def test_one_benchmark_script_per_algorithm():
    assert len(NINE) == 9 and all((ROOT / "scripts" / f"{name}.sh").exists() for name in NINE)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_every_path_a_script_names_exists(script):
    """Files it reads exist; a file it writes (after --out) has an existing directory."""
    text = script.read_text()
    for match in PATH.finditer(text):
        path = ROOT / match.group(1)
        written = text[: match.start()].rstrip().endswith("--out")
        assert (path.parent if written else path).exists(), f"{script.name} names {match.group(1)}"
    check_ok(subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True))


@pytest.mark.parametrize("name", NINE)
def test_benchmark_script_runs_dry(name, tmp_path):
    """`scripts/<algo>.sh --dry-run`: every suite and entry it names exists, and the algorithm's file is run."""
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / f"{name}.sh"), "--dry-run"],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    check_ok(proc)
    commands = proc.stdout.strip().splitlines()
    assert commands and any(f"algos/{name}.py" in command for command in commands), proc.stdout

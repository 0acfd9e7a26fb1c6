"""The docs cannot drift from the code: every link in docs/ and README resolves (a file, a heading's anchor, a line
of a file), a link to a line whose text is one code span quotes that line, and the reading guides (docs/diffs.md)
are what algos/ gives now with every hunk explained."""

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmark"))
import reading_guides  # noqa: E402

PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^)\s]+)\)")
LINES = re.compile(r"L(\d+)(?:-L(\d+))?")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces to
    hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set:
    found = set()
    seen = {}
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        match = re.match(r"#{1,6} (.*)", line)
        if match and not in_code:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list:
    """(line number, text, target) of every relative link on the page, outside code blocks."""
    found = []
    in_code = False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        for text, target in LINK.findall(line):
            if not re.match(r"[a-z]+:", target):
                found.append((number, text, target))
    return found


def broken_links(page: Path) -> list:
    """One line per link of the page that does not resolve: no such file, heading or line, or a quoted line that
    does not hold its quote."""
    broken = []
    for number, text, target in links(page):
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        where = f"{page.name}:{number} ({target})"
        if not resolved.exists():
            broken.append(f"{where}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{where}: no such heading")
        elif fragment and resolved.suffix == ".py":
            match = LINES.fullmatch(fragment)
            lines = resolved.read_text().splitlines()
            if not match or int(match.group(1)) > len(lines) or int(match.group(2) or 0) > len(lines):
                broken.append(f"{where}: no such line")
            elif re.fullmatch(r"`[^`]+`", text) and text.strip("`") not in lines[int(match.group(1)) - 1]:
                broken.append(f"{where}: line {match.group(1)} does not hold {text}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_resolves(page):
    broken = broken_links(page)
    assert not broken, "\n".join(broken)


def test_the_link_check_finds_each_kind_of_broken_link(tmp_path):
    (tmp_path / "algos").mkdir()
    (tmp_path / "algos" / "x.py").write_text("import os\n\n\ndef f():\n    return os.sep\n")
    (tmp_path / "other.md").write_text("# A heading: with `code`\n")
    page = tmp_path / "page.md"
    good = "[a](other.md#a-heading-with-code) [`def f(`](algos/x.py#L4-L5) [b](algos/x.py#L1) [c](https://x.org/y)"
    bad = "[a](missing.md) [b](other.md#no-heading) [c](algos/x.py#L9) [`def g(`](algos/x.py#L4)"
    page.write_text(f"{good}\n\n```\n[in code](missing.md)\n```\n{bad}\n")
    found = broken_links(page)
    assert [line.rsplit(": ", 1)[1] for line in found] == [
        "no such file",
        "no such heading",
        "no such line",
        "line 4 does not hold `def g(`",
    ], found


def test_fix_links_moves_a_quote_to_its_line_and_keeps_the_range(tmp_path):
    (tmp_path / "algos").mkdir()
    (tmp_path / "algos" / "x.py").write_text("import os\n\n\ndef f():\n    return os.sep\n")
    text = "see [`def f(`](algos/x.py#L1-L2) and [`nowhere`](algos/x.py#L3)"
    fixed = reading_guides.fix_line_links(text, tmp_path)
    assert fixed == "see [`def f(`](algos/x.py#L4-L5) and [`nowhere`](algos/x.py#L3)"


def test_reading_guides_are_current_and_every_hunk_is_explained():
    problems = reading_guides.problems(reading_guides.PAGE.read_text())
    assert not problems, "\n".join(problems)


def test_the_guides_check_reports_unexplained_and_orphaned_hunks():
    keys = {(a, b, hunk["key"]) for a, b in reading_guides.PAIRS for hunk in reading_guides.hunks(a, b)}
    blank = reading_guides.render("")
    found = reading_guides.problems(blank)
    assert sum(line.startswith("no explanation:") for line in found) == len(keys)
    assert sum(line.startswith("no introduction:") for line in found) == len(reading_guides.PAIRS)
    orphan = blank.replace(
        "## `impala.py`", "<!-- hunk impala seed | impala: gone | seed: gone -->\nOld.\n\n## `impala.py`"
    )
    assert "explains a hunk that no longer exists: impala/seed impala: gone | seed: gone" in reading_guides.problems(
        orphan
    )


def test_ci_runs_the_readme_test_command():
    """.ci/run ends with the command README's "Tests" section gives, so CI runs what a user is told to run."""
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"## Tests\n\n```bash\n(.+)\n```", readme).group(1)
    assert (ROOT / ".ci" / "run").read_text().rstrip().splitlines()[-1] == command

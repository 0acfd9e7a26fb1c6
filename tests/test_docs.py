"""The docs cannot drift from the code: every link in docs/ and README resolves (a file, a heading's anchor, a line
of a file), a link to a line whose text is one code span quotes that line, and the reading guides (docs/diffs.md)
are what algos/ gives now with every hunk explained. The prose is impersonal and points only at what a reader can
open: no first person, no reference to the project's issues, no path that leaves the repository."""

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


# The docs speak impersonally and point only at what a reader can open: no first person, no reference to the
# project's issues (a reader cannot open them), no path that leaves the repository.
FIRST_PERSON = re.compile(r"\bI\b(?=\s+[a-z]|['’])|\b(?i:me|my|mine|we|us|our|ours)\b")
ISSUE_REFERENCE = re.compile(
    r"\bissue\s*#?\d+|\bissues\s*#\d+|\bissues?\s+[\"“]|\b(?:the|this)\s+(?:\w+\s+)?issue\b(?!s)|\bissue['’]s\b",
    re.I,
)
CODE = r"<!--.*?-->|`[^`]*`|\$\$.*?\$\$|\$[^$\n]+\$"
QUOTATION = r"\"[^\"\n]*(?:\n[^\"\n]+)*\"|“[^”]*”"
WEB_LINK = r"\[(?:[^\[\]]|\[[^\]]*\])*\]\([a-z]+:[^)\s]*\)"
INLINE_PATH = re.compile(r"(?<![\w./-])(?:\.\./|/work/)[^\s)`'\"\]>,;]*")


def prose(page: Path, *blanked: str) -> str:
    """The page's text with its fenced code blocks, inline code, comments and maths blanked to spaces, and what
    the other patterns given match; line breaks are kept, so a match's line is that of the page."""
    kept, in_code = [], False
    for line in page.read_text().splitlines():
        fence = line.startswith("```")
        in_code = in_code != fence
        kept.append("" if in_code or fence else line)
    blank = re.compile("|".join((CODE, *blanked)), re.S)
    return blank.sub(lambda match: re.sub(r"[^\n]", " ", match.group(0)), "\n".join(kept))


def matches(page: Path, pattern: re.Pattern, text: str) -> list:
    """(line number, match, "page:line: match in its line") of every match of the pattern in the text (the
    page's prose)."""
    lines = page.read_text().splitlines()
    found = []
    for match in pattern.finditer(text):
        number = text.count("\n", 0, match.start()) + 1
        found.append((match.group(0), f"{page.name}:{number}: {match.group(0)!r} in {lines[number - 1].strip()!r}"))
    return found


def first_person(page: Path) -> list:
    """Every first-person word in the page's prose: I (the capital pronoun before a lower-case word or an
    apostrophe, so neither the identity matrix of N(0, I) nor I/O nor a heading's Part I), and me, my, mine,
    we, us, our, ours in any case but all capitals (US is an abbreviation). Quotations are someone else's words
    and are skipped."""
    found = matches(page, FIRST_PERSON, prose(page, QUOTATION))
    return [where for word, where in found if word == "I" or not word.isupper()]


def issue_references(page: Path) -> list:
    """Every reference in the page's prose to an issue of the project's tracker: issue 25, issue #10, issue
    "Reliability", the issue, the issue's target, the reliability issue. A link to a web page (an upstream
    project's issue) is one a reader can open and is skipped."""
    return [where for _, where in matches(page, ISSUE_REFERENCE, prose(page, WEB_LINK))]


def paths_outside(page: Path, root: Path = ROOT) -> list:
    """Every path of the page that leaves the repository: a relative link whose target resolves outside the
    root, or a path written out (in prose or code, fenced or inline) that starts with ../ (such a path counts
    from the root, where the commands run, so it leaves it) or with /work/."""
    found = []
    for number, _, target in links(page):
        resolved = (page.parent / target.partition("#")[0]).resolve()
        if resolved != root and root not in resolved.parents:
            found.append(f"{page.name}:{number}: link to {target}, outside the repository")
    for number, line in enumerate(page.read_text().splitlines(), 1):
        for match in INLINE_PATH.finditer(LINK.sub(r"\1", line)):
            found.append(f"{page.name}:{number}: path {match.group(0).rstrip('.:')}, outside the repository")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_first_person(page):
    found = first_person(page)
    assert not found, "first person in the prose (write it impersonally):\n" + "\n".join(found)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_reference_to_the_projects_issues(page):
    found = issue_references(page)
    assert not found, "the project's issues, which a reader cannot open (say the fact itself):\n" + "\n".join(found)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_path_leaves_the_repository(page):
    found = paths_outside(page)
    assert not found, "paths a reader cannot open (name or link the upstream file):\n" + "\n".join(found)


def test_the_voice_and_path_checks_find_what_they_forbid_and_nothing_else(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# Readme\n")
    page = tmp_path / "docs" / "page.md"
    allowed = (
        "# Part I\n\nNo I/O; ε ~ N(0, I); $x = I y$; the US; `we ran it` in code; the paper:\n"
        '"we keep it\nfixed"; [PyTorch issue #135712](https://github.com/pytorch/pytorch/issues/135712) and\n'
        "[x](../README.md); the learner issues 2 requests.\n```\nI ran this. issue 25. cd /tmp\n```\n"
    )
    forbidden = (
        "I stopped it. We chose this, as our\nrun showed; mine too; then I\nsent it; I'd say so.\n"
        'The issue\'s target (issue 25, issue #10, issue "Reliability"), the reliability\nissue.\n'
        "Read `../shared/anchors.md` and [a](../../x.md) or /work/main/.\n"
    )
    page.write_text(allowed + forbidden)
    found = first_person(page)
    words = [line.split(": ")[1].split(" in ")[0] for line in found]
    assert words == ["'I'", "'We'", "'our'", "'mine'", "'I'", "'I'"], found
    assert [line.split(":")[1] for line in found] == ["10", "10", "10", "11", "11", "12"], found
    found = issue_references(page)
    assert [line.split(": ")[1].split(" in ")[0] for line in found] == [
        "'The issue'",
        "'issue 25'",
        "'issue #10'",
        "'issue \"'",
        "'the reliability\\nissue'",
    ], found
    assert [line.split(":")[1] for line in found] == ["13", "13", "13", "13", "13"], found
    assert [line.split(": ", 1)[1] for line in paths_outside(page, tmp_path)] == [
        "link to ../../x.md, outside the repository",
        "path ../shared/anchors.md, outside the repository",
        "path /work/main/, outside the repository",
    ]


ALGORITHM_PAGES = [
    ROOT / "docs" / f"{name}.md" for name in ["a3c", "apex", "ddppo", "es", "fedpg", "ga", "impala", "r2d2", "seed"]
]
# docs/conventions.md §9a: the sections of every algorithm page, in order
SHAPE = [
    "Overview",
    "Key equations",
    "Pseudocode",
    "Architecture",
    "Usage",
    "Implementation details",
    "Deviations from the paper",
    "Logged metrics",
    "Results",
    "Reproducibility",
    "Exercises",
    "References",
]


def sections(page: Path) -> dict:
    """The page's `## ` sections, heading -> text, in order, outside code blocks."""
    found = {}
    current = None
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if line.startswith("## ") and not in_code:
            current = line[3:].strip()
            found[current] = ""
        elif current is not None:
            found[current] += line + "\n"
    return found


def shape_problems(page: Path) -> list:
    """What the page lacks of §9a's shape: its sections in order, rendered equations, a pseudocode block with its
    line links, a results table with its provenance line."""
    found = sections(page)
    problems = [] if list(found) == SHAPE else [f"sections {list(found)}, not {SHAPE}"]
    equations = found.get("Key equations", "")
    if "$$" not in equations or "](../algos/" not in equations:
        problems.append("Key equations: no $$ block, or no line link to the function computing it")
    pseudocode = found.get("Pseudocode", "")
    if "```text" not in pseudocode or "](../algos/" not in pseudocode:
        problems.append("Pseudocode: no ```text block, or no line link to its functions")
    results = found.get("Results", "")
    if not re.search(r"^\|.*\|$", results, re.M) or not re.search(r"Provenance:.*\]\(\.\./benchmark/results/", results):
        problems.append("Results: no table, or no `Provenance:` line linking its results file")
    return problems


@pytest.mark.parametrize("page", ALGORITHM_PAGES, ids=lambda p: p.name)
def test_every_algorithm_page_has_the_shape_of_the_conventions(page):
    problems = shape_problems(page)
    assert not problems, f"{page.name}: " + "; ".join(problems)


# a figure in a heading: a number standing alone (not part of a name such as Pong-v5, R2D2 or A3C), other than a
# leading section number ("## 3. Args") or a date ("## 2026-12-02: ...", in the log)
FIGURE = re.compile(r"(?<![\w.-])\d[\d.,]*(?![\w-])|(?<![\w.-])\d[\d.,]*[kKMh%]\b")


def figures_in_headings(page: Path) -> list:
    found = []
    in_code = False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            in_code = not in_code
        match = re.match(r"#{1,6} (?:\d+[a-z]?\. )?(?:\d{4}-\d\d-\d\d: )?(.*)", line)
        if match and not in_code:
            found += [
                f"{page.name}:{number}: {line}" for _ in FIGURE.findall(re.sub(r"`[^`]*`", "", match.group(1)))[:1]
            ]
    return found


@pytest.mark.parametrize("page", [page for page in PAGES if page.name != "diffs.md"], ids=lambda p: p.name)
def test_headings_carry_no_figures(page):
    found = figures_in_headings(page)
    assert not found, "a figure in a heading (put it in the text, so a new run renames no anchor):\n" + "\n".join(found)


def test_the_shape_and_heading_checks_find_what_they_forbid(tmp_path):
    page = tmp_path / "x.md"
    good = [f"## {name}\n" for name in SHAPE]
    good[1] += "$$a = b$$\n[`def f(`](../algos/x.py#L1)\n"
    good[2] += "```text\nloop\n```\n[`f`](../algos/x.py#L1)\n"
    good[8] += "| a | b |\n|---|---|\nProvenance: `cmd`, AMD EPYC, commit `abc`, [f](../benchmark/results/f.json)\n"
    page.write_text("# X\n" + "".join(good) + "### Pong-v5 beside R2D2 and A3C\n## 3. Args\n")
    assert shape_problems(page) == [f"sections {SHAPE + ['3. Args']}, not {SHAPE}"]
    assert figures_in_headings(page) == []
    page.write_text(
        "# X\n## Overview\n### Seed 1: 18 after 1.02M steps\n### Final evaluation over 10 seeds\n## 1,024 workers\n"
    )
    assert len(shape_problems(page)) == 4
    assert [line.split(": ", 1)[0] for line in figures_in_headings(page)] == ["x.md:3", "x.md:4", "x.md:5"]

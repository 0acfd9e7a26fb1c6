"""Reading figures of Python files: the table in docs/conventions.md ("How the files read").

  python benchmark/style_metrics.py algos/*.py ../shared/peers/cleanrl/ppo_atari_envpool.py

Per file: lines; tokens (Python tokens other than comments, newlines and indentation); the longest `main`
(the lines of `def main`, or of the `if __name__ == "__main__":` block of a flat script); the share of code
lines over 100 characters; packed tuple assignments (`a, b, c = x, y, z`: three or more targets given three or
more separate values on one line, not one call's results).

  python benchmark/style_metrics.py --fold algos/*.py

The fold table of docs/conventions.md §1 instead: lines and tokens above the fold line (`# ==== ... infrastructure
...`; in a file without one, everything down to the end of `main`, which a reader passes on the way), lines below
it, the line where `main`'s loop starts, and the longest parameter list of a function above the fold.
"""

import argparse
import ast
import io
import sys
import tokenize

SKIPPED_TOKENS = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}


def token_count(source: str) -> int:
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return sum(1 for token in tokens if token.type not in SKIPPED_TOKENS)


def longest_main(tree: ast.Module) -> int:
    lengths = [0]
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in ("main", "train"):
            lengths.append(node.end_lineno - node.lineno + 1)
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            lengths.append(node.end_lineno - node.lineno + 1)
    return max(lengths)


def packed_tuple_assignments(tree: ast.Module) -> int:
    count = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple):
            if any(isinstance(t, ast.Tuple) and len(t.elts) >= 3 for t in node.targets) and len(node.value.elts) >= 3:
                count += 1
    return count


def figures(path: str) -> dict:
    with open(path) as f:
        source = f.read()
    tree = ast.parse(source)
    lines = source.splitlines()
    code_lines = [line for line in lines if line.strip() and not line.strip().startswith("#")]
    long_lines = [line for line in code_lines if len(line) > 100]
    return {
        "file": path,
        "lines": len(lines),
        "tokens": token_count(source),
        "longest_main": longest_main(tree),
        "long_lines": len(long_lines),
        "long_lines_pct": 100.0 * len(long_lines) / max(1, len(code_lines)),
        "packed_tuples": packed_tuple_assignments(tree),
    }


def fold_figures(path: str) -> dict:
    with open(path) as f:
        source = f.read()
    tree = ast.parse(source)
    lines = source.splitlines()
    folds = [n for n, line in enumerate(lines, 1) if line.startswith("# ====") and "infrastructure" in line.lower()]
    mains = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main"]
    above = folds[0] - 1 if folds else mains[0].end_lineno
    # the loop over updates, at the top of main's body or inside a `with` there (the actors' context)
    body = [inner for node in mains[0].body for inner in (node.body if isinstance(node, ast.With) else [node])]
    loops = [node.lineno for node in body if isinstance(node, (ast.For, ast.While))]
    # the role functions: those between the `roles` rule and the next rule (the maths keeps the paper's symbols)
    rules = [n for n, line in enumerate(lines, 1) if line.startswith("# ----")]
    roles = [n for n in rules if lines[n - 1].rstrip().endswith(" roles")]
    start = roles[0] if roles else 0
    end = min([n for n in rules if n > start] + [above])
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef) and start < n.lineno < end and n.name != "main"]
    widest = max(functions, key=lambda n: len(n.args.args) + len(n.args.kwonlyargs))
    return {
        "file": path,
        "above": above,
        "below": len(lines) - above,
        "tokens_above": token_count("\n".join(lines[:above]) + "\n"),
        "loop_line": loops[0] if loops else None,
        "widest": f"{widest.name} ({len(widest.args.args) + len(widest.args.kwonlyargs)})",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--fold", action="store_true", help="the fold table instead")
    options = parser.parse_args()
    if options.fold:
        print(
            "| file | lines above the fold | lines below | tokens above | main's loop at line | widest parameter list |"
        )
        print("|---|---|---|---|---|---|")
        for path in options.paths:
            row = fold_figures(path)
            print(
                f"| {row['file']} | {row['above']} | {row['below']} | {row['tokens_above'] / 1000:.1f}k "
                f"| {row['loop_line']} | {row['widest']} |"
            )
        return 0
    print("| file | lines | tokens | longest main | code lines > 100 chars | packed tuple assignments |")
    print("|---|---|---|---|---|---|")
    for path in options.paths:
        row = figures(path)
        print(
            f"| {row['file']} | {row['lines']} | {row['tokens'] / 1000:.1f}k | {row['longest_main']} "
            f"| {row['long_lines']} ({row['long_lines_pct']:.0f}%) | {row['packed_tuples']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

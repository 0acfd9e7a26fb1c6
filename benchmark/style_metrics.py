"""Reading figures of Python files: the table in docs/conventions.md ("How the files read").

  python benchmark/style_metrics.py algos/*.py ../shared/peers/cleanrl/ppo_atari_envpool.py

Per file: lines; tokens (Python tokens other than comments, newlines and indentation); the longest `main`
(the lines of `def main`, or of the `if __name__ == "__main__":` block of a flat script); the share of code
lines over 100 characters; packed tuple assignments (`a, b, c = x, y, z`: three or more targets given three or
more separate values on one line, not one call's results).
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    options = parser.parse_args()
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

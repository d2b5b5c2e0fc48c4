"""Code lines a commit adds to spotrun/: no blank lines, comments or docstrings.

    python tools/code_lines.py COMMIT [COMMIT ...]

Prints each commit's change in code lines of spotrun/*.py (renames followed) and the sum;
`git show --numstat` gives the physical lines. Used for the line counts in issue notes.
"""

from __future__ import annotations

import ast
import io
import subprocess
import sys
import tokenize


def code_lines(src: str) -> int:
    """Lines holding code: not blank, not only a comment, not part of a docstring."""
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return 0
    docs: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            docs.update(range(body[0].lineno, body[0].end_lineno + 1))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER}
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type not in skip:
            lines.update(n for n in range(tok.start[0], tok.end[0] + 1) if n not in docs)
    return len(lines)


def _show(rev: str, path: str) -> str:
    out = subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else ""


def commit_delta(commit: str) -> int:
    """The change in code lines of spotrun/*.py that one commit makes."""
    status = subprocess.run(["git", "show", "--name-status", "--format=", "-M", commit, "--",
                             "spotrun"], capture_output=True, text=True, check=True).stdout
    total = 0
    for line in status.splitlines():
        kind, *paths = line.split("\t")
        if not any(p.endswith(".py") for p in paths):
            continue
        old, new = (paths[0], paths[1]) if kind.startswith("R") else (paths[0], paths[0])
        total += code_lines(_show(commit, new)) - code_lines(_show(commit + "^", old))
    return total


def main() -> None:
    """Print each commit's delta and the sum."""
    total = 0
    for commit in sys.argv[1:]:
        delta = commit_delta(commit)
        total += delta
        print(f"{commit} {delta:+d}")
    print(f"sum {total:+d}")


if __name__ == "__main__":
    main()

"""spotrun.torch's imports: no circle, and a lazy import only where it says why (issue 41).

checkpointer.py -> dist.py / sharded.py -> checkpointer.py (for type hints) was a circle;
the lower modules now name what they need (sharded.ShardedState) instead of the class.
"""

from __future__ import annotations

import ast

from import_graph import ROOT, circles_through

TORCH = ROOT / "spotrun" / "torch"


def test_no_import_circle_runs_through_spotrun_torch():
    assert circles_through("spotrun.torch.") == []


def test_an_import_inside_a_function_says_why():
    """Only an optional dependency or a start-up cost, with a comment on it or just above."""
    silent = []
    for path in sorted(TORCH.glob("*.py")):
        lines = path.read_text().splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    near = lines[max(0, node.lineno - 3):node.lineno]
                    if not any("#" in line for line in near):
                        silent.append(f"{path.name}:{node.lineno}")
    assert silent == []

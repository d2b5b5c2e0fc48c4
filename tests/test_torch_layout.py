"""spotrun.torch's imports: no circle, and a lazy import only where it says why (issue 41).

checkpointer.py -> dist.py / sharded.py -> checkpointer.py (for type hints) was a circle;
the lower modules now name what they need (sharded.ShardedState) instead of the class.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCH = ROOT / "spotrun" / "torch"


def _module_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imports(path: Path, files: dict[str, Path]) -> set[str]:
    """spotrun modules the file imports: at the top, in functions, under TYPE_CHECKING alike."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files
                     else node.module for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in files:
                name = name.rpartition(".")[0]
            if name:
                out.add(name)
    return out


def test_no_import_circle_runs_through_spotrun_torch():
    files = {_module_of(p): p for p in (ROOT / "spotrun").rglob("*.py")}
    graph = {m: _imports(p, files) - {m} for m, p in files.items()}
    circles = []
    for start in (m for m in graph if m.startswith("spotrun.torch.")):
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo.extend(graph[m])
        if start in seen:
            circles.append(start)
    assert circles == []


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

"""spotrun's own import graph read from the source (for the layout tests): every import, at
the top, in a function or under TYPE_CHECKING alike."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_of(path: Path) -> str:
    """The dotted module name of a file under the repository root."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def spotrun_modules() -> dict[str, Path]:
    """Every module of the package, by dotted name."""
    return {module_of(p): p for p in (ROOT / "spotrun").rglob("*.py")}


def imports_of(path: Path, files: dict[str, Path]) -> set[str]:
    """The spotrun modules a file imports (`from a.b import c`: a.b.c if it is a module)."""
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


def circles_through(prefix: str) -> list[str]:
    """The modules under `prefix` that reach themselves through spotrun's imports."""
    files = spotrun_modules()
    graph = {m: imports_of(p, files) - {m} for m, p in files.items()}
    circles = []
    for start in (m for m in graph if m.startswith(prefix)):
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo.extend(graph[m])
        if start in seen:
            circles.append(start)
    return sorted(circles)

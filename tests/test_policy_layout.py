"""The deadline policy lives under decide/ and depends on nothing that drives it (issue 26)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import spotrun.decide.policy as policy
from spotrun.decide.policy.markov import MarkovTiersPolicy
from spotrun.decide.policy.reserve import ReservePolicy
from spotrun.decide.policy.spotrun import SpotrunPolicy

from import_graph import circles_through

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, lazily or not (absolute names)."""
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_nothing_under_decide_imports_the_simulator_or_the_daemon():
    # the simulator and the daemon drive the policy; the reverse was an import circle
    # (decide/deadline -> policy -> policy/select -> simulate/engine -> decide/deadline)
    for path in sorted((ROOT / "spotrun" / "decide").rglob("*.py")):
        bad = {m for m in imported_modules(path)
               if m.startswith(("spotrun.simulate", "spotrun.daemon", "spotrun.cli"))}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_no_module_imports_the_old_policy_package():
    users = [p.relative_to(ROOT) for folder in ("spotrun", "bench", "tests")
             for p in (ROOT / folder).rglob("*.py")
             if any(m == "spotrun.policy" or m.startswith("spotrun.policy.")
                    for m in imported_modules(p))]
    assert users == []


def test_the_policy_imports_without_the_simulator():
    code = ("import sys, spotrun.decide.policy; "
            "print(sorted(m for m in sys.modules if m.startswith(('spotrun.simulate', "
            "'spotrun.daemon'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.strip()
    assert out == "[]"


def test_each_policy_lives_in_the_module_of_its_name():
    assert SpotrunPolicy.__module__ == "spotrun.decide.policy.spotrun"
    assert ReservePolicy.__module__ == "spotrun.decide.policy.reserve"
    assert MarkovTiersPolicy.__module__ == "spotrun.decide.policy.markov"
    assert {n: c.name for n, c in policy.POLICIES.items()} == {n: n for n in policy.POLICIES}


def test_no_import_circle_runs_through_decide():
    """Every import, lazy or not, between spotrun's modules: no circle holds a decide/ module
    (catalog.py's lazy import of providers/facts made one through decide/market.py)."""
    circles = circles_through("spotrun.decide")
    assert circles == [], circles

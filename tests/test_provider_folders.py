"""A provider owns its world: one folder under spotrun/providers/, reached from outside only
through its facts (spotrun.providers.facts) and the Provider interface."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import spotrun.providers
from spotrun.providers.base import ProviderFacts
from spotrun.providers.facts import FACTS

ROOT = Path(spotrun.providers.__file__).resolve().parents[1]
PROVIDERS_DIR = ROOT / "providers"
# The local market's own verbs (`spotrun market ...`, the demo that runs on it) may reach it.
ALLOWED = {"cli/market.py", "demo.py"}


def _provider_folders() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules([str(PROVIDERS_DIR)]) if m.ispkg)


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_every_provider_folder_declares_its_facts_and_is_registered() -> None:
    folders = _provider_folders()
    assert folders == sorted(FACTS)
    for name in folders:
        facts = importlib.import_module(f"spotrun.providers.{name}").FACTS
        assert isinstance(facts, ProviderFacts) and FACTS[name] is facts
        assert facts.billing_rules() is not None


def test_no_module_outside_providers_imports_a_provider_folder() -> None:
    inside = [f"spotrun.providers.{name}" for name in _provider_folders()]
    leaks = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("providers/") or rel in ALLOWED:
            continue
        for name in _imports(path):
            if any(name == p or name.startswith(p + ".") for p in inside):
                leaks.append(f"{rel}: {name}")
    assert leaks == []


def test_no_module_outside_providers_asks_which_provider_it_is() -> None:
    asks = []
    names = set(FACTS)
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("providers/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare):
                consts = [c.value for c in [node.left, *node.comparators]
                          if isinstance(c, ast.Constant)]
                if any(v in names for v in consts):
                    asks.append(f"{rel}:{node.lineno}")
    assert asks == []


def test_no_provider_module_imports_decide() -> None:
    # One direction: decide reads what a provider serves and declares; a provider never calls
    # back into decide to build its own market.
    back = [f"{path.relative_to(ROOT).as_posix()}: {name}"
            for path in sorted(PROVIDERS_DIR.rglob("*.py")) for name in _imports(path)
            if name == "spotrun.decide" or name.startswith("spotrun.decide.")]
    assert back == []


def test_no_module_probes_a_provider_for_a_feature() -> None:
    # Features are declared (Provider.features); getattr/hasattr on a provider is a probe.
    probes = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and node.args
                    and "provider" in ast.unparse(node.args[0]).lower()):
                probes.append(f"{rel}:{node.lineno}")
    assert probes == []


def test_reading_the_facts_imports_no_cloud_sdk() -> None:
    # Every verb reads the facts; the SDK comes only with the provider itself.
    out = subprocess.run(
        [sys.executable, "-c", "import sys, spotrun.providers.facts, spotrun.zones; "
         "print(sorted(m for m in ('boto3', 'botocore', 'torch') if m in sys.modules))"],
        capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

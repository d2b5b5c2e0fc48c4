"""docs/architecture.md matches the code: every module, folder and name it shows exists.

Read as a reader reads the page: a path in backticks (`spotrun/daemon/runner.py`,
`spotrun/db/`) is a file or folder of the repository; a short name in a table row
(`quarantine.py`, `policy/`, `market/`) is one of the row's own folders' files; a dotted
name (`spotrun.providers.base.Provider`) imports.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"
TICKED = re.compile(r"`([^`\s]+)`")
# Not modules: the settings file, a spec's file names, data files named by the text.
NOT_MODULES = {"spotrun.toml"}


def _paths_and_names(text: str) -> tuple[set[str], set[str]]:
    """Repository paths and dotted names the page shows in backticks."""
    paths, names = set(), set()
    for token in TICKED.findall(text):
        token = token.rstrip(".,;:")
        if token in NOT_MODULES or "<" in token:   # a placeholder: `providers/<name>/`
            continue
        if token.startswith(("spotrun/", "bench/", "tests/", "configs/")):
            paths.add(token)
        elif re.fullmatch(r"spotrun(\.[A-Za-z_][A-Za-z0-9_]*)+", token) and \
                not token.endswith(".py"):
            names.add(token)
    return paths, names


def _resolves(dotted: str) -> bool:
    """The longest importable module prefix, then attributes for the rest."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_path_the_page_names_exists():
    paths, _ = _paths_and_names(DOC.read_text())
    assert paths, "the page names no module: the parser no longer reads it"
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_every_dotted_name_the_page_shows_imports():
    _, names = _paths_and_names(DOC.read_text())
    missing = sorted(n for n in names if not _resolves(n))
    assert not missing, f"docs/architecture.md shows names that do not import: {missing}"


def _found(token: str, folders: list[Path]) -> bool:
    """A short name is below one of the row's folders (`policy/base.py` may say `base.py`),
    or a path from the package or the repository (`ledger/committed.py`, `bench/policy.py`)."""
    if (REPO / "spotrun" / token).exists() or (REPO / token).exists():
        return True
    name = token.rstrip("/")
    return any((f / token).exists() or any(f.rglob(name)) for f in folders)


def test_each_rows_short_module_names_are_in_the_rows_folders():
    # In "| `spotrun/decide/` | ... `quarantine.py` ... `policy/` |" the short names are the
    # folder's own; a module moved or renamed leaves its row naming a file that is not there.
    missing = []
    for line in DOC.read_text().splitlines():
        if not line.startswith("| `spotrun/"):
            continue
        cells = line.split("|")
        folders = [REPO / t.rstrip("/") for t in TICKED.findall(cells[1])
                   if t.startswith("spotrun/")]
        folders = [f if f.is_dir() else f.parent for f in folders]
        for token in TICKED.findall("|".join(cells[2:])):
            token = token.rstrip(".,;:")
            if "/" in token and token.startswith(("spotrun/", "docs/")):
                continue
            if not re.fullmatch(r"[a-z_][a-z0-9_/]*(\.py|/)", token):
                continue
            if not _found(token, folders):
                missing.append(f"{cells[1].strip()}: {token}")
    assert not missing, f"rows of docs/architecture.md name files their folders lack: {missing}"

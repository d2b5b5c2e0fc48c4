"""No file of the repository holds a merge's conflict markers (a merge once left them in docs)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^(<{7} |>{7} |={7}$)", re.M)


def test_no_tracked_file_holds_conflict_markers():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    found = []
    for name in files:
        path = ROOT / name
        if path.suffix not in {".py", ".md", ".toml", ".yaml", ".yml", ".txt", ".js", ".html",
                               ".css", ".cfg", ".service", ".sh"} and path.name != "Makefile":
            continue
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError):
            continue
        found += [f"{name}:{text.count(chr(10), 0, m.start()) + 1}" for m in MARKER.finditer(text)]
    assert not found, f"conflict markers left by a merge: {found}"

"""Is a process still the one we started? (/proc on Linux; a pid alone may be reused.)"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name; None if there is no such pid."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm may contain spaces or parens: fields start after the last ')'.
    return raw[raw.rfind(")") + 2:].split()


def start_ticks(pid: int) -> int | None:
    """Process start time in clock ticks since boot (/proc/<pid>/stat field 22), or None."""
    f = stat_fields(pid)
    return int(f[19]) if f and len(f) > 19 else None


def is_alive(pid: int | None, ticks: int | None) -> bool:
    """True when pid runs, is not a zombie, and started at `ticks` (so it is not a reused pid)."""
    if not pid:
        return False
    f = stat_fields(pid)
    if not f or f[0] in ("Z", "X"):
        return False
    return ticks is None or int(f[19]) == ticks


def signal_pids(pids: Iterable[int], sig: int) -> int:
    """Send sig to each pid still there (a process may end meanwhile); how many got it."""
    count = 0
    for pid in pids:
        try:
            os.kill(pid, sig)
            count += 1
        except (ProcessLookupError, PermissionError):
            pass
    return count

"""Instance processes: spawn a process group, tell whether it lives, kill all of it.

An "instance" is every process carrying SPOTRUN_INSTANCE_ID=<id> in its environment
(the agent and whatever it starts, even in their own sessions), plus the leader's
process group and descendants. A reclaim kills all of it, as a vanished VM would.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from spotrun.errors import ProviderError
from spotrun.pids import is_alive, signal_pids, start_ticks, stat_fields

INSTANCE_ENV = "SPOTRUN_INSTANCE_ID"


def spawn(argv: list[str], *, cwd: Path, env: dict[str, str],
          log_path: Path) -> subprocess.Popen[bytes]:
    """Start argv as a new session (its own process group), output appended to log_path."""
    try:
        with open(log_path, "ab") as log:
            return subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        raise ProviderError(f"cannot start instance process: {exc}", field="instance_command",
                            value=argv[0]) from None


def _parent(pid: int) -> int | None:
    f = stat_fields(pid)
    return int(f[1]) if f else None


def _pgid(pid: int) -> int | None:
    f = stat_fields(pid)
    return int(f[2]) if f else None


def _has_marker(pid: int, marker: bytes) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def instance_pids(instance_id: str, leader: int | None, leader_ticks: int | None) -> set[int]:
    """Every live process of an instance: marked by env, in the leader's group, or descended."""
    marker = f"{INSTANCE_ENV}={instance_id}".encode()
    me = os.getpid()
    # Group and parent links count only while the leader is verified (pids get reused).
    leader_ok = is_alive(leader, leader_ticks)
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me]
    found: set[int] = {leader} if leader_ok and leader else set()
    for pid in pids:
        if (leader_ok and _pgid(pid) == leader) or _has_marker(pid, marker):
            found.add(pid)
    changed = bool(found)
    while changed:
        # Descendants that left the group and scrubbed the env are still the instance's.
        changed = False
        for pid in pids:
            if pid not in found and _parent(pid) in found:
                found.add(pid)
                changed = True
    return {p for p in found if is_alive(p, None)}


def signal_instance(instance_id: str, leader: int | None, leader_ticks: int | None,
                    sig: signal.Signals) -> int:
    """Send sig to every process of the instance; returns how many were signalled."""
    return signal_pids(instance_pids(instance_id, leader, leader_ticks), sig)

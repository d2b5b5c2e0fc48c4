"""Instance processes: spawn a process group, tell whether it lives, kill all of it.

An "instance" is every process carrying SPOTRUN_INSTANCE_ID=<id> in its environment
(the agent and whatever it starts, even in their own sessions), plus the leader's
process group and descendants. The leader is instance_init.py, a child subreaper: a
process whose parent dies is re-parented to it, so the descendants are all of the
instance whatever its processes do to their environment or session. A reclaim kills all
of it, as a vanished VM would.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from spotrun.errors import ProviderError
from spotrun.pids import is_alive, signal_pids, start_ticks, stat_fields

INSTANCE_ENV = "SPOTRUN_INSTANCE_ID"
INIT = Path(__file__).with_name("instance_init.py")
# How long a kill waits for the instance's processes to die: one in uninterruptible sleep
# (a hung disk) dies only when it leaves it.
KILL_WAIT_S = 5.0
KILL_PAUSE_S = 0.005


def _runnable(program: str, cwd: Path, env: dict[str, str]) -> bool:
    """Whether instance_init could run program (searched as posix_spawnp does)."""
    if os.sep in program:
        path = cwd / program
        return path.is_file() and os.access(path, os.X_OK)
    return shutil.which(program, path=env.get("PATH", os.defpath)) is not None


def spawn(argv: list[str], *, cwd: Path, env: dict[str, str],
          log_path: Path) -> subprocess.Popen[bytes]:
    """Start argv under instance_init as a new session (its own process group), output
    appended to log_path; the Popen is instance_init's, which exits when argv does."""
    # instance_init would start and then fail to run it: refuse the launch here, as before.
    if not argv or not _runnable(argv[0], cwd, env):
        raise ProviderError("cannot start instance process: not found or not executable",
                            field="instance_command", value=argv[0] if argv else "")
    try:
        with open(log_path, "ab") as log:
            return subprocess.Popen([sys.executable, "-I", "-S", str(INIT), *argv], cwd=cwd,
                                    env=env, stdin=subprocess.DEVNULL, stdout=log,
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


def kill_instance(instance_id: str, leader: int | None, leader_ticks: int | None) -> int:
    """SIGKILL every process of the instance, the leader last; returns how many were killed.

    The leader is stopped first, not killed: it cannot react to what follows (an agent
    writing an exit report for a job it sees die), and it outlives the rest, so whatever
    loses its parent meanwhile is re-parented to it and found by the next pass. Passes go
    on until no process but the leader is left (KILL_WAIT_S at most).
    """
    anchor = [leader] if leader and is_alive(leader, leader_ticks) else []
    signal_pids(anchor, signal.SIGSTOP)
    killed: set[int] = set()
    pause = threading.Event()   # never set: a bounded wait between passes
    deadline = time.monotonic() + KILL_WAIT_S
    while True:
        rest = instance_pids(instance_id, leader, leader_ticks) - set(anchor)
        if not rest or time.monotonic() >= deadline:
            break
        signal_pids(rest, signal.SIGKILL)
        killed |= rest
        pause.wait(KILL_PAUSE_S)
    signal_pids(anchor, signal.SIGKILL)
    return len(killed | set(anchor))

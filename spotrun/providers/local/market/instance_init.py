"""The first process of a local instance: what init is to a VM, so the instance ends with it.

The market runs `python -I -S instance_init.py ARGV...` as the instance's leader (its own
session). It starts ARGV (the agent) and is a child subreaper: any process of the instance
whose parent dies is re-parented to it, not to the host's init, so however a process
daemonises (its own session, an empty environment, its parent gone) it stays a
descendant of the leader, and the market's kill finds it by ancestry. When ARGV exits,
every descendant left is killed and reaped before this process exits with ARGV's status,
as a VM's shutdown ends everything on it. SIGTERM, SIGINT and SIGHUP (a terminate sends
SIGTERM to every process of the instance) leave it running: only ARGV's end or SIGKILL
ends it.

Standard library only and run isolated (-I -S): it starts in milliseconds and owes nothing
to the environment it passes on.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading

PR_SET_CHILD_SUBREAPER = 36
KILL_PAUSE_S = 0.005


def become_subreaper() -> bool:
    """Adopt the orphans of every descendant (Linux); False where it cannot."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    return prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def descendants(root: int) -> set[int]:
    """Every live process below root, by /proc's parent links."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="utf-8", errors="replace") as f:
                raw = f.read()
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2:].split()   # the command name may hold ')'
        if len(fields) > 1 and fields[0] not in ("Z", "X"):
            children.setdefault(int(fields[1]), []).append(int(name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            if pid not in found:
                found.add(pid)
                todo.append(pid)
    return found


def kill_descendants() -> None:
    """SIGKILL and reap every descendant until there is no child left: as a subreaper with
    no child, this process has no descendant either (a fork during a pass is caught by the
    next: its parent dies and it is re-parented here)."""
    pause = threading.Event()   # never set: a bounded wait between passes
    while True:
        for pid in descendants(os.getpid()):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                break
        pause.wait(KILL_PAUSE_S)


def _ignore(signum: int, frame: object) -> None:
    """A handler, not SIG_IGN: ARGV must start with the default dispositions."""


def main(argv: list[str]) -> int:
    """Run argv as the instance's first process; returns its exit status (128+N: signal N)."""
    if not argv:
        print("usage: instance_init.py COMMAND [ARGS...]", file=sys.stderr)
        return 2
    become_subreaper()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _ignore)
    try:
        # Python ignores SIGPIPE and SIGXFSZ; the instance's programs get the defaults.
        child = os.posix_spawnp(argv[0], argv, os.environ,
                                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
    except OSError as exc:
        print(f"instance: cannot start {argv[0]}: {exc}", file=sys.stderr, flush=True)
        return 127
    while True:
        pid, status = os.wait()   # adopted orphans are reaped here too
        if pid == child:
            break
    kill_descendants()
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

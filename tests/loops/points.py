"""Test-only hook: where a conformance case interrupts a training script.

A script calls `point("validation", step)` where a real script has that phase. Unless
`LOOPS_POINT="phase:k"` names it, the call returns at once (with `LOOPS_TRACE` set it
first appends "pid phase step" to that file: the reference run's list of arrivals). The
k-th arrival at that phase (counted in each process; the first process to get there
wins, through the `LOOPS_FIRED` file) interrupts the run as `LOOPS_MODE` says:

- `notice`: what the agent does on a reclaim notice (spotrun/agent/child.py): the notice
  file first, then SIGUSR1 to the job's process group. At a phase that lies between
  steps (`HOLDS`) the phase then lasts until the reclaim (a validation, data read or
  disk write longer than any grace); inside a step the script carries on.
- `kill`: SIGKILL to the whole process group (a crash, a reclaim without notice).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

HOLDS = {"validation", "data", "best", "save"}   # phases between steps: held until the kill
HOLD_LIMIT_S = 300.0                               # a held run nobody kills ends by itself
_counts: dict[str, int] = {}


def point(phase: str, step: int | None = None, hold: bool | None = None) -> None:
    """Interrupt the run here if LOOPS_POINT chose this arrival; else return at once.

    hold: whether a notice here holds the phase until the kill (default: phase in HOLDS).
    A framework callback saves only at its own hooks, so its scripts pass False where
    holding would stop the hooks (inside a validation batch the callback saves at the next).
    """
    trace, spec = os.environ.get("LOOPS_TRACE"), os.environ.get("LOOPS_POINT")
    if trace:   # the reference run lists its arrivals: where a case may interrupt
        with open(trace, "a") as f:
            f.write(f"{os.getpid()} {phase} {'-' if step is None else step}\n")
    if not spec:
        return
    name, _, k = spec.partition(":")
    if name != phase:
        return
    _counts[phase] = _counts.get(phase, 0) + 1
    if _counts[phase] != int(k) or not _claim(phase, step):
        return
    if os.environ.get("LOOPS_MODE", "notice") == "kill":
        os.killpg(os.getpgrp(), signal.SIGKILL)
    _notice()
    if (phase in HOLDS) if hold is None else hold:
        threading.Event().wait(HOLD_LIMIT_S)   # the reclaim's SIGKILL ends it long before
        os._exit(3)


def _claim(phase: str, step: int | None) -> bool:
    """True for the one process of this attempt that fires (workers share the file)."""
    try:
        fd = os.open(os.environ["LOOPS_FIRED"], os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return False
    os.write(fd, json.dumps({"phase": phase, "step": step, "pid": os.getpid()}).encode())
    os.close(fd)
    return True


def _notice() -> None:
    """What the agent does on an AWS notice (two minutes ahead): the file, then the signal."""
    # Imported here, not at the top: only the one run that fires pays for the agent's modules.
    from spotrun.agent.child import record_notice
    now = time.time()
    end = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + 120))
    record_notice(Path(os.environ["SPOTRUN_NOTICE_FILE"]), {"action": "terminate", "time": end},
                  seen_wall_s=now, time_scale=1.0)
    os.killpg(os.getpgrp(), signal.SIGUSR1)

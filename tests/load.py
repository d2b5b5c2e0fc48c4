"""Busy loops for the length of a test: users' machines and CI are loaded, so the end-to-end
tests run on a loaded machine too (issue 22). Several loops per core, as on a shared box.

`SPOTRUN_TEST_LOAD_PER_CORE` sets how many loops per core (default 2; 0 turns it off); under
xdist each worker runs its share, so the machine carries that many whichever tests overlap.
By hand, `tools/under-load [-n N] CMD...` runs any command the same way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from types import TracebackType

PER_CORE_ENV = "SPOTRUN_TEST_LOAD_PER_CORE"
# Each loop ends by itself once the process that started it is gone (a killed test run
# leaves no load behind).
SPIN = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass\n"


def default_loops() -> int:
    """Busy loops to run: SPOTRUN_TEST_LOAD_PER_CORE (default 2) per core, shared out among
    the xdist workers (two loaded tests at once must not load the machine twice over)."""
    per_core = float(os.environ.get(PER_CORE_ENV, "2"))
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1))
    if per_core <= 0:
        return 0
    return max(1, round(per_core * (os.cpu_count() or 1) / workers))


class BusyLoad:
    """Start n busy-loop processes on enter; kill them on exit."""

    def __init__(self, loops: int | None = None) -> None:
        self.loops = default_loops() if loops is None else loops
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> "BusyLoad":
        for _ in range(self.loops):
            self.procs.append(subprocess.Popen([sys.executable, "-c", SPIN],
                                               stdin=subprocess.DEVNULL, start_new_session=True))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in self.procs:
            proc.wait()
        self.procs.clear()

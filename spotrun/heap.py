"""The garbage collector in spotrun's long-lived processes (the server, the daemon).

CPython's full collections walk every tracked object, and a server or daemon holds some
100,000 from its imports alone: with them in the heap, a full collection during a status
build at 1,000 jobs took about half the build (0.29-0.42 s against 0.16-0.18 s with them
set aside). Once start-up is done those objects live as long as the process, so they are
moved out of the collector's reach (`gc.freeze`, as CPython's docs describe for long-lived
servers); what the process allocates afterwards is collected as before.
"""

from __future__ import annotations

import gc


def settle_startup_heap() -> int:
    """Collect once, then freeze what survives start-up; how many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()

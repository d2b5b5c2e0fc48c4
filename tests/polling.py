"""The one way tests wait: poll a condition with a deadline (never a fixed sleep)."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable


def wait_for(check: Callable[[], Any], timeout_s: float = 10.0, what: str = "condition",
             interval_s: float = 0.02) -> Any:
    """Poll check() until it returns something truthy; AssertionError at the deadline."""
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        pause.wait(interval_s)

"""The one Clock: wall time as epoch seconds and as a UTC datetime, and monotonic time.

Every part that reads time (daemon loops, the agent, the market, the training library's
last-moment save) takes a Clock, so tests drive timing logic by moving a ManualClock
instead of waiting.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Protocol


class Clock(Protocol):
    """Wall time for timestamps, monotonic time for intervals."""

    def time(self) -> float:
        """Wall-clock seconds since the epoch."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary start; never goes back."""

    def now(self) -> datetime:
        """The wall clock as a UTC datetime."""


class SystemClock:
    """The real clocks."""

    def time(self) -> float:
        """time.time()."""
        return time.time()

    def monotonic(self) -> float:
        """time.monotonic()."""
        return time.monotonic()

    def now(self) -> datetime:
        """datetime.now(UTC)."""
        return datetime.now(timezone.utc)


class ManualClock:
    """A clock tests move by hand (wall and monotonic move together)."""

    def __init__(self, start_s: float = 1_700_000_000.0) -> None:
        self.now_s = start_s

    def time(self) -> float:
        """The current manual time."""
        return self.now_s

    def monotonic(self) -> float:
        """The manual time (monotonic as long as tests only advance it)."""
        return self.now_s

    def now(self) -> datetime:
        """The manual time as a UTC datetime."""
        return datetime.fromtimestamp(self.now_s, timezone.utc)

    def advance(self, seconds: float) -> None:
        """Move the clock forward."""
        self.now_s += seconds

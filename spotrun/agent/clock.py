"""The agent's clocks, passed in so tests can drive timing logic without waiting."""

from __future__ import annotations

from datetime import datetime, timezone

from spotrun.clock import Clock, SystemClock

__all__ = ["Clock", "SystemClock", "iso", "parse_iso"]


def iso(epoch_s: float) -> str:
    """UTC ISO-8601 timestamp of epoch seconds."""
    return datetime.fromtimestamp(epoch_s, timezone.utc).isoformat()


def parse_iso(text: str) -> float | None:
    """Epoch seconds of an ISO-8601 timestamp (naive = UTC); None if unparseable."""
    try:
        dt = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()

"""Dead-man switch: stop the job when the daemon has been silent too long.

The daemon rewrites `daemon/alive.json` ({"ts": iso}). The first copy seen is
aged by its timestamp (a stale file at boot counts as silence); after that any
change of the timestamp counts as a sign of life, measured on the agent's
monotonic clock, so clock skew between daemon and instance cannot fake liveness
or silence once the daemon is seen writing.
"""

from __future__ import annotations

from typing import Any

from spotrun.agent.clock import Clock, parse_iso


class DeadmanSwitch:
    """Tracks the daemon's last sign of life; `expired()` says when to stop."""

    def __init__(self, timeout_s: float, clock: Clock) -> None:
        self.timeout_s = timeout_s
        self.clock = clock
        self._fresh_at = clock.monotonic()   # never seen: silence counts from agent start
        self._last_ts: str | None = None

    def observe(self, alive: dict[str, Any] | None) -> None:
        """Feed the latest alive.json content (None when missing or unreadable)."""
        if not alive or alive.get("ts") is None:
            return
        ts = str(alive["ts"])
        if ts == self._last_ts:
            return
        epoch = parse_iso(ts)
        if epoch is None:
            return
        first = self._last_ts is None
        self._last_ts = ts
        if first:
            age_s = max(0.0, self.clock.time() - epoch)
            self._fresh_at = self.clock.monotonic() - age_s
        else:
            self._fresh_at = self.clock.monotonic()

    def silent_s(self) -> float:
        """Seconds since the daemon's last sign of life."""
        return self.clock.monotonic() - self._fresh_at

    def expired(self) -> bool:
        """True once the silence exceeds the timeout."""
        return self.silent_s() > self.timeout_s

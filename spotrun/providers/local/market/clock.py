"""Market time: starts at the wall time the market first started, runs time_scale times faster
(or, paced, at the rate the market sets while it runs)."""

from __future__ import annotations

import json
from bisect import bisect_right
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from spotrun.clock import Clock, ManualClock, SystemClock


# The market reads only the wall side of the one Clock (spotrun.clock).
WallClock = Clock
__all__ = ["Clock", "ManualClock", "MarketClock", "SystemClock", "WallClock", "aws_time", "to_dt",
           "read_clock_file"]
CLOCK_FILE = "clock.json"   # in the state dir: the clock's epoch, rate and segments


Segment = tuple[float, float, float]   # (wall_s, market_s, rate): from wall_s on, rate x


@dataclass
class MarketClock:
    """Maps wall time to market time and to a (fractional) trace position.

    Without segments the market runs time_scale times faster than the wall from the epoch.
    A paced market (see docs/local-provider.md) changes its rate while it runs: each
    change starts a segment, so market time stays continuous and every past wall time
    maps to the market time it really had (the audit and the bill recompute it later).
    """

    epoch_wall_s: float       # wall time the market first started; market time equals it there
    time_scale: float         # market seconds per wall second (the fast rate)
    start_tick: int           # trace row at the epoch
    tick_s: float             # market seconds per trace row
    wall: WallClock
    segments: list[Segment] = field(default_factory=list)

    def now_s(self) -> float:
        """Market time now, unix seconds."""
        return self.market_s(self.wall.time())

    def rate(self) -> float:
        """Market seconds per wall second now."""
        return self.segments[-1][2] if self.segments else self.time_scale

    def _segment_at_wall(self, wall_s: float) -> Segment:
        i = bisect_right(self.segments, wall_s, key=lambda seg: seg[0]) - 1
        return self.segments[i] if i >= 0 else (self.epoch_wall_s, self.epoch_wall_s,
                                                 self.time_scale)

    def market_s(self, wall_s: float) -> float:
        """Market time at a wall time."""
        w0, m0, rate = self._segment_at_wall(wall_s)
        return m0 + (wall_s - w0) * rate

    def wall_s(self, market_s: float) -> float:
        """Wall time at which the market reaches market_s (at the current rate, if later)."""
        i = bisect_right(self.segments, market_s, key=lambda seg: seg[1]) - 1
        w0, m0, rate = self.segments[i] if i >= 0 else (self.epoch_wall_s, self.epoch_wall_s,
                                                         self.time_scale)
        return w0 + (market_s - m0) / rate

    def set_rate(self, rate: float, wall_s: float) -> bool:
        """Run at rate from wall_s on; True if that changed the rate."""
        if rate == self.rate():
            return False
        self.segments.append((wall_s, self.market_s(wall_s), rate))
        return True

    def position(self, market_s: float) -> float:
        """Trace position (row, fractional) at a market time."""
        return self.start_tick + (market_s - self.epoch_wall_s) / self.tick_s

    def time_of(self, position: float) -> float:
        """Market time at which the trace reaches position."""
        return self.epoch_wall_s + (position - self.start_tick) * self.tick_s

    def to_json(self) -> dict[str, Any]:
        """What clock.json holds: enough for any reader to compute market time offline."""
        return {"epoch_wall_s": self.epoch_wall_s, "time_scale": self.time_scale,
                "start_tick": self.start_tick, "tick_s": self.tick_s,
                "segments": [list(seg) for seg in self.segments]}

    @classmethod
    def from_json(cls, raw: dict[str, Any], wall: WallClock) -> "MarketClock":
        """The clock clock.json describes."""
        return cls(float(raw["epoch_wall_s"]), float(raw["time_scale"]), int(raw["start_tick"]),
                   float(raw["tick_s"]), wall,
                   [(float(w), float(m), float(r)) for w, m, r in raw.get("segments") or []])


def read_clock_file(path: Path, wall: WallClock) -> MarketClock | None:
    """The clock a market wrote to path (clock.json), or None if there is none yet."""
    try:
        return MarketClock.from_json(json.loads(path.read_text(encoding="utf-8")), wall)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def to_dt(ts_s: float) -> datetime:
    """Unix seconds -> aware UTC datetime."""
    return datetime.fromtimestamp(ts_s, tz=timezone.utc)


def to_iso(ts_s: float | None) -> str | None:
    """Unix seconds -> ISO-8601 UTC string (None stays None)."""
    return None if ts_s is None else to_dt(ts_s).isoformat()


def aws_time(ts_s: float) -> str:
    """Second-precision `2017-09-18T08:22:00Z`, as IMDS writes times."""
    return to_dt(int(ts_s)).strftime("%Y-%m-%dT%H:%M:%SZ")

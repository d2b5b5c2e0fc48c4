"""Market time: starts at the wall time the market first started, runs time_scale times faster."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from spotrun.clock import Clock, ManualClock, SystemClock


# The market reads only the wall side of the one Clock (spotrun.clock).
WallClock = Clock
__all__ = ["Clock", "ManualClock", "MarketClock", "SystemClock", "WallClock", "aws_time", "to_dt"]


@dataclass(frozen=True)
class MarketClock:
    """Maps wall time to market time and to a (fractional) trace position."""

    epoch_wall_s: float       # wall time the market first started; market time equals it there
    time_scale: float         # market seconds per wall second
    start_tick: int           # trace row at the epoch
    tick_s: float             # market seconds per trace row
    wall: WallClock

    def now_s(self) -> float:
        """Market time now, unix seconds."""
        return self.market_s(self.wall.time())

    def market_s(self, wall_s: float) -> float:
        """Market time at a wall time."""
        return self.epoch_wall_s + (wall_s - self.epoch_wall_s) * self.time_scale

    def wall_s(self, market_s: float) -> float:
        """Wall time at which the market reaches market_s."""
        return self.epoch_wall_s + (market_s - self.epoch_wall_s) / self.time_scale

    def position(self, market_s: float) -> float:
        """Trace position (row, fractional) at a market time."""
        return self.start_tick + (market_s - self.epoch_wall_s) / self.tick_s

    def time_of(self, position: float) -> float:
        """Market time at which the trace reaches position."""
        return self.epoch_wall_s + (position - self.start_tick) * self.tick_s


def to_dt(ts_s: float) -> datetime:
    """Unix seconds -> aware UTC datetime."""
    return datetime.fromtimestamp(ts_s, tz=timezone.utc)


def to_iso(ts_s: float | None) -> str | None:
    """Unix seconds -> ISO-8601 UTC string (None stays None)."""
    return None if ts_s is None else to_dt(ts_s).isoformat()


def aws_time(ts_s: float) -> str:
    """Second-precision `2017-09-18T08:22:00Z`, as IMDS writes times."""
    return to_dt(int(ts_s)).strftime("%Y-%m-%dT%H:%M:%SZ")

"""Pure interval arithmetic: split a billed span where the price changes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Iterable

from spotrun.errors import BadInputError


@dataclass(frozen=True)
class PricedSpan:
    """A stretch of time billed at one price."""

    start: datetime
    end: datetime
    price_usd_per_hour: float
    source: str

    @property
    def seconds(self) -> float:
        """Length of the span."""
        return (self.end - self.start).total_seconds()

    @property
    def usd(self) -> float:
        """Cost of the span."""
        return self.seconds / 3600.0 * self.price_usd_per_hour


def split_at_prices(start: datetime, end: datetime,
                    points: Iterable[tuple[datetime, float]], *, source: str,
                    fallback_usd_per_hour: float, fallback_source: str) -> list[PricedSpan]:
    """Spans covering [start, end), one per price in effect.

    points are change points (time, price), each holding until the next; the last
    point at or before start gives the opening price, else the fallback does.
    """
    if end < start:
        raise BadInputError("span ends before it starts", field="end", value=end.isoformat())
    if end == start:
        return []
    pts = sorted(points, key=lambda p: p[0])
    price, src = fallback_usd_per_hour, fallback_source
    inside: list[tuple[datetime, float]] = []
    for ts, p in pts:
        if ts <= start:
            price, src = p, source
        elif ts < end:
            inside.append((ts, p))
    spans: list[PricedSpan] = []
    cur = start
    for ts, p in inside:
        if p != price:
            spans.append(PricedSpan(cur, ts, price, src))
            cur, price, src = ts, p, source
    spans.append(PricedSpan(cur, end, price, src))
    return spans


def seconds_between(a: datetime, b: datetime) -> float:
    """b - a in seconds."""
    return (b - a).total_seconds()

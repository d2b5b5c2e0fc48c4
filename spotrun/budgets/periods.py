"""Budget periods: the UTC calendar day, ISO week (Monday 00:00) or month a time falls in.

Periods are read on the provider's clock, the clock the ledger books on (the local
market's runs faster than the wall; on a cloud the two are the same), so a period's
spend is the ledger's rows inside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone


@dataclass(frozen=True)
class Window:
    """One period: its key (`2030-01-31`, `2030-W05`, `2030-01`, `total`) and [start, end)."""

    period: str
    key: str
    start: datetime | None      # None: since ever (total)
    end: datetime | None        # None: never ends (total)

    def phrase(self) -> str:
        """How a reason names it: `this month (2030-01)`, `in total`."""
        if self.period == "total":
            return "in total"
        word = {"day": "today", "week": "this week", "month": "this month"}[self.period]
        return f"{word} ({self.key})"


def window(period: str, now: datetime) -> Window:
    """The period of kind `period` that `now` (provider clock) falls in."""
    t = now.astimezone(timezone.utc) if now.tzinfo else now.replace(tzinfo=timezone.utc)
    day = t.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "total":
        return Window("total", "total", None, None)
    if period == "day":
        return Window("day", day.date().isoformat(), day, day + timedelta(days=1))
    if period == "week":
        start = day - timedelta(days=day.weekday())
        year, week, _ = start.isocalendar()
        return Window("week", f"{year}-W{week:02d}", start, start + timedelta(days=7))
    if period == "month":
        start = day.replace(day=1)
        end = (start + timedelta(days=32)).replace(day=1)
        return Window("month", f"{start.year}-{start.month:02d}", start, end)
    raise ValueError(f"unknown budget period {period!r}")

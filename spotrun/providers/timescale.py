"""Which clock a time is on, asked in one place.

spotrun shows two clocks. The provider's clock bills: attempt starts and ends, notices,
ledger rows and deadlines are on it (`*_market` keys: the local provider's market runs
`time_scale` times faster than the wall; on AWS the two clocks are the same). The wall
clock is when spotrun itself did something: job submitted or updated, events
(`*_wall` keys). Durations and hours in the audit are provider-clock durations.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from spotrun.providers.facts import FACTS


def time_scale(settings: Any) -> float:
    """Provider-clock seconds per wall second for these settings (1.0: real time).

    The provider declares it (spotrun.providers.facts); an unknown provider runs on real time.
    """
    facts = FACTS.get(str(getattr(settings, "provider", "")))
    return facts.time_scale(settings) if facts is not None else 1.0


def clock_label(scale: float) -> str:
    """How a provider-clock column is labelled: `market` (accelerated) or `provider`."""
    return "market" if scale != 1.0 else "provider"


def clock_info(settings: Any) -> dict[str, Any]:
    """The clock facts every JSON view carries, so no time is read on the wrong clock."""
    scale = time_scale(settings)
    return {"provider_clock": clock_label(scale), "time_scale": scale,
            "market_keys": "*_market: the provider's clock (bills; up to x time_scale the wall)",
            "wall_keys": "*_wall: the wall clock (what spotrun did when)"}


def provider_now(settings: Any) -> datetime:
    """The provider clock's reading now, without calling the provider (the market's epoch)."""
    now = datetime.now(timezone.utc)
    if time_scale(settings) == 1.0:
        return now
    facts = FACTS.get(str(getattr(settings, "provider", "")))
    truth = facts.market_truth(settings) if facts is not None else None
    return truth.provider_time(now) if truth is not None else now


class WallToProvider:
    """A wall time on the provider's clock: itself on real time; on the local market, the
    market time it really had (the paced clock's segments); None where no market clock can
    be read. The market's record is read at the first conversion, once."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.real_time = time_scale(settings) == 1.0
        self._truth: Any = None
        self._read = False

    def __call__(self, wall: datetime) -> datetime | None:
        """The provider-clock time of wall (an aware UTC datetime)."""
        if self.real_time:
            return wall
        if not self._read:
            facts = FACTS.get(str(getattr(self.settings, "provider", "")))
            self._truth = facts.market_truth(self.settings) if facts is not None else None
            self._read = True
        return self._truth.provider_time(wall) if self._truth is not None else None

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


def time_scale(settings: Any) -> float:
    """Provider-clock seconds per wall second for these settings (1.0: real time).

    The one lookup of the provider's time scale: the provider's own settings section says
    it (`[local] time_scale`); a provider without one runs on real time.
    """
    section = getattr(settings, str(getattr(settings, "provider", "")), None)
    scale = getattr(section, "time_scale", None)
    return float(scale) if isinstance(scale, (int, float)) and scale > 0 else 1.0


def clock_label(scale: float) -> str:
    """How a provider-clock column is labelled: `market` (accelerated) or `provider`."""
    return "market" if scale != 1.0 else "provider"


def clock_info(settings: Any) -> dict[str, Any]:
    """The clock facts every JSON view carries, so no time is read on the wrong clock."""
    scale = time_scale(settings)
    return {"provider_clock": clock_label(scale), "time_scale": scale,
            "market_keys": "*_market: the provider's clock (bills; x time_scale the wall)",
            "wall_keys": "*_wall: the wall clock (what spotrun did when)"}


def provider_now(settings: Any) -> datetime:
    """The provider clock's reading now, without calling the provider (the market's epoch)."""
    now = datetime.now(timezone.utc)
    if time_scale(settings) == 1.0:
        return now
    from spotrun.audit.market_truth import LocalMarketTruth
    truth = LocalMarketTruth.from_settings(settings)
    return truth.provider_time(now) if truth is not None else now

"""Pools that refused a launch lately, as every cloud provider remembers them."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

log = logging.getLogger("spotrun.providers.capacity")
KEEP = 500   # the newest refusals kept


@dataclass(frozen=True)
class CapacityFailure:
    """One pool that refused a launch."""

    pool: str
    code: str
    at: datetime


def record_capacity(failures: list[CapacityFailure], pool: str, code: str,
                    at: datetime) -> None:
    """Remember that pool refused at `at` (the newest KEEP only)."""
    log.info("no capacity in %s: %s", pool, code)
    failures.append(CapacityFailure(pool=pool, code=code, at=at))
    del failures[:-KEEP]


def pools_cooling(failures: list[CapacityFailure], now: datetime, cooldown_s: float) -> set[str]:
    """Pool keys that refused capacity within the cooldown."""
    return {f.pool for f in failures if (now - f.at).total_seconds() < cooldown_s}

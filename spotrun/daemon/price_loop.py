"""PriceLoop: record spot price change points of the pools active jobs use (PricePoint rows).

The ledger asks the provider for price history itself when it books; these rows are
the daemon's own record, kept for the audit's hindsight model (spotrun.audit.observed)
after the provider's history has aged out (EC2 keeps 90 days).
Only changes are stored: a fetched point whose price equals the last recorded price of
its pool is dropped, so a quiet market adds no rows. Times are the provider's clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

import structlog
from sqlalchemy import func, true
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import select

from spotrun.db import Attempt, Job, PricePoint, session
from spotrun.errors import SpotrunError
from spotrun.providers.base import PricePoint as FeedPoint
from spotrun.providers.base import pools_from_json
from spotrun.states import Market

LOOKBACK_S = 3 * 3600.0      # first fetch of a type (and the furthest back any fetch goes)
RECENT_JOB_S = 3600.0        # wall seconds a finished job's pools stay watched (its tail)

log = structlog.get_logger("spotrun.daemon.price_loop")


class PriceFeed(Protocol):
    """The part of a Provider the loop uses."""

    name: str

    def zones(self) -> list[str]:
        """Zones the provider can launch into."""

    def now(self) -> datetime:
        """The provider's clock."""

    def price_history(self, instance_type: str, zones: list[str], start: datetime,
                      end: datetime) -> list[FeedPoint]:
        """Change points in [start, end] plus the one in effect at start."""


@dataclass
class PriceTick:
    """What one tick did."""

    types: list[str] = field(default_factory=list)
    points_added: int = 0
    errors: list[str] = field(default_factory=list)


class PriceLoop:
    """Each tick: for the instance types of active jobs, fetch and store new change points."""

    name = "prices"

    def __init__(self, engine: Engine, provider: PriceFeed, *,
                 lookback_s: float = LOOKBACK_S, recent_job_s: float = RECENT_JOB_S,
                 owns: Any = None) -> None:
        self.engine = engine
        self.provider = provider
        # Several clouds: one price loop per cloud, over its own attempts' types.
        self.owns = true() if owns is None else owns
        self.lookback_s = lookback_s
        self.recent_job_s = recent_job_s
        self._fetched_until: dict[str, datetime] = {}   # type -> end of the last fetch

    def tick(self, now: datetime | None = None) -> PriceTick:
        """One pass; `now` is the wall clock (finished jobs' grace), fetches use provider time."""
        out = PriceTick(types=self.watched_types(now))
        if not out.types:
            return out
        try:
            zones = sorted(self.provider.zones())
            end = self.provider.now()
        except SpotrunError as exc:
            out.errors.append(str(exc))
            return out
        for itype in out.types:
            try:
                out.points_added += self._record(itype, zones, end)
            except SpotrunError as exc:   # one type's failure must not stop the others
                out.errors.append(f"{itype}: {exc}")
                log.warning("price_history_failed", instance_type=itype, error=str(exc))
        return out

    def watched_types(self, now: datetime | None = None) -> list[str]:
        """Spot instance types that active (or just finished) jobs ran on or were offered."""
        with session(self.engine) as s:
            jobs = list(s.exec(select(Job)))
            recent = None if now is None else now - timedelta(seconds=self.recent_job_s)
            ids = [j.id for j in jobs if not j.state.is_terminal()
                   or (recent is not None and j.updated_at >= recent)]
            if not ids:
                return []
            atts = list(s.exec(select(Attempt).where(Attempt.job_id.in_(ids), self.owns)))
        types: set[str] = set()
        for a in atts:
            if a.market is Market.SPOT:
                types.add(a.instance_type)
            types.update(p.instance_type for p in pools_from_json(a.candidates)
                             if p.market is Market.SPOT)
        return sorted(types)

    def _record(self, itype: str, zones: list[str], end: datetime) -> int:
        with session(self.engine) as s:
            last = dict(s.exec(select(PricePoint.zone, func.max(PricePoint.ts))
                               .where(PricePoint.instance_type == itype)
                               .group_by(PricePoint.zone)).all())
        floor = end - timedelta(seconds=self.lookback_s)
        known = [_aware(last[z]) for z in zones if z in last]
        start = self._fetched_until.get(itype) or (min(known) if len(known) == len(zones)
                                                   else floor)
        start = max(start, floor)
        if start >= end:
            return 0
        points = self.provider.price_history(itype, zones, start, end)
        added = self._insert(itype, points)
        self._fetched_until[itype] = end
        return added

    def _insert(self, itype: str, points: list[FeedPoint]) -> int:
        added = 0
        with session(self.engine) as s:
            for zone in sorted({p.zone for p in points}):
                mine = sorted((p for p in points if p.zone == zone), key=lambda p: p.ts)
                prev = s.exec(select(PricePoint).where(PricePoint.instance_type == itype,
                                                       PricePoint.zone == zone,
                                                       PricePoint.ts <= mine[0].ts)
                              .order_by(PricePoint.ts.desc()).limit(1)).first()
                price = prev.price_usd_per_hour if prev is not None else None
                have = set(s.exec(select(PricePoint.ts).where(
                    PricePoint.instance_type == itype, PricePoint.zone == zone,
                    PricePoint.ts >= mine[0].ts)).all())
                have = {_aware(t) for t in have}
                for p in mine:
                    if p.price_usd_per_hour == price or _aware(p.ts) in have:
                        price = p.price_usd_per_hour
                        continue
                    s.add(PricePoint(instance_type=itype, zone=zone, ts=p.ts,
                                     price_usd_per_hour=p.price_usd_per_hour,
                                     source=self.provider.name))
                    price = p.price_usd_per_hour
                    added += 1
            try:
                s.commit()
            except IntegrityError:
                # Another writer recorded some of them first: the next tick fills the rest.
                s.rollback()
                return 0
        return added


def _aware(t: datetime) -> datetime:
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t


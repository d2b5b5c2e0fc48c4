"""Notice quarantine: no launch into a spot pool that just had an interruption notice.

A notice in a pool (instance type + zone, spot) means the cloud is taking capacity back
there, and a launch into it soon after is often the next instance reclaimed (issue 40: 3 of
60 launches of a 26-hour soak, one 42 s after the daemon's own instance in that zone got its
notice). So for `notice_quarantine_s` after a notice (each provider declares the window in its
facts; docs/cost-model.md, "Notice quarantine") the decision rejects the pool with a `now`
reason; after the window the pool is a candidate again, at the risk the model gives it.

The notices ride on the market snapshot the decision is given (`MarketSnapshot.quarantine`),
so the daemon, `plan` and `submit --dry-run` decide alike on the same inputs. The daemon reads
them from its attempts (`recent_notices`): a recorded notice at its time, and a reclaim that
came without one at the reclaim's time. The simulator counts each reclaim of its trace as a
notice at that tick (decide.policy.market.MarketHistory).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, or_
from sqlmodel import select

from spotrun.db import Attempt, session
from spotrun.states import EndReason, Market


@dataclass(frozen=True)
class PoolNotice:
    """An interruption notice (or a reclaim without one) in a spot pool, provider clock."""

    instance_type: str
    zone: str
    at: datetime


@dataclass(frozen=True)
class Quarantine:
    """The recent notices a decision knows of, and how long each keeps its pool closed."""

    window_s: float = 0.0
    notices: tuple[PoolNotice, ...] = ()

    def notice_in(self, instance_type: str, zone: str, now: datetime) -> PoolNotice | None:
        """The newest notice that closes the spot pool at `now`, or None when it is open.

        A notice closes its pool from its time for `window_s` seconds; one dated after `now`
        (another clock's, e.g. a market that ran ahead of the wall) does not count.
        """
        best: PoolNotice | None = None
        for n in self.notices:
            if n.instance_type != instance_type or n.zone != zone:
                continue
            age_s = (now - n.at).total_seconds()
            if 0.0 <= age_s < self.window_s and (best is None or n.at > best.at):
                best = n
        return best

    def closed(self, now: datetime) -> frozenset[tuple[str, str]]:
        """Every (instance type, zone) closed at `now`."""
        return frozenset((n.instance_type, n.zone) for n in self.notices
                         if self.notice_in(n.instance_type, n.zone, now) is not None)

    def until(self, notice: PoolNotice) -> datetime:
        """When the pool of this notice opens again."""
        return notice.at + timedelta(seconds=self.window_s)


NO_QUARANTINE = Quarantine()


def quarantine_reason(quarantine: Quarantine, notice: PoolNotice) -> str:
    """One pool's rejection: the notice's time and when the pool opens (stable while closed)."""
    return (f"interruption notice in {notice.zone} at {notice.at:%H:%M:%S}: no spot launch "
            f"there for {quarantine.window_s:g} s (until {quarantine.until(notice):%H:%M:%S})")


def recent_notices(engine: Any, now: datetime, window_s: float) -> Quarantine:
    """The notices of every attempt (any job) that may close a pool at `now`, in one query.

    A spot attempt's recorded notice counts at its time (`Attempt.notice_at`, provider clock);
    a reclaim without one counts at the reclaim (`ended_at`): capacity was taken back as
    surely. Times are the provider's, so `now` must be `provider.now()` (the snapshot's `at`).
    """
    if window_s <= 0:
        return Quarantine(window_s)
    since = now - timedelta(seconds=window_s)
    q = select(Attempt.instance_type, Attempt.zone, Attempt.notice_at, Attempt.ended_at).where(
        Attempt.market == Market.SPOT,
        or_(Attempt.notice_at >= since,
            and_(Attempt.notice_at.is_(None), Attempt.end_reason == EndReason.RECLAIMED,
                 Attempt.ended_at >= since)))
    with session(engine) as s:
        rows = list(s.exec(q))
    notices = tuple(PoolNotice(t, z, notice_at or ended_at) for t, z, notice_at, ended_at in rows
                    if (notice_at or ended_at) is not None)
    return Quarantine(window_s, notices)

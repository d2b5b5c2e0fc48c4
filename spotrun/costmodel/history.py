"""Learned inputs: what spotrun has seen per pool (reclaims, restart overheads) and per job (speed).

HistorySource is the seam: DbHistory reads the state database's Attempt rows; StaticHistory
holds figures given in code (simulations, tests); NoHistory means priors only.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable, Protocol, runtime_checkable

from sqlalchemy.engine import Engine
from sqlmodel import select

from spotrun.costmodel.notice_loss import ReclaimRecord
from spotrun.db import Attempt, Job, session
from spotrun.states import EndReason, Market

PoolKey = tuple[str, str]   # (instance_type, zone)


@dataclass(frozen=True)
class PoolStats:
    """Observed on one spot pool, recency-weighted: run hours, reclaims, notices, overheads."""

    run_hours: float = 0.0
    reclaims: float = 0.0
    notices_caught: float = 0.0        # reclaims that had a notice recorded first
    restart_s_total: float = 0.0       # launch -> training running, summed
    restarts: int = 0


@dataclass(frozen=True)
class JobStats:
    """Observed for one job: steps/s per type, blocking seconds per save, its reclaims."""

    steps_per_s: dict[str, float] = field(default_factory=dict)
    checkpoint_save_s: float | None = None
    reclaims: tuple[ReclaimRecord, ...] = ()   # its reclaimed spot attempts, oldest first


@runtime_checkable
class HistorySource(Protocol):
    """Where the cost model reads spotrun's own history."""

    def pool_stats(self, now: datetime, half_life_h: float) -> dict[PoolKey, PoolStats]:
        """Per (type, zone): spot exposure and reclaims, older rows weighing less."""

    def job_stats(self, job_id: str) -> JobStats:
        """The job's measured speed per type and checkpoint cost."""


class NoHistory:
    """No history yet: the model uses priors only."""

    def pool_stats(self, now: datetime, half_life_h: float) -> dict[PoolKey, PoolStats]:
        """Nothing observed."""
        return {}

    def job_stats(self, job_id: str) -> JobStats:
        """Nothing measured."""
        return JobStats()


@dataclass
class StaticHistory:
    """History given as figures (the simulator's own observations, tests)."""

    pools: dict[PoolKey, PoolStats] = field(default_factory=dict)
    jobs: dict[str, JobStats] = field(default_factory=dict)

    def pool_stats(self, now: datetime, half_life_h: float) -> dict[PoolKey, PoolStats]:
        """The figures as given (already weighted)."""
        return dict(self.pools)

    def job_stats(self, job_id: str) -> JobStats:
        """The job's figures, or none."""
        return self.jobs.get(job_id, JobStats())


def _weight(age_h: float, half_life_h: float) -> float:
    if half_life_h <= 0:
        return 1.0
    return math.pow(2.0, -max(age_h, 0.0) / half_life_h)


class DbHistory:
    """History from the state database (spotrun.db Attempt rows), one query per call."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def pool_stats(self, now: datetime, half_life_h: float) -> dict[PoolKey, PoolStats]:
        """Spot attempts that ran: hours from started_at to ended_at (or now), RECLAIMED ends.

        Times are the provider's clock (started_at/ended_at/running_at); `now` must be too.
        Restart overhead = running_at - started_at (boot, setup and restore), any market.
        """
        acc: dict[PoolKey, list[float]] = {}
        # Columns, not Attempt objects: a submit's check reads every attempt ever run, and
        # building ORM objects for 1,000s of them was most of a submit's time.
        cols = (Attempt.instance_type, Attempt.zone, Attempt.started_at, Attempt.ended_at,
                Attempt.running_at, Attempt.market, Attempt.end_reason, Attempt.notice_at)
        with session(self.engine) as s:
            rows = list(s.exec(select(*cols).where(Attempt.started_at.is_not(None))))
        for a in rows:
            key = (a.instance_type, a.zone)
            hrs, recl, caught, rs, rn = acc.setdefault(key, [0.0, 0.0, 0.0, 0.0, 0.0])
            end = a.ended_at or now
            running_at = a.running_at
            if running_at is not None and running_at >= a.started_at:
                rs += (running_at - a.started_at).total_seconds()
                rn += 1
            if a.market is Market.SPOT:
                w = _weight((now - end).total_seconds() / 3600.0, half_life_h)
                hrs += w * max((end - a.started_at).total_seconds(), 0.0) / 3600.0
                if a.end_reason is EndReason.RECLAIMED:
                    recl += w
                    if a.notice_at is not None:
                        caught += w
            acc[key] = [hrs, recl, caught, rs, rn]
        return {k: PoolStats(run_hours=v[0], reclaims=v[1], notices_caught=v[2],
                             restart_s_total=v[3], restarts=int(v[4])) for k, v in acc.items()}

    def job_stats(self, job_id: str) -> JobStats:
        """Latest measured steps/s per type (newest attempt wins), checkpoint cost, reclaims."""
        with session(self.engine) as s:
            rows = list(s.exec(select(Attempt).where(Attempt.job_id == job_id)
                               .order_by(Attempt.number)))
            job = s.get(Job, job_id)
        speeds: dict[str, float] = {}
        save_s: float | None = None
        for a in rows:
            sps = a.steps_per_s
            if sps is not None and sps > 0:
                speeds[a.instance_type] = float(sps)
            cs = a.checkpoint_save_s   # per-save blocking seconds, from the heartbeats
            if cs is not None and cs >= 0:
                save_s = float(cs)
        return JobStats(steps_per_s=speeds, checkpoint_save_s=save_s,
                        reclaims=reclaim_records(rows, job.last_step if job else None))


class SharedHistory(DbHistory):
    """DbHistory whose pool stats are read at most once per max_age_s of wall time and shared
    (the team server: a check of every submit read every attempt ever run, most of a
    submit's time under 20 clients). Weights then lag by at most that age: with half-lives
    of hours, a second changes none of them."""

    def __init__(self, engine: Engine, max_age_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(engine)
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._pools: dict[float, tuple[float, dict[PoolKey, PoolStats]]] = {}

    def pool_stats(self, now: datetime, half_life_h: float) -> dict[PoolKey, PoolStats]:
        """The last reading for this half-life if younger than max_age_s, else a new one."""
        t = self._clock()
        with self._lock:
            hit = self._pools.get(half_life_h)
            if hit is not None and t - hit[0] <= self.max_age_s:
                return hit[1]
        stats = super().pool_stats(now, half_life_h)
        with self._lock:
            self._pools[half_life_h] = (t, stats)
        return stats


def reclaim_records(attempts: list[Attempt], job_step: int | None) -> tuple[ReclaimRecord, ...]:
    """The job's reclaimed spot attempts (in number order) and where the job went on from.

    After an attempt the job went on from the next attempt's start once that one reported
    anything; after the newest attempt, from the job's own step (its newest verified save).
    """
    out: list[ReclaimRecord] = []
    for i, a in enumerate(attempts):
        if a.market is not Market.SPOT or a.end_reason is not EndReason.RECLAIMED:
            continue
        nxt = attempts[i + 1] if i + 1 < len(attempts) else None
        if nxt is None:
            resumed = job_step
        elif nxt.start_step > 0 or nxt.last_step > 0 or nxt.running_at is not None:
            resumed = nxt.start_step
        else:
            resumed = None
        out.append(ReclaimRecord(notice_seen=a.notice_at is not None, start_step=a.start_step,
                                 reached_step=a.last_step, resumed_step=resumed,
                                 steps_per_s=a.steps_per_s))
    return tuple(out)

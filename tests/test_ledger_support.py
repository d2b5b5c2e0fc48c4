"""Shared helpers for the ledger, audit and budget tests (real SQLite, hand-set prices).

The price feed is the one edge these tests cannot reach (AWS price history), so a
small in-process feed with change points set by hand stands in for it; every other
part is the real code on a real database file.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from sqlmodel import select

from spotrun.db import Attempt, Job, SpendEntry, open_db, session
from spotrun.providers.base import InstanceInfo, PricePoint
from spotrun.states import AttemptState, EndReason, JobState, Market

T0 = datetime(2023, 2, 15, 12, 0, tzinfo=timezone.utc)
P3 = "p3.2xlarge"
ZONE = "us-east-1a"
OD_P3 = 3.06   # catalog on-demand USD/h of p3.2xlarge, us-east-1


def at(minutes: float = 0.0, seconds: float = 0.0) -> datetime:
    """T0 plus an offset."""
    return T0 + timedelta(minutes=minutes, seconds=seconds)


class PriceFeed:
    """A provider's price side with hand-set change points, and a settable clock."""

    def __init__(self, name: str = "local", now: datetime = T0) -> None:
        self.name = name
        self.clock = now
        self.points: dict[tuple[str, str], list[tuple[datetime, float]]] = {}
        self.instances: dict[str, InstanceInfo] = {}
        self.history_calls = 0

    def set_prices(self, instance_type: str, zone: str, pts: list[tuple[datetime, float]]) -> None:
        """Change points for one pool."""
        self.points[(instance_type, zone)] = sorted(pts)

    def now(self) -> datetime:
        """The provider clock."""
        return self.clock

    def spot_price(self, instance_type: str, zone: str) -> float | None:
        """Price in effect now."""
        pts = [p for t, p in self.points.get((instance_type, zone), []) if t <= self.clock]
        return pts[-1] if pts else None

    def on_demand_price(self, instance_type: str) -> float:
        """Catalog price (p3.2xlarge only here)."""
        return {P3: OD_P3}[instance_type]

    def price_history(self, instance_type: str, zones: list[str], start: datetime,
                      end: datetime) -> list[PricePoint]:
        """Change points in [start, end] plus the one in effect at start."""
        self.history_calls += 1
        out = []
        for z in zones:
            pts = self.points.get((instance_type, z), [])
            before = [(t, p) for t, p in pts if t <= start]
            inside = [(t, p) for t, p in pts if start < t <= end]
            for t, p in before[-1:] + inside:
                out.append(PricePoint(instance_type, z, t, p))
        return out

    def describe(self, *, job_id: str | None = None,
                 instance_ids: list[str] | None = None) -> list[InstanceInfo]:
        """Instances whose state a test has set."""
        return [i for k, i in self.instances.items() if not instance_ids or k in instance_ids]


def new_db(tmp_path):
    """A real SQLite database file under tmp_path."""
    return open_db(f"sqlite:///{tmp_path / 'spotrun.db'}")


def make_job(engine, job_id: str = "job-1", *, budget_usd: float | None = None,
             state: JobState = JobState.RUNNING, work: dict | None = None,
             store_uri: str = "file:///nonexistent/store", checkpoint_uri: str | None = None,
             last_step: int = 0) -> Job:
    """Insert a job row."""
    spec = {"name": job_id, "command": "true", "work": work or {},
            "policy": {"market": "auto", "budget_usd": budget_usd}}
    job = Job(id=job_id, name=job_id, state=state, spec_json=json.dumps(spec),
              store_uri=store_uri,
              checkpoint_uri=checkpoint_uri or f"{store_uri}/jobs/{job_id}/checkpoints",
              budget_usd=budget_usd, last_step=last_step,
              total_steps=(work or {}).get("total_steps"),
              created_at=T0)
    with session(engine) as s:
        s.add(job)
        s.commit()
    return job


def make_attempt(engine, job_id: str, number: int, *, start: datetime | None,
                 end: datetime | None = None, reason: EndReason | None = None,
                 market: Market = Market.SPOT, price: float = 0.9, start_step: int = 0,
                 last_step: int = 0, running_at: datetime | None = None,
                 stall_s: float | None = None, instance_type: str = P3) -> Attempt:
    """Insert an attempt row as the daemon writes it."""
    a = Attempt(job_id=job_id, number=number, market=market, instance_type=instance_type,
                zone=ZONE, price_usd_per_hour=price, client_token=f"{job_id}-{number}",
                instance_id=f"i-{job_id}-{number}", started_at=start, ended_at=end,
                end_reason=reason,
                state=AttemptState.ENDED if end else AttemptState.RUNNING,
                start_step=start_step, last_step=last_step, running_at=running_at,
                checkpoint_stall_s=stall_s)
    with session(engine) as s:
        s.add(a)
        s.commit()
        s.refresh(a)
    return a


def end_attempt(engine, attempt_id: int, end: datetime, reason: EndReason,
                last_step: int | None = None) -> None:
    """Record an attempt's end, as the reconcile loop does."""
    with session(engine) as s:
        a = s.get(Attempt, attempt_id)
        a.ended_at, a.end_reason, a.state = end, reason, AttemptState.ENDED
        if last_step is not None:
            a.last_step = last_step
        s.add(a)
        s.commit()


def rows_of(engine, job_id: str | None = None) -> list[SpendEntry]:
    """Ledger rows, in booking order."""
    with session(engine) as s:
        q = select(SpendEntry).order_by(SpendEntry.id)
        if job_id:
            q = q.where(SpendEntry.job_id == job_id)
        return list(s.exec(q))


def total_usd(engine, job_id: str | None = None) -> float:
    """Sum of raw ledger rows."""
    return sum(r.usd for r in rows_of(engine, job_id))

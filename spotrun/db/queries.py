"""Reads and writes on the state database that every part shares: one job, its attempts and
nodes, an event appended; and the bulk reads that build every job's view in a fixed number of
queries."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable, Iterator, Sequence

from sqlmodel import Session, select

from spotrun.db.models import Attempt, AttemptNode, Event, Job, PricePoint, SpendEntry, utcnow
from spotrun.errors import NotFoundError
from spotrun.secrets import redact_tokens

def add_event(s: Session, job_id: str, kind: str, detail: str = "", *,
              attempt_id: int | None = None, ts: datetime | None = None) -> Event:
    """Append one event to a job's history (caller commits)."""
    ev = Event(job_id=job_id, attempt_id=attempt_id, kind=kind, detail=redact_tokens(detail),
               ts=ts or utcnow())
    s.add(ev)
    return ev


def find_job(s: Session, ref: str) -> Job | None:
    """A job by exact id, else by unique name (newest first)."""
    job = s.get(Job, ref)
    if job is not None:
        return job
    rows = s.exec(select(Job).where(Job.name == ref).order_by(Job.created_at.desc())).all()
    return rows[0] if rows else None


def job_named(s: Session, ref: str) -> Job:
    """find_job, or NotFoundError naming JOB (what every verb that takes a job says)."""
    job = find_job(s, ref)
    if job is None:
        raise NotFoundError("no such job", field="JOB", value=ref, hint="see `spotrun status`")
    return job


def attempts_of(s: Session, job_id: str) -> list[Attempt]:
    """A job's attempts in launch order."""
    return list(s.exec(select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.number)))


def nodes_of(s: Session, attempt_id: int) -> list[AttemptNode]:
    """A multi-node attempt's node rows (replacements included), by rank then launch order."""
    return list(s.exec(select(AttemptNode).where(AttemptNode.attempt_id == attempt_id)
                       .order_by(AttemptNode.node_rank, AttemptNode.id)))


def iter_jobs(s: Session) -> Iterator[Job]:
    """All jobs, oldest first."""
    yield from s.exec(select(Job).order_by(Job.created_at))


# ---------------------------------------------------------------- bulk reads
# The read views (status, audit, the dashboard, /metrics) build every job's view from a
# fixed number of queries, one per table, never one per job (issue 24).

# A longer id list reads the whole table instead: SQLite caps bound parameters per statement.
MAX_IN_IDS = 500


def where_ids(q: Any, column: Any, ids: Sequence[Any] | None) -> Any:
    """q restricted to ids (None or a long list: every row; callers look their ids up)."""
    if ids is not None and len(ids) <= MAX_IN_IDS:
        q = q.where(column.in_(list(ids)))
    return q


def jobs_by_ref(s: Session, refs: Sequence[str]) -> list[Job | None]:
    """Each ref's job as find_job resolves it (None: no such job), ids in one query."""
    by_id = {j.id: j for j in s.exec(where_ids(select(Job), Job.id, sorted(set(refs))))}
    return [by_id.get(r) or find_job(s, r) for r in refs]


def attempts_by_job(s: Session, job_ids: Sequence[str] | None = None) -> dict[str, list[Attempt]]:
    """Jobs' attempts in launch order, in one query (job_ids None: every job's)."""
    if job_ids is not None and not job_ids:
        return {}
    out: dict[str, list[Attempt]] = {}
    q = where_ids(select(Attempt), Attempt.job_id, job_ids).order_by(Attempt.job_id,
                                                                    Attempt.number)
    for a in s.exec(q):
        out.setdefault(a.job_id, []).append(a)
    return out


def nodes_by_attempt(s: Session, job_ids: Sequence[str] | None = None
                     ) -> dict[int, list[AttemptNode]]:
    """Jobs' node rows by attempt id, each list ordered as nodes_of orders it, in one query."""
    if job_ids is not None and not job_ids:
        return {}
    out: dict[int, list[AttemptNode]] = {}
    q = where_ids(select(AttemptNode), AttemptNode.job_id, job_ids).order_by(
        AttemptNode.attempt_id, AttemptNode.node_rank, AttemptNode.id)
    for n in s.exec(q):
        out.setdefault(n.attempt_id, []).append(n)
    return out


def spend_rows_by_job(s: Session, job_ids: Sequence[str] | None = None
                      ) -> dict[str, list[SpendEntry]]:
    """Jobs' ledger rows ordered by end then id, in one query."""
    if job_ids is not None and not job_ids:
        return {}
    out: dict[str, list[SpendEntry]] = {}
    q = where_ids(select(SpendEntry), SpendEntry.job_id, job_ids).order_by(SpendEntry.end,
                                                                           SpendEntry.id)
    for r in s.exec(q):
        out.setdefault(r.job_id, []).append(r)
    return out


def events_by_job(s: Session, job_ids: Sequence[str] | None = None, *,
                  kind: str | None = None) -> dict[str, list[Event]]:
    """Jobs' events (of one kind, if given) in the order written, in one query."""
    if job_ids is not None and not job_ids:
        return {}
    out: dict[str, list[Event]] = {}
    q = where_ids(select(Event), Event.job_id, job_ids)
    if kind is not None:
        q = q.where(Event.kind == kind)
    for e in s.exec(q.order_by(Event.id)):
        out.setdefault(e.job_id, []).append(e)
    return out


def price_points_by_pool(s: Session, instance_types: Iterable[str]
                         ) -> dict[tuple[str, str], list[PricePoint]]:
    """Recorded price points of these instance types by (type, zone), oldest first, one query."""
    types = sorted(set(instance_types))
    if not types:
        return {}
    out: dict[tuple[str, str], list[PricePoint]] = {}
    q = select(PricePoint).where(PricePoint.instance_type.in_(types)).order_by(
        PricePoint.ts, PricePoint.id)
    for p in s.exec(q):
        out.setdefault((p.instance_type, p.zone), []).append(p)
    return out


@dataclass
class JobRows:
    """One job's rows of every table a read view needs, read in bulk (`rows_by_job`)."""

    attempts: list[Attempt] = field(default_factory=list)
    nodes: dict[int, list[AttemptNode]] = field(default_factory=dict)   # by attempt id
    spend: list[SpendEntry] = field(default_factory=list)
    waiting: list[Event] | None = None      # "waiting" events; None = not read
    prices: "PricePointsOnce | None" = None  # shared by every job of one read

    def nodes_of(self, attempt_id: int | None) -> list[AttemptNode]:
        """An attempt's node rows (as nodes_of orders them)."""
        return self.nodes.get(attempt_id or -1, [])


class PricePointsOnce:
    """Recorded price points of a set of instance types, read on first use in one query."""

    def __init__(self, instance_types: Iterable[str]) -> None:
        self.types = set(instance_types)
        self._by_pool: dict[tuple[str, str], list[PricePoint]] | None = None

    def of(self, s: Session, instance_type: str, zone: str) -> list[PricePoint]:
        """The pool's points, oldest first."""
        if instance_type not in self.types:   # a type not announced up front: its own query
            return list(s.exec(select(PricePoint).where(
                PricePoint.instance_type == instance_type, PricePoint.zone == zone)
                .order_by(PricePoint.ts, PricePoint.id)))
        if self._by_pool is None:
            self._by_pool = price_points_by_pool(s, self.types)
        return self._by_pool.get((instance_type, zone), [])


def _multi(a: Attempt) -> bool:
    """spotrun.daemon.nodes.is_multi (that module imports this one)."""
    return (a.nodes or 1) > 1 or a.nodes_min is not None


def rows_by_job(s: Session, job_ids: Sequence[str] | None = None, *,
                spend: bool = True) -> dict[str, JobRows]:
    """Attempts, nodes and (if asked) ledger rows of these jobs (None: all), a query each."""
    out: dict[str, JobRows] = {}
    for jid, atts in attempts_by_job(s, job_ids).items():
        out.setdefault(jid, JobRows()).attempts = atts
    if any(_multi(a) for r in out.values() for a in r.attempts):
        nodes = nodes_by_attempt(s, job_ids)
        for r in out.values():
            r.nodes = {a.id: nodes.get(a.id, []) for a in r.attempts if _multi(a)}
    if spend:
        for jid, rows in spend_rows_by_job(s, job_ids).items():
            out.setdefault(jid, JobRows()).spend = rows
    return out

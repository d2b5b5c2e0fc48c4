"""The daemon's spend loop: book instance time and storage, and stop jobs before the budget.

`tick(now)` is safe to run any number of times and to crash in: every attempt is
booked in its own transaction together with its watermark. Booking uses the
provider's clock (`provider.now()`, instance launch/end times); `now` is the wall
time of the tick, recorded as `booked_at` and on events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import structlog
from sqlalchemy import String, cast, literal, or_, true
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlmodel import select

from spotrun.daemon.nodes import is_multi
from spotrun.db import Attempt, AttemptNode, Job, LedgerMark, session, utcnow
from spotrun.errors import SpotrunError
from spotrun.ledger.booking import BookingConflict, book_attempt, instance_times
from spotrun.ledger.budget import budget_check, job_budget_usd, request_budget_stop
from spotrun.ledger.committed import committed_by_attempt
from spotrun.ledger.intervals import seconds_between
from spotrun.ledger.stopmargin import StopMargin
from spotrun.providers.billing_rules import BillingRules
from spotrun.providers.facts import rules_for
from spotrun.ledger.storage import StoreOpener, book_storage, measure_job_storage, storage_key
from spotrun.providers.base import InstanceInfo, Provider
from spotrun.states import AttemptState, JobState, NodeState
from spotrun.store import open_store

_TERMINAL_JOBS = [s for s in JobState if s.is_terminal()]


@dataclass
class SpendTick:
    """What one tick did."""

    rows_booked: int = 0
    attempts_closed: list[int] = field(default_factory=list)
    stop_jobs: list[str] = field(default_factory=list)   # newly flagged for a budget stop
    errors: list[str] = field(default_factory=list)


class SpendLoop:
    """Books spend each tick and flags jobs whose budget the next stretch would pass."""

    name = "spend"

    def __init__(self, engine: Engine, provider: Provider, *, rules: BillingRules | None = None,
                 store_opener: StoreOpener = open_store, volume_gb: float = 0.0,
                 min_book_s: float = 60.0, storage_interval_s: float = 600.0,
                 stop_margin: StopMargin | None = None, log: Any = None,
                 owns: Any = None, books_storage: bool = True) -> None:
        self.engine = engine
        self.provider = provider
        # Several clouds: one spend loop per cloud books its own attempts (its provider's
        # prices and billing rules); the home cloud's books the jobs' storage.
        self.owns = true() if owns is None else owns
        self.books_storage = books_storage
        self.rules = rules or rules_for(provider.name)
        self.store_opener = store_opener
        self.volume_gb = volume_gb
        self.min_book_s = min_book_s                 # provider seconds between running bookings
        self.storage_interval_s = storage_interval_s  # provider seconds between store listings
        # Provider seconds to checkpoint and stop, read each check (it follows measured stops).
        self.stop_margin = stop_margin or StopMargin()
        self.log = log or structlog.get_logger("spotrun.daemon.spend")

    def tick(self, now: datetime | None = None) -> SpendTick:
        """One pass: book attempts, then storage, then check budgets."""
        wall = now or utcnow()
        pnow = self.provider.now()
        out = SpendTick()
        self._book_attempts(pnow, wall, out)
        self._book_storage(pnow, wall, out)
        self._check_budgets(pnow, wall, out)
        return out

    # ------------------------------------------------------------ attempts

    def _open_attempts(self) -> list[tuple[Attempt, LedgerMark | None]]:
        key = literal("attempt:") + cast(Attempt.id, String)
        q = (select(Attempt, LedgerMark).outerjoin(LedgerMark, LedgerMark.key == key)
             .where(or_(LedgerMark.closed.is_(None), LedgerMark.closed == False),  # noqa: E712
                    self.owns)
             .order_by(Attempt.id))
        with session(self.engine) as s:
            rows = list(s.exec(q))
        # A launch still in flight has nothing billable yet; a multi-node attempt is booked
        # instance by instance (_book_nodes).
        return [(a, m) for a, m in rows if not is_multi(a)
                and (a.instance_id or a.started_at or a.state is AttemptState.ENDED)]

    def _due(self, att: Attempt, mark: LedgerMark | None, times: Any, pnow: datetime) -> bool:
        """Whether booking att now would write anything (else the pass skips it unopened)."""
        if times.end is not None or att.state is AttemptState.ENDED:
            return True
        if times.start is None:
            return False
        since = mark.booked_until if mark is not None else times.start
        return seconds_between(since, pnow) >= self.min_book_s

    def _describe(self, attempts: list[Attempt]) -> dict[str, InstanceInfo]:
        ids = sorted({a.instance_id for a in attempts if a.instance_id})
        if not ids:
            return {}
        try:
            return {i.instance_id: i for i in self.provider.describe(instance_ids=ids)}
        except SpotrunError as exc:
            # Book from the attempt rows alone; seconds booked past an unseen end are
            # reversed once the end is known.
            self.log.warning("spend_describe_failed", error=str(exc))
            return {}

    def _book_attempts(self, pnow: datetime, wall: datetime, out: SpendTick) -> None:
        attempts = self._open_attempts()
        nodes = self._open_nodes()
        infos = self._describe([a for a, _ in attempts] + [a for a, _, _ in nodes])
        if infos:
            # Read the clock again: an instance may have ended while describe ran, and an
            # end the provider reports must never lie past the time we book up to.
            pnow = max(pnow, self.provider.now())
        for att, mark in attempts:
            times = instance_times(att, infos.get(att.instance_id or ""))
            if not self._due(att, mark, times, pnow):
                continue   # a pass costs what is due, not what runs
            with session(self.engine) as s:
                a = s.get(Attempt, att.id)
                times = instance_times(a, infos.get(a.instance_id or ""))
                try:
                    rows = book_attempt(s, a, times, self.provider, self.rules, upto=pnow,
                                        booked_at=wall, volume_gb=self.volume_gb,
                                        min_step_s=self.min_book_s)
                    s.commit()
                except (BookingConflict, IntegrityError, OperationalError) as exc:
                    s.rollback()
                    out.errors.append(f"attempt {att.id}: {exc}")
                    self.log.warning("spend_booking_conflict", attempt=att.id, error=str(exc))
                    continue
                except SpotrunError as exc:  # e.g. the price feed failed: retry next tick
                    s.rollback()
                    out.errors.append(f"attempt {att.id}: {exc}")
                    self.log.warning("spend_booking_failed", attempt=att.id, error=str(exc))
                    continue
            out.rows_booked += len(rows)
            if times.end is not None:
                with session(self.engine) as s:
                    m = s.get(LedgerMark, f"attempt:{att.id}")
                if m is not None and m.closed:
                    out.attempts_closed.append(att.id)
        for view, key, mark in nodes:
            times = instance_times(view, infos.get(view.instance_id or ""))
            if self._due(view, mark, times, pnow):
                out.rows_booked += self._book_one(view, infos, pnow, wall, out, mark_key=key)

    def _open_nodes(self) -> list[tuple[Attempt, str, LedgerMark | None]]:
        """Launched nodes of multi-node attempts whose ledger mark is still open, each as a
        view of its attempt (instance, pool, times) with its own mark key and mark."""
        key = literal("node:") + cast(AttemptNode.id, String)
        q = (select(AttemptNode, Attempt, LedgerMark)
             .outerjoin(LedgerMark, LedgerMark.key == key)
             .where(AttemptNode.attempt_id == Attempt.id, AttemptNode.instance_id.is_not(None),
                    or_(LedgerMark.closed.is_(None), LedgerMark.closed == False),  # noqa: E712
                    self.owns)
             .order_by(AttemptNode.id))
        with session(self.engine) as s:
            rows = list(s.exec(q))
        return [(node_attempt_view(n, a), node_key(n.id), m) for n, a, m in rows]

    def _book_one(self, att: Attempt, infos: dict[str, InstanceInfo], pnow: datetime,
                  wall: datetime, out: SpendTick, *, mark_key: str) -> int:
        with session(self.engine) as s:
            times = instance_times(att, infos.get(att.instance_id or ""))
            try:
                rows = book_attempt(s, att, times, self.provider, self.rules, upto=pnow,
                                    booked_at=wall, volume_gb=self.volume_gb,
                                    min_step_s=self.min_book_s, mark_key=mark_key)
                s.commit()
            except (BookingConflict, IntegrityError, OperationalError, SpotrunError) as exc:
                s.rollback()
                out.errors.append(f"{mark_key}: {exc}")
                self.log.warning("spend_booking_failed", mark=mark_key, error=str(exc))
                return 0
        return len(rows)

    # ------------------------------------------------------------ storage

    def _storage_jobs(self) -> list[tuple[Job, LedgerMark | None, list[Attempt]]]:
        """Jobs whose storage is still booked, each with its mark and its started attempts,
        in two queries (a queued job with nothing started costs no more)."""
        key = literal("storage:") + Job.id
        still = or_(Job.state.not_in(_TERMINAL_JOBS), LedgerMark.closed.is_(None),
                    LedgerMark.closed == False)  # noqa: E712
        has_started = select(Attempt.id).where(Attempt.job_id == Job.id,
                                               Attempt.started_at.is_not(None)).exists()
        with session(self.engine) as s:
            rows = list(s.exec(select(Job, LedgerMark)
                               .outerjoin(LedgerMark, LedgerMark.key == key)
                               .where(still, has_started)))
            started = list(s.exec(select(Attempt).join(Job, Job.id == Attempt.job_id)
                                  .outerjoin(LedgerMark, LedgerMark.key == key)
                                  .where(still, Attempt.started_at.is_not(None))
                                  .order_by(Attempt.number)))
        by_job: dict[str, list[Attempt]] = {}
        for a in started:
            by_job.setdefault(a.job_id, []).append(a)
        return [(job, mark, by_job.get(job.id, [])) for job, mark in rows]

    def _book_storage(self, pnow: datetime, wall: datetime, out: SpendTick) -> None:
        if not self.books_storage:
            return
        for job, mark, atts in self._storage_jobs():
            if not atts:
                continue
            start = min(a.started_at for a in atts)
            finished = job.state.is_terminal() and all(a.ended_at for a in atts)
            upto = max(a.ended_at for a in atts) if finished else pnow
            since = mark.booked_until if mark is not None else start
            if not finished and seconds_between(since, upto) < self.storage_interval_s:
                continue
            try:
                usage = measure_job_storage(job, self.store_opener) \
                    if seconds_between(since, upto) > 0 else None
            except SpotrunError as exc:
                out.errors.append(f"storage {job.id}: {exc}")
                self.log.warning("spend_storage_list_failed", job=job.id, error=str(exc))
                continue
            with session(self.engine) as s:
                try:
                    if usage is not None:
                        out.rows_booked += len(book_storage(
                            s, job, usage, self.rules, start=start, upto=upto, booked_at=wall))
                    if finished:
                        _close_storage(s, job.id, upto)
                    s.commit()
                except (BookingConflict, IntegrityError, OperationalError) as exc:
                    s.rollback()
                    out.errors.append(f"storage {job.id}: {exc}")

    # ------------------------------------------------------------ budgets

    def _check_budgets(self, pnow: datetime, wall: datetime, out: SpendTick) -> None:
        live = (Job.state.not_in(_TERMINAL_JOBS),
                Job.budget_stop_requested == False)  # noqa: E712
        with session(self.engine) as s:
            # Only a job with an instance running can pass its budget before the next launch.
            running = list(s.exec(select(Attempt, Job).join(Job, Job.id == Attempt.job_id).where(
                *live, Attempt.state != AttemptState.ENDED, Attempt.started_at.is_not(None),
                Attempt.ended_at.is_(None), self.owns).order_by(Attempt.number)))
        by_job: dict[str, list[Attempt]] = {}
        jobs: dict[str, Job] = {}
        for a, job in running:
            if job_budget_usd(job) is not None:
                by_job.setdefault(job.id, []).append(a)
                jobs[job.id] = job
        if not by_job:
            return
        with session(self.engine) as s:
            expected = self._expected_usd(s, by_job, pnow)
        for job_id, usd in expected.items():
            if usd <= 0:
                continue   # nothing running: the scheduler checks before the next launch
            with session(self.engine) as s:
                j = s.get(Job, job_id)
                decision = budget_check(s, j, wall, usd)
                if not decision.allowed and request_budget_stop(s, j, decision, wall):
                    s.commit()
                    out.stop_jobs.append(job_id)
                    self.log.info("budget_stop_requested", job=job_id, reason=decision.reason)

    def _expected_usd(self, s: Any, by_job: dict[str, list[Attempt]], pnow: datetime
                      ) -> dict[str, float]:
        """Per job: the cost of its running attempts from their watermark until they can be
        stopped (spotrun.ledger.committed, shared with project and owner budgets), read in
        two queries whatever the number of jobs."""
        per = committed_by_attempt(s, [a for atts in by_job.values() for a in atts], pnow,
                                   self.stop_margin.seconds(s))
        return {job_id: sum(per.get(a.id, 0.0) for a in atts) for job_id, atts in by_job.items()}


def node_key(node_id: int | None) -> str:
    """LedgerMark key of one node instance of a multi-node attempt."""
    return f"node:{node_id}"


def node_attempt_view(n: AttemptNode, a: Attempt) -> Attempt:
    """A detached Attempt carrying one node's instance, pool and times (for book_attempt)."""
    return Attempt(id=a.id, job_id=a.job_id, number=a.number, market=n.market,
                   instance_type=n.instance_type, zone=n.zone,
                   price_usd_per_hour=n.price_usd_per_hour, client_token=n.client_token,
                   instance_id=n.instance_id, started_at=n.launched_at, ended_at=n.ended_at,
                   end_reason=n.end_reason, instance_cause=n.cause,
                   state=AttemptState.ENDED if n.state is NodeState.ENDED
                   else AttemptState.RUNNING)


def _close_storage(s: Any, job_id: str, upto: datetime) -> None:
    mark = s.get(LedgerMark, storage_key(job_id))
    if mark is None:
        s.add(LedgerMark(key=storage_key(job_id), job_id=job_id, booked_until=upto, closed=True,
                         version=1))
    elif not mark.closed:
        mark.closed = True
        mark.version += 1
        s.add(mark)

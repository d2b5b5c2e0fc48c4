"""The scheduler's side of project and owner budgets (docs/budgets.md).

Once per scheduling pass, and only when `[budgets]` names any, `pass_start` reads every
budget's standing in a fixed number of queries (spotrun.budgets.standing), then:

- flags the running jobs of a scope whose spend plus commitments pass its budget for a
  budget stop (`Job.budget_stop_requested`, as the spend loop does for a job's own budget:
  the reconcile loop saves and stops them, and they end `budget_exhausted`), recording
  which budget and period stopped them (`Job.budget_stop_scope`);
- requeues the jobs such a stop ended once their budget's period has turned over;
- queues the 80 % and 100 % alerts (spotrun.notify.scopes).

Each launch is checked twice: against the pass's figures before the intent (`wait_reason`,
no statement per job), and for good inside the intent's own transaction (`check_in`),
after the scopes are locked: on SQLite the intent's first statement already holds the
database's write lock; on PostgreSQL a transaction-scoped advisory lock per budget does.
So two passes, or two daemons, never both spend the same room: a budget is passed by at
most what a launch commits (the stop margin at its price) when prices move under it.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any, Iterable

from sqlalchemy import text
from sqlmodel import select

from spotrun.config import BudgetsSettings, scope_key
from spotrun.budgets.marks import stop_mark
from spotrun.budgets.source import effective_budgets
from spotrun.budgets.standing import ScopeStanding, read_standing
from spotrun.db import Job, add_event, session
from spotrun.errors import SpotrunError
from spotrun.ledger.committed import launch_commitment_usd
from spotrun.ledger.stopmargin import stop_margin_for
from spotrun.states import JobState, move_job
from spotrun.notify.routes import parse_notify
from spotrun.notify.scopes import ScopeAlerts


def lock_scopes(s: Any, keys: Iterable[str]) -> None:
    """Hold these budgets until the transaction ends, so one budget check at a time spends
    their room (sorted: two transactions never wait on each other in a cycle)."""
    if s.connection().dialect.name != "postgresql":
        return   # SQLite: the transaction's first write took the database's write lock
    for key in sorted(set(keys)):
        lock_id = int.from_bytes(hashlib.sha256(f"spotrun-budget:{key}".encode()).digest()[:8],
                                 "big", signed=True)
        s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": lock_id})


class ScopeGuard:
    """Project and owner budgets for one scheduler: figures per pass, checks per launch."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.standing: dict[str, ScopeStanding] = {}
        self._alerts: Any = None
        self.margin = stop_margin_for(ctx.settings)
        self.margin_s = self.margin.of_stop(self.margin.prior_wall_s)   # read again each pass
        self._budgets: BudgetsSettings = ctx.settings.budgets

    @property
    def budgets(self) -> BudgetsSettings:
        """The budgets in force this pass: `[budgets]` with the database's over them
        (spotrun.budgets.source, read once per pass: `budgets set` needs no restart)."""
        return self._budgets

    def need_usd(self, price_usd_per_hour: float, nodes: int) -> float:
        """What a launch at this price commits."""
        return launch_commitment_usd(price_usd_per_hour, nodes, self.margin_s)

    # ------------------------------------------------------------ per pass

    def _provider_now(self) -> datetime | None:
        """The provider's clock (periods and commitments are read on it); None if it cannot
        be read now."""
        try:
            return self.ctx.provider.now()
        except SpotrunError as exc:
            self.ctx.log.warning("budget_clock_unreadable", error=str(exc)[:300])
            return None

    def pass_start(self, now: datetime) -> None:
        """Read the budgets' figures once; stop, requeue and alert as they say."""
        self.standing = {}
        self._budgets = effective_budgets(self.ctx.settings, self.ctx.engine)
        if not self.budgets.configured():
            self._requeue(now)   # the last budget removed: the jobs it stopped go back
            return
        pnow = self._provider_now()
        if pnow is None:
            return   # the launches check for themselves (check_in), and wait
        with session(self.ctx.engine) as s:
            self.margin_s = self.margin.seconds(s)
            standing = read_standing(s, self.budgets.configured(), pnow, self.margin)
        self.standing = {st.key: st for st in standing}
        self._alert(standing)   # before the stops: a scope's alerts precede its stop events
        for st in standing:
            if st.over and st.unflagged:
                self._stop(st, now)
        self._requeue(now)

    def _stop(self, st: ScopeStanding, now: datetime) -> None:
        """Ask the scope's running jobs to save and stop (the reconcile loop carries it out)."""
        stopped = []
        with session(self.ctx.engine) as s:
            for job_id in st.unflagged:
                j = s.get(Job, job_id)
                if j is None or j.state.is_terminal() or j.budget_stop_requested \
                        or j.cancel_requested:
                    continue
                j.budget_stop_requested = True
                j.budget_stop_scope = stop_mark(st.key, st.window.key)
                j.updated_at = now
                s.add(j)
                add_event(s, j.id, "budget_stop_requested", st.stop_reason(), ts=now)
                stopped.append(j.id)
            s.commit()
        st.unflagged = []
        if stopped:
            self.ctx.log.info("scope_budget_stop", budget=st.key, jobs=stopped,
                              reason=st.stop_reason())

    def _requeue(self, now: datetime) -> None:
        """Jobs a budget stopped go back to the queue once its period turned over (or the
        budget is gone); a `total` budget never turns over."""
        with session(self.ctx.engine) as s:
            stopped = list(s.exec(select(Job.id, Job.budget_stop_scope).where(
                Job.state == JobState.BUDGET_EXHAUSTED, Job.budget_stop_scope.is_not(None))))
        for job_id, mark in stopped:
            key, _, period_key = mark.partition("@")
            st = self.standing.get(key)
            if st is not None and st.window.key == period_key:
                continue
            why = (f"new budget period: {st.scope} {st.name} {st.window.phrase()}"
                   if st is not None else f"budget {key} removed")
            with session(self.ctx.engine) as s:
                j = s.get(Job, job_id)
                if j.budget_stop_scope != mark or not move_job(j, JobState.RECOVERING):
                    continue   # resumed by hand meanwhile
                j.budget_stop_requested = False
                j.budget_stop_scope = None
                j.error_restarts = 0
                j.reason = None
                j.updated_at = now
                s.add(j)
                add_event(s, j.id, "resumed", why, ts=now)
                s.commit()
            self.ctx.log.info("scope_budget_resumed", job=job_id, reason=why)

    def _alert(self, standing: list[ScopeStanding]) -> None:
        if self._alerts is None:
            st = self.ctx.settings
            self._alerts = ScopeAlerts(self.ctx.engine, parse_notify(st),
                                       st.notify.budget_warn_fraction)
        self._alerts.queue(standing)

    # ------------------------------------------------------------ per launch

    def wait_reason(self, job: Job, price_usd_per_hour: float, nodes: int) -> str | None:
        """Why a launch cannot fit in this pass's figures (no statement); None: try it."""
        if not self.standing:
            return None
        need = self.need_usd(price_usd_per_hour, nodes)
        for scope, name, _ in self.budgets.of_job(job.project, job.owner):
            st = self.standing.get(scope_key(scope, name))
            if st is not None and not st.fits(need):
                return st.wait_reason(need)
        return None

    def check_in(self, s: Any, job: Job, price_usd_per_hour: float, nodes: int) -> str | None:
        """Inside the intent's transaction: lock the job's budgets, read them again, and say
        why the launch must wait (None: it fits; the caller writes its intent)."""
        mine = self.budgets.of_job(job.project, job.owner)
        if not mine:
            return None
        pnow = self._provider_now()
        if pnow is None:
            scope, name, _ = mine[0]
            return (f"budget {scope} {name}: cannot be checked now (the provider's clock "
                    f"cannot be read); the launch waits")
        lock_scopes(s, [scope_key(sc, n) for sc, n, _ in mine])
        self.margin_s = self.margin.seconds(s)
        need = self.need_usd(price_usd_per_hour, nodes)
        for st in read_standing(s, mine, pnow, self.margin):
            if not st.fits(need):
                return st.wait_reason(need)
        return None

    def launched(self, job: Job, price_usd_per_hour: float, nodes: int) -> None:
        """Count a launch made this pass in the pass's figures (the next job sees it)."""
        need = self.need_usd(price_usd_per_hour, nodes)
        for scope, name, _ in self.budgets.of_job(job.project, job.owner):
            st = self.standing.get(scope_key(scope, name))
            if st is not None:
                st.committed_usd += need

"""The local backend: the verbs act on $SPOTRUN_HOME's database, as they always have."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterator

from spotrun.backends.base import Cancelled, Progress, Submitted
from spotrun.budgets.source import (change_detail, check_budget, no_row, remove_budget,
                                    set_budget)
from spotrun.config import Settings, load_settings, scope_key
from spotrun.db import database_missing, find_job, open_state_db, session
from spotrun.interrupts import Interrupted
from spotrun.jobs import interrupt_job, request_cancel, resume_job
from spotrun.ui.views import Reports, audit_view, budgets_view, status_view


def cancel_dict(job: Any) -> dict[str, Any]:
    """`cancel --json`'s object."""
    return {"id": job.id, "state": job.state.value, "cancel_requested": job.cancel_requested}


def submitted_dict(job: Any) -> dict[str, Any]:
    """`submit --json`'s object."""
    return {"id": job.id, "name": job.name, "state": job.state.value, "project": job.project,
            "owner": job.owner}


def no_daemon(settings: Settings, engine: Any) -> str | None:
    """`queued; no daemon ...` when no daemon will pick a new job up, else None."""
    from spotrun.ui.views import daemon_missing
    try:
        missing = daemon_missing(settings, engine)
    except Exception:   # the job is in: a lease that cannot be read must not fail the submit
        return None
    return f"queued; {missing}" if missing else None


def resume_dict(job: Any) -> dict[str, Any]:
    """`resume --json`'s object."""
    return {"id": job.id, "state": job.state.value, "budget_usd": job.budget_usd}


class LocalBackend:
    """Views and actions over the local state database (also what the server runs)."""

    def __init__(self, settings: Settings | None = None, engine: Any = None,
                 provider: Any = None) -> None:
        self.settings = settings or load_settings()
        self._engine = engine
        # A provider the caller already holds (a test's in-process market); else settings'
        # provider, made when a verb needs one.
        self._provider = provider
        # Kept across calls (a server's backend lives long): an attempt's final reports
        # never change, so each is read from the store once.
        self._reports = Reports()

    def engine(self, job_ref: str | None = None) -> Any:
        """The state database (a lookup on a home with none is not found; creates nothing)."""
        if self._engine is None:
            return open_state_db(self.settings, job_ref)
        return self._engine

    def status(self, ref: str | None, *, events: bool = False) -> Any:
        """`status --json`."""
        return status_view(self.settings, ref, events=events, engine=self.engine(ref),
                           reports=self._reports)

    def status_list(self) -> list[dict[str, Any]]:
        """`status --json` of every job (no events)."""
        return self.status(None)

    def status_entry(self, ref: str) -> dict[str, Any]:
        """One job as `status --json` lists it (no events)."""
        one = self.status(ref)
        one.pop("events", None)
        return one

    def submit(self, spec_file: str, *, owner: str | None, dry_run: bool,
               progress: Progress | None = None) -> Submitted:
        """Validate, then (unless dry_run) upload the bundle and record the job."""
        from spotrun.jobs import submit as submit_job, validate_submission
        sub = validate_submission(spec_file, self.settings, owner=owner)
        if dry_run:
            # lazy: start-up cost (the decision's numpy, for --dry-run alone)
            from spotrun.planning.plans import dry_run_plan
            return Submitted(job=dry_run_plan(sub, self.settings), warnings=sub.warnings)
        engine = self.engine()
        job = submit_job(sub, engine, progress=progress if sub.spec.workdir else None)
        return Submitted(job=submitted_dict(job), warnings=sub.warnings,
                         note=no_daemon(self.settings, engine))

    def logs(self, ref: str, attempt: int | None, *, follow: bool, poll_s: float
             ) -> Iterator[tuple[str, str]]:
        """The job's output from its store (checked now, streamed as iterated)."""
        from spotrun.logstream import JobLogs
        return JobLogs.open(self.settings, self.engine(ref), ref, attempt).chunks(
            follow=follow, poll_s=poll_s)

    def logs_json(self, ref: str, attempt: int | None) -> list[dict[str, Any]]:
        """`logs --json`."""
        from spotrun.logstream import JobLogs
        return JobLogs.open(self.settings, self.engine(ref), ref, attempt).as_json()

    def pull(self, ref: str, dest: Path | None, *, checkpoint: bool, show: bool
             ) -> dict[str, Any]:
        """Pull from the job's store into dest."""
        from spotrun.pulls import pull_into
        return pull_into(self.engine(ref), ref, dest, checkpoint=checkpoint, show=show)

    def cancel(self, ref: str) -> Cancelled:
        """Cancel a job (idempotent)."""
        engine = self.engine(ref)
        with session(engine) as s:
            before = find_job(s, ref)
        was = before.state.value if before is not None else None
        return Cancelled(job=cancel_dict(request_cancel(engine, ref)), was=was)

    def resume(self, ref: str, budget_usd: float | None) -> dict[str, Any]:
        """`resume --json`."""
        return resume_dict(resume_job(self.engine(ref), ref, budget_usd))

    def interrupt(self, ref: str, *, node: int | None, notice_s: float | None) -> Interrupted:
        """Send the provider's interruption to the job's current instance(s)."""
        return interrupt_job(self.settings, self.engine(ref), ref, node=node, notice_s=notice_s,
                             provider=self._provider)

    def audit(self, refs: list[str], *, since: datetime | None, until: datetime | None,
              hindsight: bool) -> list[Any]:
        """JobAudit per job."""
        return audit_view(self.settings, refs, since=since, until=until, hindsight=hindsight,
                          engine=self.engine(refs[0] if refs else None))

    def budgets(self) -> list[dict[str, Any]]:
        """`budgets --json`."""
        if self._engine is None and database_missing(self.settings) \
                and not self.settings.budgets.configured():
            return []   # no database yet, none in spotrun.toml: create nothing to say so
        return budgets_view(self.settings, engine=self.engine())

    def set_budget(self, scope: str, name: str, usd: Any, period: Any) -> dict[str, Any]:
        """`budgets set --json`: write the budget row (checked first) and trail it as the
        local OS user; the daemon applies it at its next scheduling pass."""
        check_budget(scope, name, usd, period)   # bad input opens and writes nothing
        return self._trailed("budgets set", scope, name, lambda engine, by: set_budget(
            self.settings, engine, scope, name, usd, period, by=by))

    def remove_budget(self, scope: str, name: str) -> dict[str, Any]:
        """`budgets remove --json`: delete the budget row and trail it."""
        check_budget(scope, name, with_amount=False)
        if self._engine is None and database_missing(self.settings):
            raise no_row(self.settings, scope, name)   # no database: no row, create none
        return self._trailed("budgets remove", scope, name, lambda engine, by: remove_budget(
            self.settings, engine, scope, name, by=by))

    def _trailed(self, action: str, scope: str, name: str,
                 fn: Callable[[Any, str], dict[str, Any]]) -> dict[str, Any]:
        """A local budget change, with its trail row (user: the OS user, role `local`)."""
        from spotrun.budgets.submit import os_user
        from spotrun.db.trail import record
        engine, by = self.engine(), os_user()
        out = fn(engine, by)
        record(engine, user=by, role="local", action=action, target=scope_key(scope, name),
               remote_addr="", outcome="ok", detail=change_detail(out))
        return out

    def trail(self, *, user: str | None, since: datetime | None) -> list[dict[str, Any]]:
        """The action trail of this database."""
        from spotrun.db.trail import trail_view
        return trail_view(self.engine(), user=user, since=since)

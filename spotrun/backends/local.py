"""The local backend: the verbs act on $SPOTRUN_HOME's database, as they always have."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from spotrun.backends import Cancelled
from spotrun.config import Settings, load_settings
from spotrun.db import find_job, open_settings_db, session
from spotrun.jobs import request_cancel, resume_job
from spotrun.ui.views import audit_view, budgets_view, status_view


def cancel_dict(job: Any) -> dict[str, Any]:
    """`cancel --json`'s object."""
    return {"id": job.id, "state": job.state.value, "cancel_requested": job.cancel_requested}


def resume_dict(job: Any) -> dict[str, Any]:
    """`resume --json`'s object."""
    return {"id": job.id, "state": job.state.value, "budget_usd": job.budget_usd}


class LocalBackend:
    """Views and actions over the local state database (also what the server runs)."""

    def __init__(self, settings: Settings | None = None, engine: Any = None) -> None:
        self.settings = settings or load_settings()
        self._engine = engine

    def engine(self, job_ref: str | None = None) -> Any:
        """The state database (a lookup on a home with none is not found; creates nothing)."""
        if self._engine is None:
            # lazy: the CLI helper imports click; the server passes its engine in
            from spotrun.cli.common import open_state_db
            return open_state_db(self.settings, job_ref)
        return self._engine

    def status(self, ref: str | None, *, events: bool = False) -> Any:
        """`status --json`."""
        return status_view(self.settings, ref, events=events, engine=self.engine(ref))

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

    def audit(self, refs: list[str], *, since: datetime | None, until: datetime | None,
              hindsight: bool) -> list[Any]:
        """JobAudit per job."""
        return audit_view(self.settings, refs, since=since, until=until, hindsight=hindsight,
                          engine=self.engine(refs[0] if refs else None))

    def budgets(self) -> list[dict[str, Any]]:
        """`budgets --json`."""
        if not self.settings.budgets.configured():
            return []
        return budgets_view(self.settings, engine=self.engine())

    def trail(self, *, user: str | None, since: datetime | None) -> list[dict[str, Any]]:
        """The action trail of this database."""
        from spotrun.server.trail import trail_view
        return trail_view(self.engine(), user=user, since=since)

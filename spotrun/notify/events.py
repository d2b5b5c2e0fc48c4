"""Which alerts the database calls for now; each has a key that makes it happen once.

Sources: job events (failed, succeeded, attempt_reclaimed, budget_exhausted and
`checkpoint_save_failed*`) after a watermark; each active job's spent plus committed
against its budget (`budget_warn_fraction`, then 100%: what the job-budget stop counts);
the policy's slack for deadline jobs (at risk when even on-demand from now would finish
after the deadline: `JobProgress.slack_s < 0`); and running attempts' heartbeats
(`checkpoint_failures` > 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable

from sqlalchemy import func
from sqlmodel import Session, select

from spotrun import layout
from spotrun.budgets.marks import mark_of_phrase, stop_phrase
from spotrun.db import Attempt, Event, Job, SpendEntry
from spotrun.ledger.committed import committed_by_job
from spotrun.reports import Heartbeat, parse_report
from spotrun.states import AttemptState
from spotrun.decide.policy import JobProgress

OVERLAP_IDS = 200   # events re-read below the watermark (ids may commit out of order)
_EVENT_KINDS = {"failed": "job_failed", "succeeded": "job_succeeded",
                "attempt_reclaimed": "job_reclaimed", "budget_exhausted": "budget_100"}


@dataclass(frozen=True)
class Alert:
    """One alert to send: its once-only key, event name, job and message."""

    key: str
    event: str
    job_id: str
    text: str


def _budget_of(job: Job) -> float | None:
    return job.budget_usd if job.budget_usd is not None else \
        (job.spec.get("policy") or {}).get("budget_usd")


def from_events(s: Session, after_id: int) -> tuple[list[Alert], int]:
    """Alerts from job events with id > after_id - OVERLAP_IDS; and the new watermark."""
    rows = list(s.exec(select(Event).where(Event.id > max(after_id - OVERLAP_IDS, 0))
                       .order_by(Event.id)))
    out: list[Alert] = []
    for ev in rows:
        event = _EVENT_KINDS.get(ev.kind)
        if event is None and ev.kind.startswith("checkpoint_save_fail"):
            event = "checkpoint_save_failing"
        if event is None:
            continue
        job = s.get(Job, ev.job_id)
        if job is None:
            continue
        # Which budget stopped it is read from the event: a resume has since cleared the
        # job's mark (events older than a database kept the mark only: read it there).
        mark = (mark_of_phrase(ev.detail) or job.budget_stop_scope) \
            if event == "budget_100" else None
        if mark:
            # A project or owner budget stopped it (spotrun.notify.scopes alerts the budget).
            out.append(Alert(f"budget_100:{job.id}:{mark}", event, job.id,
                             f"spotrun: job {job.id} stopped: {stop_phrase(mark)}"))
        elif event == "budget_100":
            budget = _budget_of(job)
            if budget is None:
                continue   # no budget of its own: not a job-budget stop to alert on
            out.append(Alert(f"budget_100:{job.id}:{budget}", event, job.id,
                             f"spotrun: job {job.id} stopped at its budget "
                             f"(${budget}): {ev.detail}"))
        elif event == "job_reclaimed":
            out.append(Alert(f"job_reclaimed:{job.id}:{ev.attempt_id}", event, job.id,
                             f"spotrun: job {job.id} reclaimed: {ev.detail}; it resumes from "
                             f"its last checkpoint"))
        elif event == "checkpoint_save_failing":
            out.append(Alert(f"checkpoint_save_failing:{job.id}:{ev.attempt_id}", event, job.id,
                             f"spotrun: job {job.id}: checkpoint saves are failing: {ev.detail}"))
        else:
            verb = "failed" if event == "job_failed" else "succeeded"
            why = f": {job.reason}" if job.reason and event == "job_failed" else ""
            out.append(Alert(f"{event}:{job.id}", event, job.id,
                             f"spotrun: job {job.id} {verb}{why} ({ev.detail})"))
    return out, max([after_id] + [ev.id for ev in rows if ev.id is not None])


def from_budgets(s: Session, warn_fraction: float, now: datetime,
                 margin_s: float) -> list[Alert]:
    """Budget crossings of active jobs: spent plus committed (what the job-budget stop
    counts, spotrun.ledger.committed, at provider time `now`) against the job's budget."""
    budgets = {job.id: budget for job in s.exec(select(Job))
               if not job.state.is_terminal() and (budget := _budget_of(job)) and budget > 0}
    if not budgets:
        return []
    spend = {jid: usd for jid, usd in s.exec(select(SpendEntry.job_id, func.sum(SpendEntry.usd))
                                             .where(SpendEntry.job_id.in_(list(budgets)))
                                             .group_by(SpendEntry.job_id))}
    committed = committed_by_job(s, list(budgets), now, margin_s)
    out = []
    for job_id, budget in budgets.items():
        spent = float(spend.get(job_id) or 0.0)
        used = spent + committed.get(job_id, 0.0)
        # The 80 % one is listed first: the outbox holds it before the 100 % one.
        for frac, event in ((warn_fraction, "budget_80"), (1.0, "budget_100")):
            if used >= frac * budget:
                out.append(Alert(f"{event}:{job_id}:{budget}", event, job_id,
                                 f"spotrun: job {job_id} has used ${used:.2f} of its "
                                 f"${budget:g} budget ({used / budget * 100:.0f}%: "
                                 f"${spent:.2f} spent + ${used - spent:.2f} committed)"))
    return out


def from_deadlines(s: Session, provider_now: datetime, changeover_s: float) -> list[Alert]:
    """Deadline jobs the policy's own estimate says can no longer make it (slack < 0)."""
    out = []
    for job in s.exec(select(Job).where(Job.deadline_at.is_not(None))):
        if job.state.is_terminal() or not job.total_steps:
            continue
        rates = [a.steps_per_s for a in s.exec(select(Attempt).where(Attempt.job_id == job.id)
                                                .order_by(Attempt.number)) if a.steps_per_s]
        if not rates:
            continue
        sps = rates[-1]
        p = JobProgress(work_total_s=job.total_steps / sps, work_done_s=job.last_step / sps,
                        time_left_s=(job.deadline_at - provider_now).total_seconds(),
                        elapsed_s=0.0, changeover_s=changeover_s, tick_s=0.0)
        if p.slack_s < 0:
            out.append(Alert(f"deadline_at_risk:{job.id}:{job.deadline_at.isoformat()}",
                             "deadline_at_risk", job.id,
                             f"spotrun: job {job.id} is at risk of missing its deadline "
                             f"{job.deadline_at.isoformat()}: {p.remaining_s / 3600:.2f} h of "
                             f"work left, {p.time_left_s / 3600:.2f} h to go (even on-demand "
                             f"from now would be {-p.slack_s / 3600:.2f} h late)"))
    return out


def from_heartbeats(s: Session, store_for: Callable[[str], Any]) -> list[Alert]:
    """Running attempts whose heartbeat reports failed checkpoint saves."""
    out = []
    for att, job in s.exec(select(Attempt, Job).where(Attempt.state == AttemptState.RUNNING,
                                                      Attempt.job_id == Job.id)):
        try:
            beat = parse_report(store_for(job.store_uri).get_bytes(
                layout.heartbeat_key(job.id, att.number)), Heartbeat)
        except Exception:   # no heartbeat yet, or the store is down: nothing to say
            continue
        # The agent's heartbeat carries the library's count of saves that failed.
        failures = beat.checkpoint_failures if beat is not None else None
        if failures is not None and failures > 0:
            out.append(Alert(f"checkpoint_save_failing:{job.id}:{att.id}",
                             "checkpoint_save_failing", job.id,
                             f"spotrun: job {job.id} attempt {att.number}: {failures} "
                             f"checkpoint save(s) failed; progress since the last good "
                             f"checkpoint is at risk"))
    return out

"""Reconcile loop: make the database agree with the provider and the agents' reports.

An attempt ends when its instance is gone. Why it ended comes from the evidence in
a fixed order (`end_reason_of`): the agent's own exit report of an outcome it decided
(completed, cancelled, budget) first, then the provider's reclaim, then any other
exit report, then what spotrun itself asked for, else `lost`. So a job that wrote
`completed` is never re-run, whatever the cloud says next; the cloud's cause is kept
on the attempt (`instance_cause`) for the ledger, whose billing rules follow it.

Errors use up `policy.max_restarts_on_error`, except a command that cannot start: the same
non-zero exit before any step on two instances in a row fails the job at once
(`start_failure_code`); the reason carries the tail of its output from the exit report.
"""

from __future__ import annotations

import json
from datetime import datetime

from sqlmodel import select

from spotrun import layout
from spotrun.agent.fence import fenced_key
from spotrun.daemon.context import DaemonContext
from spotrun.daemon.savefail import record_save_failures
from spotrun.steps import attempt_reported, attempt_saved, job_reached
from spotrun.db import Attempt, Job, add_event, attempts_of, session
from spotrun.errors import ObjectNotFound, StoreError
from spotrun.providers.base import InstanceInfo
from spotrun.reports import ExitReport, Heartbeat, parse_report, read_report
from spotrun.spec import spec_from_dict
from spotrun.states import (AttemptState, EndReason, InstanceState, JobState, TerminationCause,
                            move_attempt, move_job)
from spotrun.daemon.nodes import is_multi, terminate_nodes
from spotrun.budgets.marks import stop_phrase
from spotrun.ledger.stopmargin import SAVE_WINDOW_S, record_stop

LIVE = (AttemptState.LAUNCHING, AttemptState.RUNNING, AttemptState.TERMINATING)
# Outcomes the job reached before anything the cloud did: they outrank a reclaim.
_DECIDED = ("completed", "cancelled", "budget")
_EXIT_REASONS = {"completed": EndReason.COMPLETED, "error": EndReason.ERROR,
                 "cancelled": EndReason.CANCELLED, "deadman": EndReason.DEADMAN,
                 "signal": EndReason.LOST, "budget": EndReason.BUDGET}


class ReconcileLoop:
    """Each tick: follow instance states, end attempts, move jobs on, carry out cancels."""

    name = "reconcile"

    def __init__(self, ctx: DaemonContext) -> None:
        self.ctx = ctx

    def tick(self, now: datetime) -> None:
        """One reconcile pass."""
        with session(self.ctx.engine) as s:
            live = list(s.exec(select(Attempt).where(Attempt.state.in_(LIVE),
                                                     Attempt.instance_id.is_not(None),
                                                     self.ctx.owns())))
        infos = {}
        if live:
            ids = [a.instance_id for a in live]
            infos = {i.instance_id: i for i in self.ctx.provider.describe(instance_ids=ids)}
        for att in live:
            info = infos.get(att.instance_id)
            if info is None:
                continue  # not visible yet (eventual consistency); the next tick looks again
            if info.state.is_terminal():
                self._ended(att, info, now)
            elif att.state is AttemptState.LAUNCHING and info.state is InstanceState.RUNNING:
                self._running(att, info, now)
        self._cancels(now)
        self._budget_stops(now)
        self._settle_jobs(now)

    def _running(self, att: Attempt, info: InstanceInfo, now: datetime) -> None:
        attempt_running(self.ctx, att.id, info.instance_id, now)

    def _exit_report(self, job: Job, att: Attempt) -> ExitReport | None:
        """The agent's exit.json; None if there is none; StoreError if it cannot be read."""
        try:
            raw = self.ctx.job_store(job).get_bytes(
                layout.exit_key(job.id, att.number))
        except ObjectNotFound:
            return None
        return parse_report(raw, ExitReport)

    def _fenced_note(self, job: Job, att: Attempt) -> dict | None:
        """The note an agent leaves when another instance holds its attempt (agent/fence.py)."""
        try:
            note = json.loads(self.ctx.job_store(job).get_bytes(
                fenced_key(job.id, att.number, att.instance_id or "")))
        except (ObjectNotFound, StoreError, ValueError):
            return None
        return note if isinstance(note, dict) else None

    def _final_heartbeat(self, job: Job, att: Attempt) -> Heartbeat | None:
        return read_report(self.ctx.job_store(job),
                           layout.heartbeat_key(job.id, att.number), Heartbeat)

    def _ended(self, att: Attempt, info: InstanceInfo, now: datetime) -> None:
        with session(self.ctx.engine) as s:
            job = s.get(Job, att.job_id)
        # A fenced-out instance never ran the attempt: the attempt's exit report, if any, is
        # the holder's (reaped or finished), not this instance's end.
        fenced = self._fenced_note(job, att)
        try:
            report = None if fenced is not None else self._exit_report(job, att)
        except StoreError as exc:
            # Unknown is not "no report": deciding now could re-run a finished job.
            self.ctx.log.warning("exit_report_unreadable", job=job.id, attempt=att.number,
                                 error=str(exc)[:200])
            return
        reason, detail = end_reason_of(report, info, att, job.cancel_requested)
        if fenced is not None:
            detail = (f"fenced out: attempt {att.number} already runs on "
                      f"{fenced.get('holder') or 'another instance'}")
        # Verifying reads the newest checkpoint's data: do it before the write transaction.
        saved = self.ctx.checkpointed_step(job.id, job.checkpoint_uri, job.last_step)
        repeated = self._repeated_start_failure(job, att, report) \
            if reason is EndReason.ERROR else None
        with session(self.ctx.engine) as s:
            a = s.get(Attempt, att.id)
            if a.state is AttemptState.TERMINATING and a.end_reason is not None \
                    and reason is EndReason.LOST:
                reason = a.end_reason
            move_attempt(a, AttemptState.ENDED)
            a.end_reason = reason
            a.ended_at = info.ended_at or self.ctx.provider.now()
            a.detail = detail
            a.instance_cause = info.cause.value if info.cause else None
            if reason is EndReason.BUDGET and not _multi(a):
                record_stop(s, a, now)   # the stop margin follows what stops take
            # The final heartbeat may tell of save failures and steps no heartbeat pass saw
            # (a reclaim leaves no exit report: the last beat is the attempt's last word).
            final_beat = self._final_heartbeat(job, att)
            record_save_failures(s, a, final_beat)
            if final_beat is not None:
                attempt_reported(a, final_beat.step)
            if report is not None:
                attempt_reported(a, report.step)
            attempt_saved(a, saved)   # a save after the last report (notice, last moment)
            s.add(a)
            add_event(s, a.job_id, f"attempt_{reason.value}", f"attempt {a.number}: {detail}",
                      attempt_id=a.id)
            j = s.get(Job, a.job_id)
            # A save made after the last heartbeat (the notice's, a budget stop's) counts too.
            job_reached(j, saved)
            self._advance_job(s, j, a, reason, now, start_failure=repeated)
            s.commit()

    def _repeated_start_failure(self, job: Job, att: Attempt,
                                report: ExitReport | None) -> int | None:
        """The exit code, when this attempt and the instance before it both failed before
        reporting any step with that same non-zero code (a command that cannot start)."""
        code = start_failure_code(report, att)
        if code is None:
            return None
        with session(self.ctx.engine) as s:
            before = [a for a in attempts_of(s, job.id)
                      if a.number < att.number and a.instance_id is not None]
        if not before or before[-1].end_reason is not EndReason.ERROR:
            return None
        try:
            previous = self._exit_report(job, before[-1])
        except StoreError:
            return None   # unknown: the error budget decides, as for any failure
        return code if start_failure_code(previous, before[-1]) == code else None

    def _advance_job(self, s, job: Job, att: Attempt, reason: EndReason, now: datetime, *,
                     start_failure: int | None = None) -> None:
        if job.state.is_terminal():
            return
        job.updated_at = now
        if job.cancel_requested or reason is EndReason.CANCELLED:
            return  # _settle_jobs finishes the cancel once every instance is gone
        if reason is EndReason.MOVED and any(
                not a.state.is_terminal() for a in attempts_of(s, job.id) if a.id != att.id):
            return  # a policy move: the job lives on in the attempt it moved to
        if reason is EndReason.COMPLETED:
            job_reached(job, att.last_step)   # a completed run holds its last step
            move_job(job, JobState.SUCCEEDED)
            add_event(s, job.id, "succeeded", f"after {att.number} attempt(s)")
        elif reason is EndReason.BUDGET:
            move_job(job, JobState.BUDGET_EXHAUSTED)
            job.reason = "budget reached"
            add_event(s, job.id, "budget_exhausted", exhausted_detail(job))
        elif reason is EndReason.ERROR:
            job.error_restarts += 1
            limit = spec_from_dict(job.spec).policy.max_restarts_on_error
            if start_failure is not None and job.error_restarts <= limit:
                # The same exit before any step on two instances: another launch (paid)
                # would fail the same way; the output tail in the detail says why.
                move_job(job, JobState.FAILED)
                job.reason = (f"command failed {job.error_restarts} time(s) before its first "
                              f"step, with exit code {start_failure} on two instances in a "
                              f"row (not retried): {att.detail}")
                add_event(s, job.id, "failed", job.reason)
            elif job.error_restarts > limit:
                move_job(job, JobState.FAILED)
                job.reason = f"command failed {job.error_restarts} time(s): {att.detail}"
                add_event(s, job.id, "failed", job.reason)
            else:
                move_job(job, JobState.RECOVERING)
                add_event(s, job.id, "recovering",
                          f"error restart {job.error_restarts}/{limit}")
        else:
            move_job(job, JobState.RECOVERING)
            add_event(s, job.id, "recovering", f"after {reason.value}")
        s.add(job)

    def _cancels(self, now: datetime) -> None:
        with session(self.ctx.engine) as s:
            jobs = list(s.exec(select(Job).where(Job.cancel_requested == True)))  # noqa: E712
        for job in jobs:
            if job.state.is_terminal():
                continue
            store = self.ctx.job_store(job)
            try:
                store.put_bytes(layout.control_key(job.id), b'{"cancel": true}')
            except StoreError as exc:
                self.ctx.log.warning("cancel_control_write_failed", job=job.id, error=str(exc))
            with session(self.ctx.engine) as s:
                for a in attempts_of(s, job.id):
                    if a.state.is_terminal():
                        continue
                    if a.instance_id or _multi(a):
                        _terminate_instances(self.ctx, a, "cancelled by user")
                        if a.state is not AttemptState.TERMINATING:
                            move_attempt(a, AttemptState.TERMINATING)
                            a.end_reason = EndReason.CANCELLED
                            a.detail = "cancelled by user"
                            s.add(a)
                    # An intent without an instance id is finished by the scheduler first,
                    # then terminated here on a later tick.
                j = s.get(Job, job.id)
                if j.state is not JobState.CANCELLING:
                    move_job(j, JobState.CANCELLING)
                    j.updated_at = now
                    s.add(j)
                    add_event(s, j.id, "cancelling")
                s.commit()

    def _budget_stops(self, now: datetime) -> None:
        """Jobs the spend loop flagged: checkpoint and stop, then budget_exhausted."""
        with session(self.ctx.engine) as s:
            jobs = list(s.exec(select(Job).where(Job.budget_stop_requested == True,  # noqa: E712
                                                 Job.cancel_requested == False)))  # noqa: E712
        for job in jobs:
            if job.state.is_terminal():
                continue
            with session(self.ctx.engine) as s:
                live = [a for a in attempts_of(s, job.id) if not a.state.is_terminal()]
                j = s.get(Job, job.id)
                if not live:
                    move_job(j, JobState.BUDGET_EXHAUSTED)
                    j.reason = "budget reached"
                    j.updated_at = now
                    s.add(j)
                    add_event(s, j.id, "budget_exhausted", exhausted_detail(j))
                    s.commit()
                    continue
            try:
                self.ctx.job_store(job).put_bytes(
                    layout.control_key(job.id), budget_stop_request([a.number for a in live]))
            except StoreError as exc:
                self.ctx.log.warning("budget_control_write_failed", job=job.id, error=str(exc))
            # The agent saves, then stops the job within its grace; after that we terminate
            # (the stop margin's prior counts on this window: spotrun.ledger.stopmargin).
            grace_s = SAVE_WINDOW_S
            for a in live:
                if a.state is AttemptState.TERMINATING or (a.instance_id is None
                                                           and not _multi(a)):
                    continue
                if a.stop_requested_at is None:
                    with session(self.ctx.engine) as s:
                        row = s.get(Attempt, a.id)
                        row.end_reason = EndReason.BUDGET
                        row.stop_requested_at = now
                        s.add(row)
                        add_event(s, job.id, "budget_stop", f"attempt {a.number}: checkpoint "
                                  "and stop", attempt_id=a.id)
                        s.commit()
                elif (now - a.stop_requested_at).total_seconds() > grace_s:
                    terminate_attempt(self.ctx, a, EndReason.BUDGET, "budget stop: terminated")

    def _settle_jobs(self, now: datetime) -> None:
        with session(self.ctx.engine) as s:
            jobs = list(s.exec(select(Job).where(Job.state == JobState.CANCELLING)))
            for job in jobs:
                if all(a.state.is_terminal() for a in attempts_of(s, job.id)):
                    move_job(job, JobState.CANCELLED)
                    job.updated_at = now
                    s.add(job)
                    add_event(s, job.id, "cancelled")
            s.commit()


def exhausted_detail(job: Job) -> str:
    """The `budget_exhausted` event's detail: which budget stopped the job, kept in the
    history after a resume clears the job's mark (the alerts read it: notify/events.py)."""
    return stop_phrase(job.budget_stop_scope) if job.budget_stop_scope else job.reason or ""


def budget_stop_request(attempts: list[int]) -> bytes:
    """control.json asking these attempts to checkpoint and stop.

    It names the attempts: the file outlives the stop, and an attempt launched after
    `spotrun resume` must not obey a request meant for the one before it.
    """
    return json.dumps({"checkpoint_and_stop": True, "reason": "budget",
                       "attempts": sorted(attempts)}).encode()


def attempt_running(ctx: DaemonContext, attempt_id: int | None, on: str, now: datetime) -> None:
    """The attempt's instance(s) are up: attempt and job move to running (`on` names them)."""
    with session(ctx.engine) as s:
        a = s.get(Attempt, attempt_id)
        move_attempt(a, AttemptState.RUNNING)
        s.add(a)
        job = s.get(Job, a.job_id)
        if job.state in (JobState.STARTING, JobState.QUEUED, JobState.RECOVERING):
            move_job(job, JobState.RUNNING)
            job.updated_at = now
            s.add(job)
        add_event(s, a.job_id, "running", f"attempt {a.number} on {on}", attempt_id=a.id)
        s.commit()


def start_failure_code(report: ExitReport | None, att: Attempt) -> int | None:
    """The non-zero exit code of a command that failed before reporting any step, else None."""
    if report is None or (report.reason or "error") != "error" or report.step is not None:
        return None
    if att.last_step > att.start_step:
        return None   # a heartbeat saw progress the exit report missed
    code = report.exit_code
    return code if isinstance(code, int) and code != 0 else None


def tail_text(tail: str | None) -> str:
    """A failed command's last output lines as one line (reasons are shown on one line)."""
    lines = [line.strip()[:300] for line in (tail or "").splitlines() if line.strip()]
    return " | ".join(lines)


def end_reason_of(report: ExitReport | None, info: InstanceInfo, att: Attempt,
                  cancel_requested: bool) -> tuple[EndReason, str]:
    """Why an attempt ended, from the evidence in order (see the module docstring)."""
    reclaimed = info.cause is TerminationCause.SPOT_RECLAIM
    if report is not None:
        outcome = report.reason or ""
        detail = f"exit code {report.exit_code}"
        if report.message:
            detail += f": {report.message}"
        if report.log_tail and report.exit_code not in (0, None):
            detail += f"; last output: {tail_text(report.log_tail)}"
        if outcome == "completed" and report.exit_code not in (0, None):
            outcome = "error"
        if outcome in _DECIDED:
            if reclaimed:
                detail += "; the instance was then reclaimed by the provider"
            return _EXIT_REASONS[outcome], detail
        if not reclaimed:
            return _EXIT_REASONS.get(outcome, EndReason.ERROR), detail
    if reclaimed:
        return EndReason.RECLAIMED, "spot instance reclaimed by the provider"
    if att.state is AttemptState.TERMINATING:
        reason = EndReason.CANCELLED if cancel_requested else (att.end_reason or EndReason.LOST)
        return reason, att.detail or "terminated by spotrun"
    cause = info.cause.value if info.cause else "unknown"
    return EndReason.LOST, f"instance ended ({cause}) without a report"


def terminate_attempt(ctx: DaemonContext, att: Attempt, reason: EndReason, detail: str) -> None:
    """Ask the provider to end an attempt's instance and remember why (used by other loops)."""
    _terminate_instances(ctx, att, detail, reason)
    with session(ctx.engine) as s:
        a = s.get(Attempt, att.id)
        if a.state.is_terminal():
            return
        move_attempt(a, AttemptState.TERMINATING)
        a.end_reason = reason
        a.detail = detail
        s.add(a)
        add_event(s, a.job_id, "terminating", f"attempt {a.number}: {detail}", attempt_id=a.id)
        s.commit()


def _multi(att: Attempt) -> bool:
    return is_multi(att)


def _terminate_instances(ctx: DaemonContext, att: Attempt, detail: str,
                         reason: EndReason = EndReason.CANCELLED) -> None:
    """Terminate an attempt's instance, or every node of a multi-node attempt."""
    if _multi(att):
        terminate_nodes(ctx, att, reason, detail)
    elif att.instance_id:
        ctx.provider.terminate(att.instance_id)

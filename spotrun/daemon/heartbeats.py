"""Heartbeat loop: read agents' reports (progress, notices) and replace stuck instances."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from sqlmodel import select

from spotrun import layout
from spotrun.daemon.context import DaemonContext
from spotrun.daemon.reconcile import terminate_attempt
from spotrun.daemon.savefail import record_save_failures
from spotrun.steps import attempt_reported, attempt_resumed_from, job_reached
from spotrun.db import Attempt, Job, add_event, session
from spotrun.reports import Heartbeat, Notice, read_report
from spotrun.states import AttemptState, EndReason


class HeartbeatLoop:
    """Each tick: copy progress from heartbeats into the database; end silent attempts."""

    name = "heartbeats"

    def __init__(self, ctx: DaemonContext) -> None:
        self.ctx = ctx
        self._seen_ts: dict[int, str] = {}
        self._saved: dict[int, int] = {}

    def tick(self, now: datetime) -> None:
        """One pass over running attempts: one read, the store's reports, one write."""
        with session(self.ctx.engine) as s:
            # Multi-node attempts report per node: the node loop reads those (nodeloop.py).
            rows = list(s.exec(select(Attempt, Job).where(
                Attempt.state == AttemptState.RUNNING, Attempt.job_id == Job.id,
                Attempt.nodes <= 1, Attempt.nodes_min.is_(None), self.ctx.owns())))
        live = {att.id for att, _ in rows}
        for gone in set(self._seen_ts) - live:
            self._seen_ts.pop(gone, None)
            self._saved.pop(gone, None)
        # The store is read outside the database turn: the other loops go on meanwhile.
        news = []
        for att, job in rows:
            store = self.ctx.job_store(job)
            beat = read_report(store, layout.heartbeat_key(job.id, att.number), Heartbeat)
            notice = None if att.notice_at else read_report(
                store, layout.notice_key(job.id, att.number), Notice)
            fresh = beat is not None and beat.ts != self._seen_ts.get(att.id)
            if fresh or notice is not None:
                news.append((att, job, beat if fresh else None, notice))
        last_beat = {att.id: att.last_heartbeat_at or att.created_at for att, _ in rows}
        if news:
            self._write(news, now, last_beat)
        timeout = timedelta(seconds=self.ctx.settings.daemon.heartbeat_timeout_s)
        for att, _ in rows:
            if now - last_beat[att.id] > timeout:
                terminate_attempt(self.ctx, att, EndReason.LOST,
                                  f"no heartbeat for {timeout.total_seconds():.0f} s")

    def _write(self, news: list, now: datetime, last_beat: dict[int, datetime]) -> None:
        """Every fresh heartbeat and new notice of this pass, in one transaction."""
        with session(self.ctx.engine) as s:
            for att, job, beat, notice in news:
                a = s.get(Attempt, att.id)
                j = s.get(Job, job.id)
                if a is None or j is None:
                    continue
                if beat is not None:
                    a.last_heartbeat_at = now
                    last_beat[att.id] = now
                    self._saved[att.id] = apply_beat(self.ctx, a, j, beat,
                                                     self._saved.get(att.id, att.start_step))
                    s.add(j)
                    if record_save_failures(s, a, beat):
                        self.ctx.log.warning("checkpoint_save_failed", job=job.id,
                                             attempt=a.number, error=a.checkpoint_error)
                if notice is not None and a.notice_at is None:
                    a.notice_at = self.ctx.provider.now()
                    add_event(s, a.job_id, "notice",
                              f"attempt {a.number}: interruption notice "
                              f"{notice.action or ''} at {notice.time or ''}",
                              attempt_id=a.id)
                s.add(a)
            s.commit()
        # Marked seen only once written: a failed commit reads the same beat again next pass.
        for att, _, beat, _ in news:
            if beat is not None:
                self._seen_ts[att.id] = beat.ts


def apply_beat(ctx: DaemonContext, a: Attempt, j: Job, beat: Heartbeat, saved_before: int) -> int:
    """A fresh heartbeat as the attempt's and job's progress; the newest checkpoint step seen."""
    step = beat.step
    attempt_resumed_from(a, beat.resumed_from)
    attempt_reported(a, step)
    saved = beat.last_checkpoint_step
    if saved is not None and saved > saved_before:
        saved_before = saved
        if beat.checkpoint_save_s is not None:
            # Each new checkpoint paused training for its blocking save.
            a.checkpoint_stall_s = (a.checkpoint_stall_s or 0.0) + beat.checkpoint_save_s
    job_reached(j, saved)   # only checkpointed progress survives a loss
    if beat.total_steps is not None and beat.total_steps > 0:
        j.total_steps = beat.total_steps
    if beat.steps_per_s is not None:
        a.steps_per_s = beat.steps_per_s
    if beat.checkpoint_save_s is not None:
        a.checkpoint_save_s = beat.checkpoint_save_s
    if a.running_at is None and beat.phase == "running" \
            and step is not None and step > a.start_step:
        # Boot, setup and restore are over once the job makes progress.
        a.running_at = ctx.provider.now()
    return saved_before


class LivenessLoop:
    """Each tick: tell agents the daemon is alive (their dead-man switch reads this)."""

    name = "liveness"

    def __init__(self, ctx: DaemonContext) -> None:
        self.ctx = ctx

    def tick(self, now: datetime) -> None:
        """Rewrite daemon/alive.json with the current time."""
        self.ctx.store.put_bytes(layout.DAEMON_ALIVE, json.dumps({"ts": now.isoformat()}).encode())

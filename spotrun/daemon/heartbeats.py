"""Heartbeat loop: read agents' reports (progress, notices) and replace stuck instances."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from sqlmodel import select

from spotrun import layout
from spotrun.daemon.context import DaemonContext
from spotrun.daemon.reconcile import terminate_attempt
from spotrun.daemon.savefail import record_save_failures
from spotrun.progress import attempt_reported, attempt_resumed_from, job_reached
from spotrun.db import Attempt, Job, add_event, session
from spotrun.errors import ObjectNotFound, StoreError
from spotrun.states import AttemptState, EndReason


class HeartbeatLoop:
    """Each tick: copy progress from heartbeats into the database; end silent attempts."""

    name = "heartbeats"

    def __init__(self, ctx: DaemonContext) -> None:
        self.ctx = ctx
        self._seen_ts: dict[int, str] = {}
        self._saved: dict[int, int] = {}

    def tick(self, now: datetime) -> None:
        """One pass over running attempts."""
        with session(self.ctx.engine) as s:
            # Multi-node attempts report per node: the node loop reads those (nodeloop.py).
            rows = list(s.exec(select(Attempt, Job).where(
                Attempt.state == AttemptState.RUNNING, Attempt.job_id == Job.id,
                Attempt.nodes <= 1, Attempt.nodes_min.is_(None))))
        for att, job in rows:
            store = self.ctx.store_for(job.store_uri)
            beat = _read_json(store, layout.heartbeat_key(job.id, att.number))
            notice = None if att.notice_at else _read_json(
                store, layout.notice_key(job.id, att.number))
            fresh = beat is not None and beat.get("ts") != self._seen_ts.get(att.id)
            if fresh:
                self._seen_ts[att.id] = beat.get("ts")
            with session(self.ctx.engine) as s:
                a = s.get(Attempt, att.id)
                j = s.get(Job, job.id)
                if fresh:
                    a.last_heartbeat_at = now
                    step = beat.get("step")
                    attempt_resumed_from(a, beat.get("resumed_from"))
                    attempt_reported(a, step)
                    saved = beat.get("last_checkpoint_step")
                    if isinstance(saved, int) and saved > self._saved.get(att.id, att.start_step):
                        self._saved[att.id] = saved
                        cost = beat.get("checkpoint_save_s")
                        if isinstance(cost, (int, float)):
                            # Each new checkpoint paused training for its blocking save.
                            a.checkpoint_stall_s = (a.checkpoint_stall_s or 0.0) + float(cost)
                    job_reached(j, saved)   # only checkpointed progress survives a loss
                    total = beat.get("total_steps")
                    if isinstance(total, int) and total > 0:
                        j.total_steps = total
                    if isinstance(beat.get("steps_per_s"), (int, float)):
                        a.steps_per_s = float(beat["steps_per_s"])
                    if isinstance(beat.get("checkpoint_save_s"), (int, float)):
                        a.checkpoint_save_s = float(beat["checkpoint_save_s"])
                    if a.running_at is None and beat.get("phase") == "running" \
                            and isinstance(step, int) and step > a.start_step:
                        # Boot, setup and restore are over once the job makes progress.
                        a.running_at = self.ctx.provider.now()
                    s.add(j)
                    if record_save_failures(s, a, beat):
                        self.ctx.log.warning("checkpoint_save_failed", job=job.id,
                                             attempt=a.number, error=a.checkpoint_error)
                if notice is not None:
                    a.notice_at = self.ctx.provider.now()
                    add_event(s, a.job_id, "notice",
                              f"attempt {a.number}: interruption notice "
                              f"{notice.get('action', '')} at {notice.get('time', '')}",
                              attempt_id=a.id)
                s.add(a)
                s.commit()
            self._check_stuck(att, now)

    def _check_stuck(self, att: Attempt, now: datetime) -> None:
        timeout = timedelta(seconds=self.ctx.settings.daemon.heartbeat_timeout_s)
        with session(self.ctx.engine) as s:
            a = s.get(Attempt, att.id)
        last = a.last_heartbeat_at or a.created_at
        if now - last > timeout:
            terminate_attempt(self.ctx, a, EndReason.LOST,
                              f"no heartbeat for {timeout.total_seconds():.0f} s")


class LivenessLoop:
    """Each tick: tell agents the daemon is alive (their dead-man switch reads this)."""

    name = "liveness"

    def __init__(self, ctx: DaemonContext) -> None:
        self.ctx = ctx

    def tick(self, now: datetime) -> None:
        """Rewrite daemon/alive.json with the current time."""
        self.ctx.store.put_bytes(layout.DAEMON_ALIVE, json.dumps({"ts": now.isoformat()}).encode())


def _read_json(store, key: str) -> dict | None:
    try:
        return json.loads(store.get_bytes(key))
    except (ObjectNotFound, StoreError, ValueError):
        return None

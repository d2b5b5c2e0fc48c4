"""One truth for progress: the agent's reports set an attempt's real start; the job's step has
one writer and only a re-verified resume point may lower it."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from spotrun import layout
from spotrun.config import load_settings
from spotrun.daemon.context import DaemonContext
from spotrun.daemon.heartbeats import HeartbeatLoop
from spotrun.db import Attempt, Job, open_db, session
from spotrun.steps import attempt_resumed_from, job_reached, job_resumes_from
from spotrun.states import AttemptState, JobState, Market
from spotrun.store import open_store

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)


class _Clock:
    """The provider's clock: all the heartbeat loop asks of a provider."""

    def now(self) -> datetime:
        return T0


def _setup(tmp_path: Path):
    settings = load_settings(str(tmp_path))
    engine = open_db(f"sqlite:///{tmp_path / 'spotrun.db'}")
    store = open_store((tmp_path / "store").as_uri())
    with session(engine) as s:
        s.add(Job(id="j-1", name="j", state=JobState.RUNNING, spec_json="{}",
                  store_uri=store.uri, checkpoint_uri=store.uri + "/ck", last_step=10))
        s.flush()
        s.add(Attempt(job_id="j-1", number=2, state=AttemptState.RUNNING, market=Market.SPOT,
                      instance_type="p3.2xlarge", zone="za", price_usd_per_hour=1.0,
                      client_token="t-2", instance_id="i-2", start_step=10, last_step=10,
                      started_at=T0))
        s.commit()
    ctx = DaemonContext(engine=engine, settings=settings, provider=_Clock(), store=store)
    return ctx, engine, store


def test_the_agents_resume_point_is_the_attempts_start(tmp_path: Path) -> None:
    ctx, engine, store = _setup(tmp_path)
    # The daemon planned a resume from 10; the agent found 10 corrupt and handed 5 to the job.
    store.put_bytes(layout.heartbeat_key("j-1", 2), json.dumps(
        {"ts": "1", "phase": "running", "step": 7, "resumed_from": 5,
         "last_checkpoint_step": None}).encode())
    HeartbeatLoop(ctx).tick(T0)
    with session(engine) as s:
        a = s.get(Attempt, 1)
        assert (a.start_step, a.last_step) == (5, 10)
    store.put_bytes(layout.heartbeat_key("j-1", 2), json.dumps(
        {"ts": "2", "phase": "running", "step": 14, "resumed_from": 5,
         "last_checkpoint_step": 12}).encode())
    HeartbeatLoop(ctx).tick(T0)
    with session(engine) as s:
        a, j = s.get(Attempt, 1), s.get(Job, "j-1")
        assert (a.start_step, a.last_step, j.last_step) == (5, 14, 12)
    engine.dispose()


def test_the_job_step_only_rises_except_at_a_reverified_resume() -> None:
    class Row:
        last_step = 10
        start_step = 0
    job = Row()
    assert not job_reached(job, 8) and job.last_step == 10
    assert job_reached(job, 12) and job.last_step == 12
    assert not job_reached(job, None)
    job_resumes_from(job, 5)           # the checkpoint at 12 no longer verifies
    assert job.last_step == 5
    att = Row()
    assert attempt_resumed_from(att, 5) and att.start_step == 5
    assert not attempt_resumed_from(att, "5")   # only a step the agent reported


def _reclaim(ctx, engine, number: int = 2) -> None:
    """The provider reports the attempt's instance gone, reclaimed (no exit report)."""
    from spotrun.daemon.reconcile import ReconcileLoop
    from spotrun.providers.base import InstanceInfo
    from spotrun.states import InstanceState, TerminationCause
    with session(engine) as s:
        att = s.get(Attempt, 1)
    ReconcileLoop(ctx)._ended(att, InstanceInfo(
        instance_id="i-2", instance_type="p3.2xlarge", zone="za", market=Market.SPOT,
        state=InstanceState.TERMINATED, launched_at=T0, ended_at=T0,
        cause=TerminationCause.SPOT_RECLAIM), T0)


def test_a_last_moment_save_counts_as_a_step_the_attempt_ran_to(tmp_path: Path) -> None:
    """Heartbeats said 133; the save made on the notice, after the last heartbeat, is at 161.
    The next attempt resumes from 161, so this one "ran to" 161, not 133 (issue 22)."""
    from spotrun.checkpoints import put_checkpoint_files
    from spotrun.ui.views import status_view
    ctx, engine, store = _setup(tmp_path)
    store.put_bytes(layout.heartbeat_key("j-1", 2), json.dumps(
        {"ts": "1", "phase": "running", "step": 133, "resumed_from": 10,
         "last_checkpoint_step": 120}).encode())
    HeartbeatLoop(ctx).tick(T0)
    put_checkpoint_files(open_store(store.uri + "/ck"), 161, {"state.json": b"{}"})
    _reclaim(ctx, engine)
    with session(engine) as s:
        a, j = s.get(Attempt, 1), s.get(Job, "j-1")
        assert (a.last_step, j.last_step, j.state) == (161, 161, JobState.RECOVERING)
    # The next attempt starts where the checkpoints say; the lines add up.
    next_start = ctx.checkpointed_step("j-1", store.uri + "/ck", 0)
    view = status_view(ctx.settings, "j-1", engine=engine)
    (line,) = view["attempts"]
    assert line["ran_to"] == 161 >= next_start == 161
    engine.dispose()


def test_a_save_older_than_the_attempts_start_is_not_its_progress(tmp_path: Path) -> None:
    from spotrun.checkpoints import put_checkpoint_files
    ctx, engine, store = _setup(tmp_path)
    put_checkpoint_files(open_store(store.uri + "/ck"), 8, {"state.json": b"{}"})
    _reclaim(ctx, engine)
    with session(engine) as s:
        assert s.get(Attempt, 1).last_step == 10     # no step reported past its start


def test_status_counts_the_notices_emergency_save_of_a_live_attempt(tmp_path: Path) -> None:
    from spotrun.ui.views import status_view
    ctx, engine, store = _setup(tmp_path)
    store.put_bytes(layout.heartbeat_key("j-1", 2), json.dumps(
        {"ts": "1", "phase": "running", "step": 40, "resumed_from": 10}).encode())
    store.put_bytes(layout.notice_key("j-1", 2), json.dumps(
        {"ts": "2", "action": "terminate", "emergency_checkpoint_step": 44}).encode())
    (line,) = status_view(ctx.settings, "j-1", engine=engine)["attempts"]
    assert line["ran_to"] == 44
    engine.dispose()

"""The orphan sweeper against a real local market: unowned spotrun instances are terminated
after the grace, logged and booked; owned, pending and foreign instances are left alone."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlmodel import select

from spotrun.config import load_settings
from spotrun.daemon.app import build_context
from spotrun.daemon.orphans import OrphanLoop, orphan_key
from spotrun.db import Attempt, Event, Job, LedgerMark, SpendEntry, session
from spotrun.providers.billing_rules import SpendKind
from spotrun.providers.facts import rules_for
from spotrun.providers.base import TAG_ATTEMPT, TAG_JOB, TAG_MANAGED
from spotrun.providers.local.provider import LocalProvider
from spotrun.states import AttemptState, EndReason, Market


from polling import wait_for

GRACE_S = 5.0
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


@pytest.fixture
def ctx(tmp_home: Path, local_market):
    """A daemon context on a real market (instances are plain test processes)."""
    settings = load_settings(str(tmp_home), overrides={"daemon.orphan_grace_s": GRACE_S})
    c = build_context(settings, provider=LocalProvider(client=local_market))
    yield c
    c.engine.dispose()


def _launch(ctx, token: str, tags: dict[str, str]):
    body = {"client_token": token, "tags": tags, "user_data": "{}",
            "candidates": [{"instance_type": "p3.2xlarge", "zone": "za", "market": "spot"}]}
    return ctx.provider.client.launch(body)["instance_id"]


def _tags(job: str, number: int) -> dict[str, str]:
    return {TAG_MANAGED: "true", TAG_JOB: job, TAG_ATTEMPT: str(number)}


def _job(ctx, job_id: str) -> None:
    with session(ctx.engine) as s:
        s.add(Job(id=job_id, name=job_id, spec_json="{}", store_uri="file:///x",
                  checkpoint_uri="file:///x/c"))
        s.commit()


def _attempt(ctx, job_id: str, number: int, token: str, state: AttemptState,
             instance_id: str | None = None, reason: EndReason | None = None) -> int:
    with session(ctx.engine) as s:
        a = Attempt(job_id=job_id, number=number, state=state, market=Market.SPOT,
                    instance_type="p3.2xlarge", zone="za", price_usd_per_hour=0.9,
                    client_token=token, instance_id=instance_id, end_reason=reason)
        s.add(a)
        s.commit()
        return a.id


def _state(ctx, iid: str):
    return ctx.provider.describe(instance_ids=[iid])[0]


def test_unowned_instance_is_terminated_after_grace_and_booked_once(ctx):
    iid = _launch(ctx, "ghost-token", _tags("ghost-job", 1))
    loop = OrphanLoop(ctx)
    assert loop.tick(T0).terminated == []
    assert loop.tick(T0 + timedelta(seconds=GRACE_S - 1)).terminated == []
    assert not _state(ctx, iid).state.is_terminal()
    assert loop.tick(T0 + timedelta(seconds=GRACE_S)).terminated == [iid]
    info = wait_for(lambda: (i := _state(ctx, iid)).state.is_terminal() and i, 20,
                    "the market to end the orphan")
    out = loop.tick(T0 + timedelta(seconds=GRACE_S + 1))
    assert out.booked == [iid]
    assert loop.tick(T0 + timedelta(seconds=GRACE_S + 2)).booked == []   # booked once
    with session(ctx.engine) as s:
        rows = list(s.exec(select(SpendEntry).where(SpendEntry.instance_id == iid)))
        mark = s.get(LedgerMark, orphan_key(iid))
        kinds = [e.kind for e in s.exec(select(Event).where(Event.job_id == "ghost-job"))]
    span = (info.ended_at - info.launched_at).total_seconds()
    billed = rules_for("local").billed_seconds(span, market=Market.SPOT,
                                               reclaimed_by_provider=False)
    assert sum(r.billed_seconds for r in rows) == pytest.approx(billed, abs=1e-3)
    assert sum(r.billed_seconds for r in rows if r.kind == SpendKind.COMPUTE.value) \
        == pytest.approx(span, abs=1e-3)
    assert all(r.attempt_id is None and r.job_id == "ghost-job" for r in rows)
    assert mark is not None and mark.closed
    assert "orphan_terminated" in kinds and "orphan_booked" in kinds


def test_owned_pending_and_foreign_instances_are_left_alone(ctx):
    _job(ctx, "job-1")
    owned = _launch(ctx, "tok-owned", _tags("job-1", 1))
    _attempt(ctx, "job-1", 1, "tok-owned", AttemptState.RUNNING, instance_id=owned)
    pending = _launch(ctx, "tok-pending", _tags("job-1", 2))
    _attempt(ctx, "job-1", 2, "tok-pending", AttemptState.LAUNCHING)   # id not recorded yet
    foreign = _launch(ctx, "tok-foreign", {"team": "someone-else"})
    loop = OrphanLoop(ctx)
    for dt in (0, GRACE_S + 1, 3 * GRACE_S):
        assert loop.tick(T0 + timedelta(seconds=dt)).terminated == []
    assert not any(_state(ctx, i).state.is_terminal() for i in (owned, pending, foreign))
    with session(ctx.engine) as s:
        assert not list(s.exec(select(SpendEntry)))
    for i in (owned, pending, foreign):
        ctx.provider.terminate(i)


def test_instance_of_an_ended_attempt_is_reattached_and_terminated(ctx):
    _job(ctx, "job-2")
    aid = _attempt(ctx, "job-2", 1, "tok-lost", AttemptState.ENDED,
                   reason=EndReason.LAUNCH_FAILED)
    iid = _launch(ctx, "tok-lost", _tags("job-2", 1))
    loop = OrphanLoop(ctx)
    assert loop.tick(T0).reattached == [iid]
    with session(ctx.engine) as s:
        assert s.get(Attempt, aid).instance_id == iid
    assert loop.tick(T0 + timedelta(seconds=GRACE_S)).terminated == [iid]
    wait_for(lambda: _state(ctx, iid).state.is_terminal(), 20, "the instance to end")
    # Its seconds are the attempt's now (the spend loop books them), not an orphan's.
    assert loop.tick(T0 + timedelta(seconds=GRACE_S + 1)).booked == []


def test_running_attempt_whose_row_ended_is_swept(ctx):
    _job(ctx, "job-3")
    iid = _launch(ctx, "tok-3", _tags("job-3", 1))
    _attempt(ctx, "job-3", 1, "tok-3", AttemptState.ENDED, instance_id=iid,
             reason=EndReason.LOST)
    loop = OrphanLoop(ctx)
    loop.tick(T0)
    assert loop.tick(T0 + timedelta(seconds=GRACE_S)).terminated == [iid]


def test_an_instance_that_ended_before_its_launch_was_recorded_is_not_booked_twice(ctx):
    """Loops run side by side: the sweep can see an ended instance whose attempt is still
    launching (the scheduler has not recorded its id). It is the attempt's to book."""
    _job(ctx, "job-9")
    iid = _launch(ctx, "tok-late", _tags("job-9", 1))
    _attempt(ctx, "job-9", 1, "tok-late", AttemptState.LAUNCHING)   # id not recorded yet
    ctx.provider.terminate(iid)
    wait_for(lambda: _state(ctx, iid).state.is_terminal(), 20, "the instance to end")
    loop = OrphanLoop(ctx)
    assert loop.tick(T0).booked == []
    with session(ctx.engine) as s:
        assert not list(s.exec(select(SpendEntry)))

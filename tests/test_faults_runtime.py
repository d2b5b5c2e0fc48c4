"""Runtime faults (issue 18): each test reproduces one fault with real processes, signals,
files and SQLite, and checks what spotrun does about it.

The daemon runs in-process (its loops on the runner's thread, or ticked directly) so the
test can read its database; market, instances, agents and workloads are real processes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlmodel import select

from spotrun.config import load_settings
from spotrun.daemon.app import build_context, build_runner
from spotrun.db import Job, SpendEntry, attempts_of, session
from spotrun.ledger.rules import SpendKind, rules_for
from spotrun.states import EndReason, JobState, Market, TerminationCause

from conftest import kill_leftovers, write_trace
from daemon_helpers import all_booked, market_records, submit_job, write_home, write_job
from polling import wait_for
from runtime_helpers import exit_report, hold_command, start_market

pytestmark = pytest.mark.slow


@pytest.fixture
def home(tmp_home: Path, tmp_path: Path):
    """A home on an always-available trace; its market and instances die at teardown."""
    trace = write_trace(tmp_path / "trace.csv", {"za": [1] * 300}, tick_s=600.0)
    write_home(tmp_home, trace, scale=60.0, hb_timeout=60.0)
    yield tmp_home
    kill_leftovers(tmp_home / "market")


@pytest.fixture
def daemon(home: Path):
    """Start in-process daemons on the home; all stopped at teardown."""
    runners = []

    def start(autostart: bool = True):
        ctx = build_context(load_settings(str(home)))
        runner = build_runner(ctx)
        runners.append(runner)
        if autostart:
            runner.start()
        return ctx, runner

    yield start
    for r in runners:
        r.stop(wait=True)


def _job(ctx, job_id: str) -> Job:
    with session(ctx.engine) as s:
        return s.get(Job, job_id)


def _attempts(ctx, job_id: str):
    with session(ctx.engine) as s:
        return attempts_of(s, job_id)


# ------------------------------------------------------------------ 1. reclaim after exit

def test_reclaim_after_the_exit_report_does_not_rerun_the_job(home, daemon, tmp_path):
    client = start_market(home, instance_command=hold_command(tmp_path))
    job_id = submit_job(home, write_job(tmp_path, "done", steps=30))
    ctx, runner = daemon()
    wait_for(lambda: (exit_report(home, job_id, 1) or {}).get("reason") == "completed", 60,
             "the agent's exit report")
    iid = _attempts(ctx, job_id)[0].instance_id
    assert any(r.instance_id == iid and not r.state.is_terminal() for r in market_records(home))
    client.interrupt(iid, 0.0)          # the reclaim lands before the instance is gone
    job = wait_for(lambda: ((j := _job(ctx, job_id)).state.is_terminal()
                            or len(_attempts(ctx, job_id)) > 1) and j, 60, "the job to settle")
    wait_for(lambda: all_booked(ctx.engine), 30, "the attempt to be booked")
    runner.stop(wait=True)
    atts = _attempts(ctx, job_id)
    assert job.state is JobState.SUCCEEDED, (job.state, [a.detail for a in atts])
    assert [a.end_reason for a in atts] == [EndReason.COMPLETED]
    assert atts[0].instance_cause == TerminationCause.SPOT_RECLAIM.value
    # The ledger follows the cloud's cause: a reclaim is billed by the reclaim rule.
    rec = next(r for r in market_records(home) if r.instance_id == iid)
    assert rec.cause is TerminationCause.SPOT_RECLAIM
    rules = rules_for("local")
    span = rec.ended_at - rec.launched_at
    want = rules.billed_seconds(span, market=Market.SPOT, reclaimed_by_provider=True)
    with session(ctx.engine) as s:
        rows = list(s.exec(select(SpendEntry).where(SpendEntry.instance_id == iid)))
    billed = sum(r.billed_seconds for r in rows if r.kind in SpendKind.instance_kinds())
    assert billed == pytest.approx(want, abs=1e-3), (span, rows)
    assert span < rules.spot_reclaim_free_within_s and billed == pytest.approx(0.0, abs=1e-3)

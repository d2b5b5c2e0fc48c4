"""Faults the daemon must ride out: a store that fails a share of calls, a cloud that throttles
and refuses capacity, a silent (stuck) instance, and a command that keeps failing.

The daemon runs in-process (its loops in the runner's thread) so a flaky store can be
passed in; market, agents, workloads and SQLite are real processes and files.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from spotrun.config import load_settings
from spotrun.daemon.app import build_context, build_runner
from spotrun.db import Job, attempts_of, session
from spotrun.providers.local.market import procs
from spotrun.states import AttemptState, EndReason, JobState
from spotrun.store import open_store

from conftest import kill_leftovers, write_trace
from daemon_helpers import FlakyStore, live_instance_pids, submit_job, write_home, write_job
from polling import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def daemon(tmp_home: Path, tmp_path: Path):
    """Start an in-process daemon (optionally on a flaky store); stopped at teardown."""
    trace = write_trace(tmp_path / "trace.csv", {"za": [1] * 300, "zb": [1] * 300}, tick_s=600.0)
    write_home(tmp_home, trace, scale=600.0, hb_timeout=5.0)
    runners = []

    def start(store_fault: float = 0.0):
        settings = load_settings(str(tmp_home))
        store = None
        if store_fault:
            store = FlakyStore(open_store(settings.store_url), write_fail=store_fault,
                               read_fail=store_fault, seed=3)
        ctx = build_context(settings, store=store)
        runner = build_runner(ctx)
        runners.append(runner)
        return ctx, runner, store

    yield start
    for r in runners:
        r.stop(wait=True)
    kill_leftovers(tmp_home / "market")


def _job(ctx, job_id: str) -> Job:
    with session(ctx.engine) as s:
        return s.get(Job, job_id)


def _attempts(ctx, job_id: str):
    with session(ctx.engine) as s:
        return attempts_of(s, job_id)


def _done(ctx, job_id: str, timeout_s: float = 90) -> Job:
    return wait_for(lambda: (j := _job(ctx, job_id)).state.is_terminal() and j, timeout_s,
                    f"job {job_id} to finish")


def test_jobs_finish_despite_store_faults_throttling_and_capacity_errors(daemon, tmp_home,
                                                                         tmp_path):
    ids = [submit_job(tmp_home, write_job(tmp_path, n, steps=150)) for n in ("one", "two")]
    ctx, runner, store = daemon(store_fault=0.3)
    client = ctx.provider.client    # starts the market
    client.faults(throttle_fraction=0.2, capacity_fraction=0.4, seed=5)
    runner.start()
    jobs = [_done(ctx, j) for j in ids]
    counts = client.fault_counts()
    runner.stop(wait=True)
    assert [j.state for j in jobs] == [JobState.SUCCEEDED] * 2, [j.reason for j in jobs]
    assert counts["throttled"] > 0 and counts["refused"] > 0, counts
    assert store.failures > 0
    failed_launches = [a for j in ids for a in _attempts(ctx, j)
                       if a.end_reason is EndReason.LAUNCH_FAILED]
    assert failed_launches, "capacity refusals should have ended some launches"
    wait_for(lambda: not live_instance_pids(tmp_home), 30, "instance processes to exit")


def test_silent_instance_is_terminated_and_replaced(daemon, tmp_home, tmp_path):
    job_id = submit_job(tmp_home, write_job(tmp_path, "stuck", steps=300,
                                            env={"WORKLOAD_STEP_S": "0.02"}))
    ctx, runner, _ = daemon()
    runner.start()
    first = wait_for(lambda: next((a for a in _attempts(ctx, job_id)
                                   if a.state is AttemptState.RUNNING and a.last_step > 0), None),
                     60, "the first attempt to make progress")
    recs = ctx.provider.client.instances(ids=[first.instance_id])
    # The instance's leader is its init (instance_init.py); the agent is its child.
    [agent_pid] = [int(p) for p in os.listdir("/proc") if p.isdigit()
                   and (procs.stat_fields(int(p)) or ["", ""])[1] == str(recs[0]["pid"])]
    os.kill(agent_pid, signal.SIGSTOP)    # the agent hangs: no more heartbeats
    done = _done(ctx, job_id)
    runner.stop(wait=True)
    atts = _attempts(ctx, job_id)
    assert done.state is JobState.SUCCEEDED, done.reason
    assert atts[0].end_reason is EndReason.LOST and "no heartbeat" in (atts[0].detail or "")
    assert atts[-1].end_reason is EndReason.COMPLETED and len(atts) >= 2
    wait_for(lambda: not live_instance_pids(tmp_home), 30, "instance processes to exit")


def test_command_failures_are_retried_then_the_job_fails(daemon, tmp_home, tmp_path):
    job_id = submit_job(tmp_home, write_job(tmp_path, "broken", steps=50,
                                            env={"WORKLOAD_FAIL": "1"}, restarts=1))
    ctx, runner, _ = daemon()
    runner.start()
    done = _done(ctx, job_id)
    runner.stop(wait=True)
    atts = _attempts(ctx, job_id)
    assert done.state is JobState.FAILED
    assert [a.end_reason for a in atts] == [EndReason.ERROR, EndReason.ERROR]
    assert "failed 2 time(s)" in done.reason and "exit code 3" in done.reason, done.reason

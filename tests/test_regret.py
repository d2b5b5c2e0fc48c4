"""Hindsight regret: a hand-checked observed model, and a job run by the daemon on the local market.

The daemon test runs the in-process daemon (loops in the runner's thread) with the
torch-free workload; market, agents, workloads, checkpoints and SQLite are real.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlmodel import select

from spotrun.audit import audit_jobs
from spotrun.audit.observed import build_observed_model
from spotrun.audit.regret import MODEL_FOR_JOB, hindsight, observed_builder, use_observed_model
from spotrun.catalog import catalog_od_price
from spotrun.config import load_settings
from spotrun.daemon.app import build_context, build_runner
from spotrun.db import Attempt, Job, PricePoint, SpendEntry, attempts_of, open_db, session
from spotrun.states import AttemptState, EndReason, JobState, Market

from conftest import kill_leftovers, write_trace
from daemon_helpers import all_booked, submit_job, write_job
from polling import wait_for

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)
P3 = "p3.2xlarge"
OD = 3.06


@pytest.fixture(autouse=True)
def _no_builder():
    """Every test starts and ends without a registered builder (a process-wide dict)."""
    MODEL_FOR_JOB.pop("default", None)
    yield
    MODEL_FOR_JOB.pop("default", None)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def _hand_case(tmp_path: Path):
    """Spot za (1.20/h) 0-1320 s, reclaimed; then on-demand 1500-3020 s; 100 steps lost."""
    eng = open_db(f"sqlite:///{tmp_path / 'spotrun.db'}")
    spec = {"name": "hand", "command": "true", "work": {"total_steps": 1200},
            "policy": {"market": "auto"}}
    pools = json.dumps([f"{P3}/za/spot", f"{P3}/zb/spot"])
    with session(eng) as s:
        s.add(Job(id="hand", name="hand", state=JobState.SUCCEEDED, spec_json=json.dumps(spec),
                  store_uri="file:///x", checkpoint_uri="file:///x/c", last_step=1200,
                  total_steps=1200))
        s.flush()
        s.add(Attempt(job_id="hand", number=1, market=Market.SPOT, instance_type=P3, zone="za",
                      price_usd_per_hour=1.2, client_token="t1", instance_id="i-1",
                      started_at=at(0), running_at=at(120), ended_at=at(1320),
                      end_reason=EndReason.RECLAIMED, state=AttemptState.ENDED,
                      start_step=0, last_step=600, candidates=pools))
        s.add(Attempt(job_id="hand", number=2, market=Market.ON_DEMAND, instance_type=P3,
                      zone="za", price_usd_per_hour=OD, client_token="t2", instance_id="i-2",
                      started_at=at(1500), running_at=at(1620), ended_at=at(3020),
                      end_reason=EndReason.COMPLETED, state=AttemptState.ENDED,
                      start_step=500, last_step=1200, candidates=pools))
        s.add(PricePoint(instance_type=P3, zone="za", ts=at(-3600), price_usd_per_hour=1.2))
        s.add(PricePoint(instance_type=P3, zone="zb", ts=at(-3600), price_usd_per_hour=0.6))
        for att_id, secs, price in ((1, 1320, 1.2), (2, 1520, OD)):
            s.add(SpendEntry(job_id="hand", attempt_id=att_id, kind="compute",
                             start=at(0), end=at(secs), billed_seconds=secs,
                             price_usd_per_hour=price, usd=secs / 3600 * price))
        s.add(SpendEntry(job_id="hand", kind="storage", start=at(0), end=at(3020),
                         billed_seconds=0, price_usd_per_hour=0, usd=5.0))   # not in regret
        s.commit()
    return eng


def test_observed_model_and_regret_by_hand(tmp_path):
    eng = _hand_case(tmp_path)
    with session(eng) as s:
        job = s.get(Job, "hand")
        built = build_observed_model(s, job, od_price=lambda t: OD)
    m = built.model
    # Speed: 1300 steps in 2600 training s -> 1200 steps = 2400 s = 40 ticks of 60 s;
    # changeover = mean boot 120 s = 2 ticks; window 0..3020 s = 50 whole ticks.
    assert (m.work_ticks, m.changeover_ticks, m.deadline_ticks) == (40, 2, 50)
    assert m.pools == ["za", "zb"]
    # za was seen up while attempt 1 ran (ticks 0-21), down at its reclaim (tick 22);
    # zb was only offered, never seen: unavailable.
    assert m.history.up[:22, 0].all() and not m.history.up[22:, 0].any()
    assert not m.history.up[:, 1].any()
    assert m.history.price[0].tolist() == [1.2, 0.6]
    MODEL_FOR_JOB["default"] = observed_builder(lambda t: OD)
    with session(eng) as s:
        h = hindsight(s, s.get(Job, "hand"))
    # Best: za for 22 ticks (2 changeover + 20 work) = 22/60 h x 1.20 = 0.44, then
    # on-demand 22 ticks = 22/60 x 3.06 = 1.122. Actual instance spend: 0.44 + 1520 s
    # on-demand (200 s of it redoing the 100 lost steps) = 1.732; regret = 0.17.
    assert h.optimal_usd == pytest.approx(0.44 + 1.122)
    assert h.instance_usd == pytest.approx(0.44 + 1520 / 3600 * OD)
    assert h.regret_usd == pytest.approx(200 / 3600 * OD)
    with session(eng) as s:
        [ja] = audit_jobs(s, ["hand"], od_price=lambda t: OD)
    assert ja.hindsight_regret_usd == pytest.approx(h.regret_usd)
    assert ja.hindsight_optimal_usd == pytest.approx(h.optimal_usd)
    assert ja.to_dict()["hindsight_optimal_usd"] == pytest.approx(h.optimal_usd)


def test_no_regret_without_builder_or_for_unfinished_jobs(tmp_path):
    eng = _hand_case(tmp_path)
    with session(eng) as s:
        assert hindsight(s, s.get(Job, "hand")) is None      # no builder registered
        MODEL_FOR_JOB["default"] = observed_builder(lambda t: OD)
        job = s.get(Job, "hand")
        job.state = JobState.RUNNING
        assert hindsight(s, job) is None


TOML = """
[local]
trace = "{trace}"
time_scale = 3600.0
notice_s = 120.0
[daemon]
schedule_interval_s = 0.2
reconcile_interval_s = 0.2
heartbeat_interval_s = 0.3
spend_interval_s = 0.5
price_interval_s = 0.5
liveness_interval_s = 1.0
heartbeat_timeout_s = 30.0
[agent]
heartbeat_interval_s = 0.2
notice_poll_interval_s = 0.2
log_flush_interval_s = 0.5
"""


@pytest.mark.slow
def test_daemon_job_on_local_market_has_nonnegative_regret(tmp_home, tmp_path):
    # One market hour per wall second: attempt 1 is reclaimed (no notice) after > 1 h, so
    # it is billed and its unsaved steps are lost; the optimum never pays for lost work.
    trace = write_trace(tmp_path / "trace.csv", {"za": [1] * 400, "zb": [1] * 400}, tick_s=600.0)
    (tmp_home / "spotrun.toml").write_text(TOML.format(trace=trace))
    job_id = submit_job(tmp_home, write_job(tmp_path, "regret", steps=500,
                                            env={"WORKLOAD_CKPT_EVERY": "50"}))
    settings = load_settings(str(tmp_home))
    ctx = build_context(settings)
    runner = build_runner(ctx)
    try:
        runner.start()
        first = wait_for(lambda: next((a for a in _attempts(ctx, job_id)
                                       if a.state is AttemptState.RUNNING and a.last_step >= 175
                                       and a.running_at is not None), None),
                         60, "attempt 1 to pass step 175")
        ctx.provider.client.interrupt(first.instance_id, in_s=0.0, notice=False)
        done = wait_for(lambda: (j := _job(ctx, job_id)).state.is_terminal() and j, 90,
                        "the job to finish")
        wait_for(lambda: all_booked(ctx.engine), 30, "the ledger to close every attempt")
    finally:
        runner.stop(wait=True)
        kill_leftovers(tmp_home / "market")
    assert done.state is JobState.SUCCEEDED, done.reason
    atts = _attempts(ctx, job_id)
    assert atts[0].end_reason is EndReason.RECLAIMED
    assert (atts[0].ended_at - atts[0].started_at).total_seconds() > 3600
    with session(ctx.engine) as s:
        recorded = list(s.exec(select(PricePoint)))
    assert recorded and {p.source for p in recorded} == {"local"}
    assert {p.zone for p in recorded} == {"za", "zb"}

    use_observed_model(settings)
    with session(ctx.engine) as s:
        [ja] = audit_jobs(s, [job_id], od_price=catalog_od_price(settings.region))
        built = build_observed_model(s, s.get(Job, job_id),
                                     od_price=catalog_od_price(settings.region),
                                     truth=_truth(settings))
    assert built is not None and "local market trace" in built.sources[0]
    assert ja.hindsight_optimal_usd is not None and ja.hindsight_optimal_usd > 0
    instance = ja.spot_usd + ja.on_demand_usd
    assert ja.hindsight_optimal_usd <= instance + 1e-9
    assert ja.hindsight_regret_usd == pytest.approx(instance - ja.hindsight_optimal_usd)
    assert ja.hindsight_regret_usd >= 0
    # The verb shows the same figures.
    from spotrun.cli import cli
    out = CliRunner().invoke(cli, ["audit", job_id, "--json"])
    assert out.exit_code == 0, out.output
    [row] = json.loads(out.output)
    assert row["hindsight_regret_usd"] == pytest.approx(ja.hindsight_regret_usd)
    assert row["hindsight_optimal_usd"] == pytest.approx(ja.hindsight_optimal_usd)


def _truth(settings):
    from spotrun.providers.local.truth import LocalMarketTruth
    return LocalMarketTruth.from_settings(settings)


def _job(ctx, job_id: str) -> Job:
    with session(ctx.engine) as s:
        return s.get(Job, job_id)


def _attempts(ctx, job_id: str) -> list[Attempt]:
    with session(ctx.engine) as s:
        return attempts_of(s, job_id)

"""The notice in the progress model: the loss per reclaim, the provider's prior, the job's record.

Issue 22, point 3: a reclaim with a usable notice loses a half step and the emergency save, one
without loses the work since the last periodic save; the chance of a usable notice starts from
the provider's prior (ProviderFacts) and learns from the job's own attempts (real SQLite).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from spotrun.catalog import load_catalog
from spotrun.config import load_settings
from spotrun.costmodel import (GENERIC_NOTICE, DbHistory, JobStats, NoHistory, NoticePrior,
                               ReclaimRecord, StaticHistory, notice_prior_of, reclaim_loss,
                               usable_notice_chance)
from spotrun.costmodel.notice_loss import PRIOR_RECLAIMS, notice_was_used
from spotrun.db import Attempt, Job, open_db, session
from spotrun.decide import catalog_snapshot, decide
from spotrun.providers.aws import FACTS as AWS_FACTS
from spotrun.providers.base import ProviderFacts
from spotrun.providers.local import FACTS as LOCAL_FACTS
from spotrun.spec import parse_spec
from spotrun.states import AttemptState, EndReason, Market

NOW = datetime(2030, 1, 10, tzinfo=timezone.utc)
ZONES = ["us-east-1a", "us-east-1f"]


# ------------------------------------------------------------ the formula

def test_loss_mixes_the_honoured_and_the_missed_notice_by_its_chance() -> None:
    loss = reclaim_loss(usable=0.9, window_s=120.0, step_s=10.0, save_s=20.0,
                        interval_s=36000.0, mtbf_h=0.72)
    assert loss.usable == 0.9 and loss.detail == ""
    assert loss.honoured_s == pytest.approx(5.0 + 20.0)          # half a step + the save
    # Half of a 10 h interval is more than a 0.72 h up stretch holds: the stretch caps it.
    assert loss.missed_s == pytest.approx(0.72 * 3600)
    assert loss.expected_s == pytest.approx(0.9 * 25.0 + 0.1 * 0.72 * 3600)
    short = reclaim_loss(usable=0.9, window_s=120.0, step_s=10.0, save_s=20.0, interval_s=600.0,
                         mtbf_h=2.0)
    assert short.missed_s == pytest.approx(300.0)                # about half an interval
    # Saves land on step boundaries: a step longer than the interval is the time between saves.
    slow = reclaim_loss(usable=0.0, window_s=120.0, step_s=1200.0, save_s=0.0, interval_s=60.0,
                        mtbf_h=None)
    assert slow.missed_s == pytest.approx(600.0)


def test_a_notice_is_unusable_when_step_and_save_do_not_fit_its_window() -> None:
    fits = reclaim_loss(usable=0.8, window_s=120.0, step_s=40.0, save_s=80.0, interval_s=600.0,
                        mtbf_h=1.0)
    assert fits.usable == 0.8
    tight = reclaim_loss(usable=0.8, window_s=30.0, step_s=10.0, save_s=25.0, interval_s=600.0,
                         mtbf_h=1.0)   # a 30 s window (GCP-like) and a 25 s save
    assert tight.usable == 0.0 and "do not fit the 30 s notice" in tight.detail
    assert tight.expected_s == pytest.approx(300.0)
    none = reclaim_loss(usable=0.8, window_s=0.0, step_s=1.0, save_s=1.0, interval_s=600.0,
                        mtbf_h=1.0)
    assert none.usable == 0.0 and "no notice" in none.detail


# ------------------------------------------------------------ the prior and the record

def test_providers_declare_their_notice_in_their_facts(tmp_path: Path) -> None:
    aws = notice_prior_of(AWS_FACTS, load_settings(str(tmp_path), {"provider": "aws"}))
    assert (aws.window_s, aws.prior, aws.source) == (120.0, 0.9, "aws")
    local = notice_prior_of(LOCAL_FACTS, load_settings(str(tmp_path), {"local.notice_s": 45}))
    assert local.window_s == 45.0 and local.prior >= 0.98
    # A provider that declares nothing gives no notice: the model then uses periodic saves only.
    bare = ProviderFacts(name="bare", make=lambda st: None, known_zones=lambda st: [],
                         time_scale=lambda st: 1.0, billed_volume_gb=lambda st: 0.0,
                         agent_extras=lambda st: {})
    assert usable_notice_chance(notice_prior_of(bare, None), ()) == 0.0
    assert (GENERIC_NOTICE.window_s, GENERIC_NOTICE.prior) == (aws.window_s, aws.prior)


def _rec(seen: bool, start: int, reached: int, resumed: int | None,
         sps: float | None = None) -> ReclaimRecord:
    return ReclaimRecord(notice_seen=seen, start_step=start, reached_step=reached,
                         resumed_step=resumed, steps_per_s=sps)


def test_a_reclaim_counts_as_used_when_the_job_went_on_from_where_it_was() -> None:
    assert notice_was_used(_rec(True, 0, 100, 100), 120.0)
    assert notice_was_used(_rec(True, 0, 100, 130), 120.0)        # the save after the last beat
    assert not notice_was_used(_rec(True, 0, 100, 40), 120.0)     # notice seen, save lost
    # Steps reported after the last-moment save: a notice window's worth is allowed.
    assert notice_was_used(_rec(True, 0, 100, 90, sps=0.1), 120.0)
    assert not notice_was_used(_rec(True, 0, 100, 80, sps=0.1), 120.0)
    # Not known yet, or nothing to save: the recorded notice decides.
    assert notice_was_used(_rec(True, 0, 100, None), 120.0)
    assert not notice_was_used(_rec(False, 0, 100, None), 120.0)
    assert not notice_was_used(_rec(False, 50, 50, 50), 120.0)


def test_the_chance_is_the_priors_beta_updated_by_the_jobs_reclaims() -> None:
    prior = NoticePrior(window_s=120.0, prior=0.9)
    assert usable_notice_chance(prior, ()) == pytest.approx(0.9)
    used, lost = _rec(True, 0, 10, 10), _rec(False, 0, 10, 0)
    three_of_five = [used, used, used, lost, lost]
    assert usable_notice_chance(prior, three_of_five) == pytest.approx(
        (0.9 * PRIOR_RECLAIMS + 3) / (PRIOR_RECLAIMS + 5))
    # Many failures take over from the prior; many successes hold it up.
    assert usable_notice_chance(prior, [lost] * 45) == pytest.approx(4.5 / 50)
    assert usable_notice_chance(prior, [used] * 45) == pytest.approx(49.5 / 50)


# ------------------------------------------------------------ the database and the decision

def _engine(tmp_path: Path, job_step: int):
    engine = open_db(f"sqlite:///{tmp_path / 'spotrun.db'}")
    with session(engine) as s:
        s.add(Job(id="j1", name="j", spec_json="{}", store_uri="file:///x",
                  checkpoint_uri="file:///x/c", last_step=job_step))
        s.commit()
    return engine


def _attempt(engine, number: int, *, start: int, reached: int, notice: bool,
             reason: EndReason = EndReason.RECLAIMED, running: bool = True) -> None:
    t0 = NOW - timedelta(hours=10 - number)
    with session(engine) as s:
        s.add(Attempt(job_id="j1", number=number, state=AttemptState.ENDED, market=Market.SPOT,
                      instance_type="p3.2xlarge", zone="us-east-1f", price_usd_per_hour=1.0,
                      client_token=f"t-{number}", started_at=t0,
                      running_at=t0 + timedelta(minutes=5) if running else None,
                      ended_at=t0 + timedelta(minutes=30), end_reason=reason,
                      notice_at=t0 + timedelta(minutes=28) if notice else None,
                      start_step=start, last_step=reached, steps_per_s=0.01))
        s.commit()


def test_db_history_reads_the_jobs_reclaims_and_where_it_went_on_from(tmp_path: Path) -> None:
    engine = _engine(tmp_path, job_step=250)
    _attempt(engine, 1, start=0, reached=100, notice=True)       # saved: #2 resumed at 100
    _attempt(engine, 2, start=100, reached=180, notice=False)    # lost: #3 resumed at 100
    _attempt(engine, 3, start=100, reached=200, notice=True, reason=EndReason.ERROR)
    _attempt(engine, 4, start=200, reached=250, notice=True)     # newest: the job's step 250
    recs = DbHistory(engine).job_stats("j1").reclaims
    assert [(r.notice_seen, r.start_step, r.reached_step, r.resumed_step) for r in recs] == [
        (True, 0, 100, 100), (False, 100, 180, 100), (True, 200, 250, 250)]
    assert [notice_was_used(r, 120.0) for r in recs] == [True, False, True]
    assert DbHistory(engine).job_stats("other").reclaims == ()


def test_a_next_attempt_that_reported_nothing_leaves_the_save_unknown(tmp_path: Path) -> None:
    engine = _engine(tmp_path, job_step=0)
    _attempt(engine, 1, start=0, reached=100, notice=True)
    _attempt(engine, 2, start=0, reached=0, notice=False, running=False)  # reclaimed at boot
    recs = DbHistory(engine).job_stats("j1").reclaims
    assert recs[0].resumed_step is None and notice_was_used(recs[0], 120.0)
    # After the newest attempt the job's own step is where it goes on from.
    assert recs[1].resumed_step == 0


def _spec(interval_minutes: float, market: str = "spot", nodes: int = 1):
    cat = load_catalog()
    return cat, parse_spec({"name": "j", "command": "x",
                            "resources": {"instance_types": ["p3.2xlarge"], "nodes": nodes},
                            "work": {"reference_hours": 24, "reference_instance": "p3.2xlarge"},
                            "checkpoint": {"interval_minutes": interval_minutes},
                            "policy": {"market": market}},
                           base_dir=Path("."), instance_types=cat.names(), zones=ZONES, now=NOW)


def _decide(history, *, notice=None, job_id=None, interval_minutes=600.0, nodes=1):
    cat, spec = _spec(interval_minutes, nodes=nodes)
    market = catalog_snapshot(cat, "us-east-1", ZONES, NOW)
    return decide(spec, catalog=cat, market=market, history=history, hours_left=None,
                  job_id=job_id, notice=notice)


def test_a_ten_hour_interval_launches_when_the_job_saves_on_the_notice() -> None:
    for nodes in (1, 2):
        placed = _decide(NoHistory(), nodes=nodes)
        assert placed.candidates, placed.wait_reason
        for c in placed.candidates:
            assert c.market is Market.SPOT and c.nodes == nodes
            assert 0 < c.progress_fraction <= 1 and c.expected_usd < float("inf")
            assert c.notice_usable == pytest.approx(0.9)
    # Without any notice the same interval loses up to a whole up stretch per reclaim: no pool.
    none = _decide(NoHistory(), notice=NoticePrior(window_s=0.0, prior=0.0))
    assert not none.candidates
    assert "no progress expected" in none.wait_reason and "no notice" in none.wait_reason


def test_the_decision_learns_the_notice_from_the_jobs_attempts(tmp_path: Path) -> None:
    engine = _engine(tmp_path, job_step=0)
    fresh = _decide(DbHistory(engine), job_id="j1").ranking.candidates[0]
    assert fresh.notice_usable == pytest.approx(0.9)
    # Six reclaims whose notices never saved anything: the chance and the progress fall.
    for n in range(1, 7):
        _attempt(engine, n, start=0, reached=100, notice=False)
    learned = _decide(DbHistory(engine), job_id="j1").ranking.candidates
    by_zone = {c.zone: c for c in learned}
    first = by_zone[fresh.zone]
    assert first.notice_usable == pytest.approx(0.9 * PRIOR_RECLAIMS / (PRIOR_RECLAIMS + 6))
    assert first.loss_per_reclaim_s > fresh.loss_per_reclaim_s
    assert first.progress_fraction < fresh.progress_fraction
    # The same record given as figures decides the same: the database is read once, up front.
    db = DbHistory(engine)
    job = db.job_stats("j1")
    static = StaticHistory(pools=db.pool_stats(NOW, 72.0), jobs={"j1": job})
    assert [c.to_dict() for c in _decide(static, job_id="j1").candidates] == [
        c.to_dict() for c in _decide(db, job_id="j1").candidates]
    # Without the reclaims in the job's figures, the prior is back.
    bare = StaticHistory(pools=db.pool_stats(NOW, 72.0),
                         jobs={"j1": JobStats(steps_per_s=job.steps_per_s)})
    assert _decide(bare, job_id="j1").ranking.candidates[0].notice_usable == pytest.approx(0.9)

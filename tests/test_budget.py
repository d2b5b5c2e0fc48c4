"""Budgets: the spend loop stops a job before it passes its budget; launches are checked."""

from __future__ import annotations

import math

import pytest
from sqlmodel import select

from spotrun.daemon.spend import SpendLoop
from spotrun.db import Attempt, Event, Job, session
from spotrun.errors import BadInputError
from spotrun.ledger.budget import budget_check, job_budget_usd, raise_budget
from spotrun.config import load_settings
from spotrun.ledger.stopmargin import StopMargin, stop_margin_for
from spotrun.states import EndReason

from test_ledger_support import (P3, ZONE, PriceFeed, at, end_attempt, make_attempt, make_job,
                                 new_db, total_usd)


def test_small_budget_stops_before_passing_it(tmp_path):
    # Budget $1.00, spot at $0.90/h, ticks every 5 provider-minutes, stop margin 15 min:
    # at a tick with the ledger booked to t, the next stretch is 15 min x 0.90 = 0.225,
    # so the loop flags the job at the first tick where spent > 0.775, i.e. t = 55 min
    # (spent 0.825). The daemon then checkpoints and terminates within the margin.
    eng = new_db(tmp_path)
    feed = PriceFeed()
    feed.set_prices(P3, ZONE, [(at(-60), 0.90)])
    make_job(eng, budget_usd=1.00)
    a = make_attempt(eng, "job-1", 1, start=at(0))
    loop = SpendLoop(eng, feed, storage_interval_s=1e9, stop_margin=StopMargin.fixed(900))
    flagged_at = None
    for m in range(5, 125, 5):
        feed.clock = at(m)
        res = loop.tick(at(m))
        if res.stop_jobs:
            assert flagged_at is None, "flagged twice"
            assert res.stop_jobs == ["job-1"]
            flagged_at = m
            # What the reconcile loop does on the flag: checkpoint, terminate, 5 min later.
            end_attempt(eng, a.id, at(m + 5), EndReason.BUDGET)
    assert flagged_at == 55
    assert total_usd(eng) == pytest.approx(60 / 60 * 0.90)   # 0.90 <= 1.00
    assert total_usd(eng) <= 1.00
    with session(eng) as s:
        assert s.get(Job, "job-1").budget_stop_requested
        kinds = [e.kind for e in s.exec(select(Event).where(Event.job_id == "job-1"))]
    assert kinds.count("budget_stop_requested") == 1


def test_without_a_budget_nothing_is_stopped(tmp_path):
    eng = new_db(tmp_path)
    feed = PriceFeed()
    feed.set_prices(P3, ZONE, [(at(-60), 0.90)])
    make_job(eng)
    make_attempt(eng, "job-1", 1, start=at(0))
    loop = SpendLoop(eng, feed, storage_interval_s=1e9)
    for m in (60, 600):
        feed.clock = at(m)
        assert loop.tick(at(m)).stop_jobs == []
    assert total_usd(eng) == pytest.approx(9.0)


def test_launch_check_refuses_an_expected_overrun(tmp_path):
    eng = new_db(tmp_path)
    feed = PriceFeed()
    feed.set_prices(P3, ZONE, [(at(-60), 0.90)])
    make_job(eng, budget_usd=2.00)
    make_attempt(eng, "job-1", 1, start=at(0), end=at(100), reason=EndReason.RECLAIMED)
    feed.clock = at(101)
    SpendLoop(eng, feed, storage_interval_s=1e9).tick(at(101))     # spent 1.50
    with session(eng) as s:
        job = s.get(Job, "job-1")
        ok = budget_check(s, job, at(101), 0.50)
        no = budget_check(s, job, at(101), 0.51)
        with pytest.raises(BadInputError):
            budget_check(s, job, at(101), -1.0)
    assert ok.allowed and ok.spent_usd == pytest.approx(1.50)
    assert ok.remaining_usd == pytest.approx(0.50)
    assert not no.allowed and "budget" in no.reason


def test_raise_budget_validates_and_clears_the_stop(tmp_path):
    eng = new_db(tmp_path)
    feed = PriceFeed()
    feed.set_prices(P3, ZONE, [(at(-60), 0.90)])
    make_job(eng, budget_usd=1.00)
    make_attempt(eng, "job-1", 1, start=at(0), end=at(60), reason=EndReason.BUDGET)
    feed.clock = at(61)
    SpendLoop(eng, feed, storage_interval_s=1e9).tick(at(61))      # spent 0.90
    with session(eng) as s:
        job = s.get(Job, "job-1")
        job.budget_stop_requested = True
        for bad in (0, -5, math.nan, math.inf, True, 0.5):
            with pytest.raises(BadInputError) as ei:
                raise_budget(s, job, bad)
            assert ei.value.field == "--budget-usd"
        raise_budget(s, job, 5.0)
        s.commit()
    with session(eng) as s:
        job = s.get(Job, "job-1")
        assert job.budget_usd == 5.0 and not job.budget_stop_requested
        assert job_budget_usd(job) == 5.0
        assert budget_check(s, job, at(62), 4.0).allowed


@pytest.mark.parametrize("provider, terminate_wall_s", [("local", 5.0), ("aws", 120.0)])
def test_the_prior_is_the_longest_stop_the_daemon_allows(tmp_path, provider, terminate_wall_s):
    # Before any stop is measured, a job that never saves must still fit: the reconcile loop
    # takes the request up within a tick (1 s), waits out its 20 s save window, terminates
    # at the next tick (1 s), and the provider takes its stated terminate time.
    settings = load_settings(str(tmp_path), {"provider": provider})
    rule = stop_margin_for(settings)
    assert rule.prior_wall_s == 1.0 + 20.0 + 1.0 + terminate_wall_s
    assert rule.check_wall_s == 5.0
    eng = new_db(tmp_path)
    with session(eng) as s:   # nothing measured: the prior, over the 60 s floor at x1 on AWS
        assert rule.seconds(s) == max(60.0, rule.time_scale * (5.0 + rule.prior_wall_s))


def test_the_stop_margin_follows_the_stops_measured(tmp_path):
    # Before any stop is measured: the provider's stated terminate time (5 wall s) and one
    # check interval (5 s), at x60: 600 market seconds. Then the longest stop measured.
    eng = new_db(tmp_path)
    rule = StopMargin(time_scale=60.0, prior_wall_s=5.0, check_wall_s=5.0, floor_s=60.0)
    with session(eng) as s:
        assert rule.seconds(s) == 600.0
    make_job(eng, "j1")
    for n, stop_wall_s in enumerate((12.0, 3.0), start=1):
        make_attempt(eng, "j1", n, start=at(0), end=at(60), reason=EndReason.BUDGET)
        with session(eng) as s:
            a = s.exec(select(Attempt).where(Attempt.number == n)).one()
            a.budget_stop_wall_s = stop_wall_s
            s.add(a)
            s.commit()
    with session(eng) as s:
        assert rule.seconds(s) == (5.0 + 12.0) * 60.0
    # The floor: a provider's minimum billed seconds (EC2's 60 s), whatever was measured.
    assert StopMargin(time_scale=1.0, check_wall_s=5.0, floor_s=60.0).of_stop(3.0) == 60.0

"""The `markov-tiers` plan: solved on a model of the market seen so far, per refit."""

from __future__ import annotations

import numpy as np
import pytest

from spotrun.decide.policy import JobProgress, Mode, make_policy
from spotrun.decide.policy import markov as mk
from spotrun.decide.policy import markov_dp as dp
from spotrun.decide.policy import markov_refit as refit
from spotrun.decide.policy.base import ON_DEMAND
from spotrun.decide.policy.history import MarketHistory, run_ages
from spotrun.simulate.engine import run_policy
from spotrun.simulate.model import SimModel, build_model, pick_starts
from spotrun.simulate.synthetic import regime_change_market

from policy_helpers import assert_restarts_decide_the_same

TICK_S = 300.0


def model_of(up: np.ndarray, work: int, deadline: int, changeover: int, price: float = 1.0,
             od: float = 3.0, prior_h: list[float] | None = None) -> SimModel:
    """One or more pools (columns of up), flat prices, 300 s ticks."""
    up = np.asarray(up, dtype=bool).reshape(len(up), -1)
    h = MarketHistory([f"p{j}" for j in range(up.shape[1])], up,
                      np.full(up.shape, price), od, TICK_S, prior_h)
    return SimModel(history=h, tick_values=np.arange(len(up)), work_ticks=work,
                    deadline_ticks=deadline, changeover_ticks=changeover)


def test_an_always_up_market_is_planned_as_one_spot_launch():
    m = model_of(np.ones(200), work=40, deadline=60, changeover=2)
    r = run_policy(m, make_policy("markov-tiers"), 100, record=True)
    assert r.deadline_met and r.launches == 1 and r.reclaims == 0
    assert r.cost_usd == pytest.approx((40 + 2) * TICK_S / 3600.0 * 1.0)
    assert all(d.mode is Mode.SPOT for d in r.decisions)


def test_with_spot_gone_for_good_it_runs_on_demand_and_meets_the_deadline():
    # spot was up and flapping, then never comes back: the plan bridges on on-demand
    col = np.concatenate([np.tile([1] * 6 + [0] * 6, 20), np.zeros(200)])
    m = model_of(col, work=30, deadline=45, changeover=2)
    r = run_policy(m, make_policy("markov-tiers"), 240, record=True)
    assert r.deadline_met
    first_od = next(i for i, d in enumerate(r.decisions) if d.mode is Mode.ON_DEMAND)
    # the plan leaves waiting before the safety net would have to (slack 13 ticks)
    assert first_od < 45 - 30 - 2


def test_the_fit_weighs_the_providers_prior_as_one_pseudo_reclaim():
    # one observed tick of history: the reclaim rate is the prior's, 1 / MTBF
    one = MarketHistory(["p0"], np.ones((1, 1), dtype=bool), np.ones((1, 1)), 3.0, TICK_S,
                        [2.0])
    chain = mk.fit(one, 0, (10, 20, 2), 1)
    assert 1.0 - chain.spot[0, 0] == pytest.approx(1.0 / (2.0 * 3600.0 / TICK_S))
    # without the provider's figure: the packaged priors' pooled one
    bare = MarketHistory(["p0"], np.ones((1, 1), dtype=bool), np.ones((1, 1)), 3.0, TICK_S)
    chain = mk.fit(bare, 0, (10, 20, 2), 1)
    expect = 1.0 / (mk.packaged_mtbf_h() * 3600.0 / TICK_S)
    assert 1.0 - chain.spot[0, 0] == pytest.approx(expect)
    assert 1.0 < mk.packaged_mtbf_h() < 10.0


def test_a_spot_job_risks_the_reclaims_of_the_pool_the_plan_would_take():
    """Pools of one price differ: the plan takes the one up longest and stays, so its reclaim
    rate is that pool's, not the pools' pooled one."""
    steady = np.ones(400, dtype=bool)
    steady[99::100] = False                        # down one tick in 100
    flappy = np.tile([True, True, False, False], 100)
    up = np.stack([steady, flappy], axis=1)
    # placed the plan's way (the cheapest, then the longest up, then the first): the steady
    # pool, back on it after each of its 4 outages, 396 ticks on spot in all
    assert mk.placed_reclaims(up, np.ones(up.shape), run_ages(up)) == (4, 396)
    h = model_of(up, 20, 40, 2, prior_h=[100.0, 100.0]).history
    reclaim = 1.0 - mk.fit(h, 399, (20, 40, 2), 1).spot[0, 0]
    assert reclaim == pytest.approx((4 + 1) / (396 + 100 * 3600.0 / TICK_S))
    # the pools' reclaims pooled (104 over 596 up-ticks) would put it at 50x that
    pooled = np.count_nonzero(up[:-1] & ~up[1:]) / np.count_nonzero(up[:-1])
    assert pooled > 50 * reclaim


def test_the_fit_reads_only_rows_up_to_the_refit():
    rng = np.random.default_rng(3)
    col = rng.random(400) < 0.7
    a = model_of(col, 20, 40, 2).history
    b = model_of(np.concatenate([col[:201], ~col[201:]]), 20, 40, 2).history
    ca, cb = mk.fit(a, 200, (20, 40, 2), 1), mk.fit(b, 200, (20, 40, 2), 1)
    assert np.array_equal(ca.market, cb.market) and np.array_equal(ca.spot, cb.spot)
    assert not np.array_equal(mk.fit(a, 300, (20, 40, 2), 1).market,
                              mk.fit(b, 300, (20, 40, 2), 1).market)


def test_the_fit_on_given_rows_reads_those_rows_only():
    """The benchmark's whole-trace reference: rows=(lo, hi) replaces the window ending at row."""
    rng = np.random.default_rng(5)
    col = rng.random(400) < 0.7
    a = model_of(col, 20, 40, 2).history
    b = model_of(np.concatenate([col[:300], ~col[300:]]), 20, 40, 2).history
    # the window ending at row 200 is rows 0..200 here (48 h of 5-minute rows is longer)
    assert np.array_equal(mk.fit(a, 200, (20, 40, 2), 1, rows=(0, 201)).market,
                          mk.fit(a, 200, (20, 40, 2), 1).market)
    # rows past the refit row are read when asked for, and only those asked for
    assert not np.array_equal(mk.fit(a, 200, (20, 40, 2), 1, rows=(0, 400)).market,
                              mk.fit(b, 200, (20, 40, 2), 1, rows=(0, 400)).market)
    assert np.array_equal(mk.fit(a, 200, (20, 40, 2), 1, rows=(0, 300)).spot,
                          mk.fit(b, 200, (20, 40, 2), 1, rows=(0, 300)).spot)


def test_a_restarted_policy_on_a_daemon_grown_history_decides_the_same():
    trace, prices = regime_change_market(seed=4)
    m = build_model(trace, prices, spot_price_usd_per_hour=None, od_price_usd_per_hour=3.0,
                    work_hours=4.0, deadline_hours=6.0, changeover_hours=0.2)
    assert assert_restarts_decide_the_same(m, "markov-tiers", 3580).deadline_met


def test_the_table_matches_the_plan_it_was_solved_from():
    """Spot always up, cheap: launch spot from idle and stay; never up: on-demand."""
    up = dp.Chain(market=np.array([[0.0, 1.0], [0.0, 1.0]]), spot=np.array([[1.0]]),
                  after_reclaim=np.array([0.0, 1.0]), od_usd=3.0, spot_usd=1.0,
                  od_launch_usd=6.0, spot_launch_usd=2.0)
    t = dp.solve(20, 40, 2, up, 1)
    idle_up = dp.decision_state("idle", 1, 0, t.tiers)
    on_spot = dp.decision_state("spot", 1, 0, t.tiers)
    assert t.action(idle_up, 40, 20) == dp.SPOT
    assert t.action(on_spot, 30, 15) == dp.SPOT
    assert t.action(idle_up, 21, 20) == dp.ON_DEMAND          # past reach: on-demand
    # an outage that ends with probability 0.2 a tick, then spot for good: wait with slack
    back = dp.Chain(market=np.array([[0.8, 0.2], [0.0, 1.0]]), spot=np.array([[1.0]]),
                    after_reclaim=np.array([0.0, 1.0]), od_usd=3.0, spot_usd=1.0,
                    od_launch_usd=6.0, spot_launch_usd=2.0)
    t = dp.solve(20, 40, 2, back, 1)
    idle_down = dp.decision_state("idle", 0, 0, t.tiers)
    assert t.action(idle_down, 40, 20) == dp.WAIT
    assert t.action(idle_down, 22, 20) == dp.ON_DEMAND        # no slack left to wait
    # never back: waiting buys nothing, so the tie goes to progress (on-demand now)
    never = dp.Chain(market=np.array([[1.0, 0.0], [1.0, 0.0]]), spot=np.array([[0.0]]),
                     after_reclaim=np.array([1.0, 0.0]), od_usd=3.0, spot_usd=1.0,
                     od_launch_usd=6.0, spot_launch_usd=2.0)
    assert dp.solve(20, 40, 2, never, 1).action(idle_down, 40, 20) == dp.ON_DEMAND


def test_pools_fall_into_price_tiers_cheapest_first():
    # 0.9 | 1.0, 1.02 (within 5 % of 1.0) | 1.15 | 1.3
    assert refit.price_tiers([1.0, 1.3, 0.9, 1.02, 1.15], max_tiers=4) == (1, 3, 0, 1, 2)
    assert refit.price_tiers([1.0, 1.3, 0.9, 1.02, 1.15], max_tiers=2) == (1, 1, 0, 1, 1)
    assert refit.price_tiers([0.9, 0.9, 0.9], max_tiers=4) == (0, 0, 0)
    up = np.array([[0, 0, 0], [1, 1, 0], [0, 1, 0], [0, 0, 1]], dtype=bool)
    # none up; the cheapest tier up is 0; then tier 1; then tier 2
    assert refit.market_states(up, (0, 1, 2)).tolist() == [0, 1, 2, 3]


def test_the_tiered_plan_waits_for_the_cheaper_pool_only_while_the_slack_allows():
    """Two tiers, neither ever reclaimed: only the dear one up, the cheap one back with
    probability 0.5 a tick. With slack: wait for the cheap one; without: take the dear one."""
    chain = dp.Chain(market=np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.5, 0.5]]),
                     spot=np.eye(2), after_reclaim=np.array([[1.0, 0.0, 0.0]] * 2),
                     od_usd=3.0, spot_usd=np.array([0.5, 1.5]), od_launch_usd=6.0,
                     spot_launch_usd=np.array([1.0, 3.0]), tier_of=(0, 1))
    t = dp.solve(20, 40, 2, chain, 1)
    dear_only = dp.decision_state("idle", 2, 0, t.tiers)
    cheap_up = dp.decision_state("idle", 1, 0, t.tiers)
    assert t.action(dear_only, 40, 20) == dp.WAIT
    assert t.action(cheap_up, 40, 20) == dp.SPOT
    assert t.action(dear_only, 22, 20) == dp.SPOT          # no slack left to wait
    on_dear = dp.decision_state("spot", 2, 1, t.tiers)
    assert t.action(on_dear, 30, 15) == dp.WAIT            # worth a changeover: leave it
    assert t.action(on_dear, 17, 15) == dp.SPOT            # not any more: stay


def test_it_waits_for_the_cheap_pool_while_the_dear_one_is_up():
    # the cheap pool is up 20 ticks of every 22; the dear one is always up
    n = 400
    up = np.stack([np.arange(n) % 22 < 20, np.ones(n, dtype=bool)], axis=1)
    h = MarketHistory(["cheap", "dear"], up, np.tile([0.5, 1.5], (n, 1)), 3.0, TICK_S)
    job = JobProgress(work_total_s=20 * TICK_S, work_done_s=0.0, time_left_s=60 * TICK_S,
                      elapsed_s=0.0, changeover_s=2 * TICK_S, tick_s=TICK_S, mode=Mode.IDLE)
    row = 22 * 13 + 20                                         # the cheap pool is down
    assert make_policy("markov-tiers").decide(job, h.view(row)).mode is Mode.IDLE
    assert make_policy("markov-tiers").decide(job, h.view(row + 2)).pool == "cheap"


def test_a_long_job_is_planned_on_a_coarse_grid_and_small():
    """48 h of work, 5 x deadline, 300 s ticks: a coarse grid and a table of change points
    (what one solve costs is bench/policy_cost.py's to say, not a test's)."""
    trace, prices = regime_change_market(seed=0)
    m = build_model(trace, prices, spot_price_usd_per_hour=None, od_price_usd_per_hour=3.06,
                    work_hours=48.0, deadline_hours=240.0, changeover_hours=0.2)
    shape = (m.work_ticks, m.deadline_ticks, m.changeover_ticks)
    assert dp.step_ticks(m.deadline_ticks, m.changeover_ticks) == 2
    table = mk.table_for(m.history, 3600, shape)
    assert table.time_steps <= dp.MAX_STEPS * 2 and table.nbytes < 4 * 1024 * 1024


@pytest.mark.parametrize("pools,work_h,factor", [(1, 8.0, 1.5), (None, 8.0, 1.25),
                                                 (2, 48.0, 1.5)])
def test_on_the_regime_change_family_it_beats_the_better_rule(pools, work_h, factor):
    trace, prices = regime_change_market(seed=0)
    chosen = trace.pools if pools is None else [trace.pools[pools]]
    m = build_model(trace.select(chosen), prices, spot_price_usd_per_hour=None,
                    od_price_usd_per_hour=3.06, work_hours=work_h,
                    deadline_hours=work_h * factor, changeover_hours=0.2)
    rows = pick_starts(m, starts=8, seed=5, t0=None)
    mean = {}
    for name in ("greedy", "uniform-progress", "markov-tiers"):
        runs = [run_policy(m, make_policy(name), int(r)) for r in rows]
        assert all(r.deadline_met for r in runs), name
        mean[name] = float(np.mean([r.cost_usd for r in runs]))
    assert mean["markov-tiers"] < min(mean["greedy"], mean["uniform-progress"])


def test_the_fit_reaches_back_two_days_for_a_short_job():
    # a 40-tick deadline (3.3 h), but rows up to 48 h back shape the model
    rng = np.random.default_rng(4)
    col = rng.random(800) < 0.7
    old = np.concatenate([col[:400], ~col[400:500], col[500:]])   # 25-33 h before row 800
    a, b = model_of(col, 20, 40, 2).history, model_of(old, 20, 40, 2).history
    assert not np.array_equal(mk.fit(a, 799, (20, 40, 2), 1).market,
                              mk.fit(b, 799, (20, 40, 2), 1).market)


def test_a_change_in_the_pools_price_order_refits_the_tiered_plan():
    # both pools always up; at row 200 the cheap one becomes the dear one
    n = 400
    price = np.where(np.arange(n)[:, None] < 200, [0.5, 1.5], [1.5, 0.5])
    h = MarketHistory(["a", "b"], np.ones((n, 2), dtype=bool), price, 3.0, TICK_S)
    assert refit.tier_changes(h, mk.MAX_TIERS) == [200]
    assert refit.base_row(h, 250, 500, mk.MAX_TIERS) == 200
    assert refit.base_row(h, 250, 500, 1) == 0            # one tier: no order to follow
    # a long deadline: its grid's refit (row 0) is far behind
    job = JobProgress(work_total_s=200 * TICK_S, work_done_s=0.0,
                      time_left_s=1000 * TICK_S, elapsed_s=0.0, changeover_s=2 * TICK_S,
                      tick_s=TICK_S, mode=Mode.IDLE)
    assert make_policy("markov-tiers").decide(job, h.view(150)).pool == "a"
    assert make_policy("markov-tiers").decide(job, h.view(250)).pool == "b"


def test_a_change_point_is_found_only_where_the_chain_changed():
    rng = np.random.default_rng(7)
    steady = (rng.random(600) < 0.8).astype(int)
    assert refit.change_point(steady, 2) == 0
    # up 4 ticks in 5, then up 1 tick in 5: the split lands near row 300
    changed = np.concatenate([rng.random(300) < 0.8, rng.random(300) < 0.2]).astype(int)
    assert abs(refit.change_point(changed, 2) - 300) < 30


def test_an_outage_far_longer_than_the_model_refits_it_from_the_regime_change(monkeypatch):
    """Days of 3-tick outages, then (from row 460) 24-tick ones. The job's refit grid row is
    450, so the model in force saw only short outages; an outage past twice its mean refits
    it on the rows after the change, and the plan bridges the next outage on on-demand
    instead of waiting its slack away."""
    first = (np.arange(460) % 24) < 21
    second = (np.arange(300) % 30) < 6                        # up 6 ticks, down 24
    h = model_of(np.concatenate([first, second]), 200, 450, 2).history
    row = 650                                                  # 4 ticks into an outage

    def job_at(r: int) -> JobProgress:
        # started at row 450, 30 ticks of slack left
        return JobProgress(work_total_s=200 * TICK_S, work_done_s=(r - 670) * TICK_S,
                           time_left_s=(900 - r) * TICK_S, elapsed_s=(r - 450) * TICK_S,
                           changeover_s=2 * TICK_S, tick_s=TICK_S, mode=Mode.IDLE)

    stale = mk.table_for(h, 450, (200, 450, 2), 1)
    assert stale.outage_ticks < 4.0
    # the first outage after the change reaches twice the mean (6 ticks) at row 466 + 5
    assert refit.first_surprise(h, stale.tier_of, stale.outage_ticks, 451, row) == 471
    policy = make_policy("markov-tiers")
    assert policy.decide(job_at(row), h.view(row)) == ON_DEMAND
    monkeypatch.setattr(refit, "SURPRISE_RUNS", 1e9)           # the model of row 450 only
    mk._TABLES.clear()
    assert make_policy("markov-tiers").decide(job_at(row), h.view(row)).mode is Mode.IDLE

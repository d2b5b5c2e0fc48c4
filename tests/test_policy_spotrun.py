"""The `spotrun` policy: it follows the plan unless a rule beat it on the market so far, safely."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from spotrun.decide.policy import JobProgress, make_policy
from spotrun.decide.policy.history import MarketHistory
from spotrun.decide.policy import spotrun as sel
from spotrun.decide.policy.rules import OnDemandPolicy
from spotrun.decide.policy.spotrun import (CANDIDATES, PLAN, RULES, SpotrunPolicy,
                                           choose_candidate, shadow_cost, windows)
from spotrun.simulate.engine import run_policy
from spotrun.simulate.model import SimModel, build_model, pick_starts
from spotrun.simulate.synthetic import regime_change_market
from spotrun.traces import load_prices, load_trace

from policy_helpers import assert_restarts_decide_the_same

TICK_S = 600.0
DATA = Path(__file__).resolve().parents[1] / "spotrun" / "data" / "traces"


def model_of(up: np.ndarray, work: int, deadline: int, changeover: int,
             prices: list[float] | None = None) -> SimModel:
    """A model over availability columns (flat prices per pool)."""
    price = np.tile(np.asarray(prices or [1.0] * up.shape[1]), (len(up), 1))
    h = MarketHistory([f"p{j}" for j in range(up.shape[1])], up, price, 3.0, TICK_S)
    return SimModel(history=h, tick_values=np.arange(len(up)), work_ticks=work,
                    deadline_ticks=deadline, changeover_ticks=changeover)


def periodic(n: int, up_ticks: int, down_ticks: int) -> np.ndarray:
    """One pool: up_ticks up, down_ticks down, repeated."""
    col = np.array(([True] * up_ticks + [False] * down_ticks) * (n // (up_ticks + down_ticks) + 1))
    return col[:n, None]


def start_job(m: SimModel) -> JobProgress:
    return JobProgress(work_total_s=m.work_ticks * TICK_S, work_done_s=0.0,
                       time_left_s=m.deadline_ticks * TICK_S, elapsed_s=0.0,
                       changeover_s=m.changeover_ticks * TICK_S, tick_s=TICK_S)


def test_without_history_it_follows_the_plan():
    m = model_of(periodic(400, 10, 30), work=20, deadline=40, changeover=2)
    assert windows(5, 20, 40, 2) == []            # less than a quarter deadline seen
    assert SpotrunPolicy().following(start_job(m), m.history.view(5)) == PLAN


def test_it_follows_the_plan_where_its_shadow_runs_won():
    # outages twice as long as the stretches: the plan bridges them on on-demand early
    m = model_of(periodic(600, 5, 10), work=30, deadline=40, changeover=1)
    wins = windows(500, 30, 40, 1)
    assert len(wins) == 16 and all(s + d <= 501 for s, _, d in wins)
    costs = {n: np.mean([shadow_cost(m.history, s, w, d, 1, n) for s, w, d in wins])
             for n in CANDIDATES}
    assert choose_candidate(m.history.view(500), (30, 40, 1), None) == PLAN
    assert costs[PLAN] < min(costs["greedy"], costs["uniform-progress"])
    p = run_policy(m, make_policy("spotrun"), 501)
    g = run_policy(m, make_policy("greedy"), 501)
    assert p.deadline_met and p.cost_usd < g.cost_usd


def test_it_leaves_a_plan_the_windows_show_losing_for_the_better_rule(monkeypatch):
    # the guard itself: a "plan" that always pays on-demand loses every window to both rules
    monkeypatch.setitem(sel.CANDIDATES, PLAN, OnDemandPolicy)
    m = model_of(periodic(600, 30, 5), work=30, deadline=60, changeover=1)
    wins = windows(500, 30, 60, 1)
    costs = {n: np.array([shadow_cost(m.history, s, w, d, 1, n) for s, w, d in wins])
             for n in ("greedy", "uniform-progress", PLAN)}
    chosen = choose_candidate(m.history.view(500), (30, 60, 1), PLAN)
    assert chosen in RULES and costs[chosen].mean() == min(c.mean() for c in costs.values())
    assert (costs[PLAN] > costs[chosen]).all()


def test_a_restarted_policy_on_a_daemon_grown_history_decides_the_same():
    trace, prices = regime_change_market(seed=1)
    m = build_model(trace, prices, spot_price_usd_per_hour=None, od_price_usd_per_hour=3.0,
                    work_hours=2.0, deadline_hours=3.0, changeover_hours=0.2)
    assert_restarts_decide_the_same(m, "spotrun", 3550)    # across the regime change at 3600


@pytest.mark.parametrize("policy", ["spotrun", "markov-tiers"])
def test_decisions_ignore_the_market_after_now_with_a_long_history(policy):
    trace, prices = regime_change_market(seed=2)
    m = build_model(trace, prices, spot_price_usd_per_hour=None, od_price_usd_per_hour=3.0,
                    work_hours=2.0, deadline_hours=4.0, changeover_hours=0.2)
    cut, start = 3620, 3590
    h = m.history
    other = MarketHistory(h.pools, np.concatenate([h.up[:cut], ~h.up[cut:]]),
                          np.concatenate([h.price[:cut], h.price[cut:] * 3]),
                          h.od_price_usd_per_hour, h.tick_s)
    b = SimModel(history=other, tick_values=m.tick_values, work_ticks=m.work_ticks,
                 deadline_ticks=m.deadline_ticks, changeover_ticks=m.changeover_ticks)
    ra = run_policy(m, make_policy(policy), start, record=True)
    rb = run_policy(b, make_policy(policy), start, record=True)
    assert ra.deadline_met and rb.deadline_met
    assert ra.decisions[:cut - start] == rb.decisions[:cut - start]


def _slice(which: str, pools: int | None, work_h: float, factor: float) -> SimModel:
    if which == "synthetic":
        trace, prices = regime_change_market(seed=0)
    else:
        trace = load_trace(DATA / "p3.2xlarge_4az_demo.csv")
        prices = load_prices(DATA / "p3.2xlarge_4az_demo_prices.csv")
    chosen = trace.pools if pools is None else [trace.pools[pools]]
    return build_model(trace.select(chosen), prices, spot_price_usd_per_hour=None,
                       od_price_usd_per_hour=3.06, work_hours=work_h,
                       deadline_hours=work_h * factor, changeover_hours=0.2)


_DEMO_MISS = pytest.mark.xfail(strict=True, reason=(
    "a recorded miss (issue 26, docs/benchmarks.md): a pool up 1 % of the time; with no "
    "history the plan's prior expects long stretches and pays a changeover on a 3-tick one"))


@pytest.mark.parametrize("which,pools,work_h,factor", [
    ("synthetic", 1, 2.0, 2.0), ("synthetic", 1, 2.0, 5.0), ("synthetic", None, 8.0, 1.5),
    pytest.param("demo", 0, 2.0, 1.5, marks=_DEMO_MISS), ("demo", None, 2.0, 5.0)])
def test_never_worse_than_the_better_rule_by_more_than_one_percent(which, pools, work_h, factor):
    m = _slice(which, pools, work_h, factor)
    rows = pick_starts(m, starts=8, seed=1, t0=None)
    mean = {}
    for name in ("greedy", "uniform-progress", "spotrun"):
        runs = [run_policy(m, make_policy(name), int(r)) for r in rows]
        assert all(r.deadline_met for r in runs), name
        mean[name] = float(np.mean([r.cost_usd for r in runs]))
    assert mean["spotrun"] <= 1.01 * min(mean["greedy"], mean["uniform-progress"])

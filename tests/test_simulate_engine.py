"""The tick simulator's rules, and what every policy must guarantee on it."""

from __future__ import annotations

import numpy as np
import pytest

from spotrun.decide.policy import IDLE, ON_DEMAND, POLICIES, Decision, Mode, make_policy
from spotrun.decide.policy.history import MarketHistory
from spotrun.simulate.optimal import optimal_costs
from spotrun.simulate.engine import ScheduledPolicy, run_policy
from spotrun.simulate.model import SimModel


def model_from(up_rows: list[list[int]], prices: list[float], *, work: int, deadline: int,
               changeover: int, od: float = 3.0) -> SimModel:
    """A model with one-hour ticks (so costs are sums of hourly prices)."""
    up = np.asarray(up_rows, dtype=bool)
    price = np.tile(np.asarray(prices, dtype=float), (len(up), 1))
    h = MarketHistory([f"p{j}" for j in range(up.shape[1])], up, price, od, 3600.0)
    return SimModel(history=h, tick_values=np.arange(100, 100 + len(up)), work_ticks=work,
                    deadline_ticks=deadline, changeover_ticks=changeover)


def spot(pool: str) -> Decision:
    return Decision(Mode.SPOT, pool)


def test_reclaim_tick_is_lost_and_unpaid_and_progress_survives():
    # pool up, up, up, DOWN, up...; job launches at 0 (changeover 1), works 1-2, reclaimed
    # at 3, relaunches at 4 (changeover), works 5-6: 4 work ticks done at tick 6.
    m = model_from([[1], [1], [1], [0], [1], [1], [1], [1], [1], [1]], [1.5], work=4, deadline=10,
                   changeover=1)
    greedy = run_policy(m, make_policy("greedy"), 0, record=True)
    assert greedy.reclaims == 1 and greedy.launches == 2
    assert greedy.ticks_used == 7
    assert greedy.cost_usd == pytest.approx(6 * 1.5)   # 7 ticks, the reclaim tick unpaid
    assert greedy.decisions[3] == IDLE


def test_changeover_is_paid_at_the_new_price():
    m = model_from([[1, 1]] * 6, [1.0, 2.0], work=2, deadline=6, changeover=2)
    moves = [spot("p0"), spot("p0"), spot("p1"), spot("p1"), spot("p1"), spot("p1")]
    r = run_policy(m, ScheduledPolicy(moves), 0)
    # 2 changeover ticks on p0 (1.0), then a move: 2 changeover + 2 work ticks on p1 (2.0)
    assert r.cost_usd == pytest.approx(2 * 1.0 + 4 * 2.0)
    assert r.launches == 2 and r.deadline_met


def test_on_demand_baseline_cost():
    m = model_from([[0]] * 10, [1.0], work=5, deadline=9, changeover=2, od=3.0)
    r = run_policy(m, make_policy("on-demand"), 0)
    assert r.cost_usd == pytest.approx(m.on_demand_cost_usd()) == pytest.approx(7 * 3.0)


def random_model(seed: int, pools: int) -> SimModel:
    rng = np.random.default_rng(seed)
    n = 400
    # bursty availability: runs of random length, so reclaims and long outages both occur
    up = np.zeros((n, pools), dtype=bool)
    for j in range(pools):
        t, state = 0, bool(rng.integers(2))
        while t < n:
            length = int(rng.geometric(1 / (25 if state else 12)))
            up[t:t + length, j] = state
            t, state = t + length, not state
    price = np.repeat(rng.uniform(0.5, 1.5, size=(n // 50, pools)), 50, axis=0)
    h = MarketHistory([f"z{j}" for j in range(pools)], up, price, 3.0, 600.0)
    return SimModel(history=h, tick_values=np.arange(n), work_ticks=60, deadline_ticks=90,
                    changeover_ticks=3)


@pytest.mark.parametrize("seed,pools", [(0, 1), (1, 1), (2, 3), (3, 2)])
def test_every_policy_meets_every_deadline_and_optimal_is_never_beaten(seed, pools):
    model = random_model(seed, pools)
    rows = np.random.default_rng(seed).integers(0, len(model.history) - 90, size=25)
    opt = optimal_costs(model, rows)
    assert np.isfinite(opt).all()
    for name in POLICIES:
        for i, row in enumerate(rows):
            r = run_policy(model, make_policy(name), int(row))
            assert r.deadline_met, (name, row)
            assert r.cost_usd >= opt[i] - 1e-9, (name, row)


def test_safety_net_switches_to_on_demand_in_time():
    # spot never comes back after tick 0: greedy waits, then must run on-demand
    m = model_from([[0]] * 30, [0.5], work=10, deadline=20, changeover=2)
    r = run_policy(m, make_policy("greedy"), 0, record=True)
    assert r.deadline_met and r.ticks_used == 20
    first_od = next(i for i, d in enumerate(r.decisions) if d == ON_DEMAND)
    assert first_od == 20 - 10 - 2                    # as late as possible, not later


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_policies_never_see_the_future(name):
    a = random_model(7, 3)
    b = random_model(7, 3)
    cut = 150
    b.history = MarketHistory(a.history.pools,
                              np.concatenate([a.history.up[:cut], ~a.history.up[cut:]]),
                              np.concatenate([a.history.price[:cut], a.history.price[cut:] * 2]),
                              3.0, 600.0)
    ra = run_policy(a, make_policy(name), 100, record=True)
    rb = run_policy(b, make_policy(name), 100, record=True)
    assert ra.decisions[:cut - 100] == rb.decisions[:cut - 100]
    assert ra.decisions != rb.decisions or name == "on-demand"

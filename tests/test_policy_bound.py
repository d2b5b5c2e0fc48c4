"""bench/policy_bound.py: the MDP bound follows the simulator's rules and respects optimal."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import policy_bound as pb                                   # noqa: E402
from mdp import MarkovDP                                     # noqa: E402

from spotrun.simulate.optimal import optimal_costs            # noqa: E402
from spotrun.simulate.model import build_model, pick_starts  # noqa: E402
from spotrun.simulate.synthetic import regime_change_market  # noqa: E402


def test_always_up_market_costs_work_plus_changeover():
    """One pool always up: the DP's value is one launch and the work, at the spot price."""
    obs = np.array([[False], [True]])
    price = np.tile([3.0, 1.0], (40, 1))
    dp = MarkovDP(20, 40, 2, obs, lambda tau: np.eye(2), price)
    assert dp.v0[1] == 22.0
    # all down: on-demand from the start, once slack runs out at the latest (same cost)
    assert dp.v0[0] == 22 * 3.0


def test_hidden_state_reproduces_the_synthetic_market():
    """The regenerated pool and shared states AND to the market synthetic.py builds."""
    x, s = pb.synthetic_hidden(0)
    trace, _ = regime_change_market(0)
    assert ((x & s[:, None]) == (trace.available > 0)).all()
    assert s[: len(s) // 2].all() and not s[len(s) // 2:].all()


def test_bound_meets_deadlines_and_never_beats_optimal():
    """Through run_policy on seeded starts (single pool and all pools): no miss, no override."""
    trace, prices = regime_change_market(0)
    for pools in (["syn-b"], list(trace.pools)):
        model = build_model(trace.select(pools), prices, spot_price_usd_per_hour=None,
                            od_price_usd_per_hour=3.06, work_hours=4, deadline_hours=8)
        rows = pick_starts(model, starts=6, seed=3, t0=None)
        cm = pb.SyntheticModel([trace.pools.index(p) for p in pools], seed=0)
        cm.window = model.deadline_ticks
        costs, expected, overridden = pb.run_bound(model, rows, cm)
        opt = optimal_costs(model, rows)
        assert overridden == 0
        assert (costs >= opt - 1e-9).all()
        assert np.isfinite(expected).all() and (expected > 0).all()


def test_whole_trace_reference_meets_deadlines_and_never_beats_optimal():
    """Real trace, all pools (--oracle-lite --pools all): markov-tiers fitted to the whole trace."""
    trace, prices = pb.bp._load("demo")
    model = build_model(trace.select(list(trace.pools)), prices, spot_price_usd_per_hour=None,
                        od_price_usd_per_hour=3.06, work_hours=2, deadline_hours=4,
                        changeover_hours=0.2)
    rows = pick_starts(model, starts=6, seed=3, t0=None)
    costs, expected, overridden = pb.run_whole_trace(model, rows)
    opt = optimal_costs(model, rows)
    assert overridden == 0 and np.isnan(expected).all()
    assert (costs >= opt - 1e-9).all() and (costs < model.on_demand_cost_usd()).any()

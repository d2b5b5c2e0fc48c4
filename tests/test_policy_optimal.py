"""`optimal` is exact: it equals brute force over every decision sequence on tiny traces."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from spotrun.decide.policy import IDLE, ON_DEMAND, Decision, Mode
from spotrun.decide.policy.history import MarketHistory
from spotrun.simulate.optimal import optimal_costs, optimal_schedule
from spotrun.simulate.engine import ScheduledPolicy, run_policy
from spotrun.simulate.model import SimModel


def tiny_model(seed: int, *, pools: int, ticks: int, work: int, deadline: int,
               changeover: int) -> SimModel:
    """A random small market: availability, prices changing every tick."""
    rng = np.random.default_rng(seed)
    up = rng.random((ticks, pools)) < 0.6
    price = rng.uniform(0.5, 2.5, size=(ticks, pools)).round(2)
    h = MarketHistory([f"p{j}" for j in range(pools)], up, price, 3.0, 3600.0)
    return SimModel(history=h, tick_values=np.arange(ticks), work_ticks=work,
                    deadline_ticks=deadline, changeover_ticks=changeover)


class _Fixed:
    """Plays one sequence; an unavailable spot choice becomes idle (a wasted branch)."""

    name = "fixed"

    def __init__(self, seq: tuple[Decision, ...], model: SimModel, row: int) -> None:
        self.seq, self.model, self.row = seq, model, row

    def decide(self, job, market) -> Decision:
        tau = round(job.elapsed_s / job.tick_s)
        d = self.seq[tau]
        if d.mode is Mode.SPOT and not market.up_now()[market.pools.index(d.pool)]:
            return IDLE
        return d


def brute_force(model: SimModel, row: int) -> float:
    """Cheapest deadline-meeting run over every per-tick choice, through the simulator."""
    options = [IDLE, ON_DEMAND] + [Decision(Mode.SPOT, p) for p in model.pools]
    best = np.inf
    for seq in itertools.product(options, repeat=model.deadline_ticks):
        r = run_policy(model, _Fixed(seq, model, row), row)
        if r.deadline_met:
            best = min(best, r.cost_usd)
    return best


CASES = [  # (seed, pools, work, deadline, changeover)
    (1, 2, 3, 7, 1), (2, 2, 2, 7, 2), (3, 1, 3, 8, 1), (4, 2, 4, 7, 0), (5, 1, 2, 7, 2),
    (6, 2, 3, 6, 1),
]


@pytest.mark.parametrize("seed,pools,work,deadline,changeover", CASES)
def test_optimal_equals_brute_force(seed, pools, work, deadline, changeover):
    model = tiny_model(seed, pools=pools, ticks=deadline + 3, work=work, deadline=deadline,
                       changeover=changeover)
    rows = np.array([0, 1, 3])
    batched = optimal_costs(model, rows)
    for i, row in enumerate(rows):
        expect = brute_force(model, int(row))
        assert batched[i] == pytest.approx(expect, abs=1e-9)
        cost, schedule = optimal_schedule(model, int(row))
        assert cost == pytest.approx(expect, abs=1e-9)
        replay = run_policy(model, ScheduledPolicy(schedule), int(row))
        assert replay.deadline_met
        assert replay.cost_usd == pytest.approx(expect, abs=1e-9)


def test_optimal_uses_spot_gaps_a_greedy_rule_cannot_see():
    # One pool: up for 2 ticks, down 1, up 5. Work 4, deadline 8, changeover 1.
    up = np.array([[1], [1], [0], [1], [1], [1], [1], [1]], dtype=bool)
    h = MarketHistory(["a"], up, np.full((8, 1), 1.0), 3.0, 3600.0)
    model = SimModel(history=h, tick_values=np.arange(8), work_ticks=4, deadline_ticks=8,
                     changeover_ticks=1)
    cost, schedule = optimal_schedule(model, 0)
    # Best: wait for the long stretch (1 changeover + 4 work at 1.0 = 5.0); launching at 0
    # pays a second changeover after the reclaim (6.0).
    assert cost == pytest.approx(5.0)
    assert schedule[:3] == [IDLE, IDLE, IDLE]

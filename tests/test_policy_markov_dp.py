"""The `markov` planner's table against the Bellman equations written out state by state.

markov_dp.solve is vectorised over work left and states, and turns values into actions a
block of steps at a time; this reference takes one (state, work left, step) at a time, from
the move rules in markov_dp's docstring, so a slip in the vectorised indexing or at a
block's edge shows as a different action.
"""

from __future__ import annotations

import numpy as np
import pytest

from spotrun.decide.policy import markov_dp as dp


def random_chain(rng: np.random.Generator, tiers: int, changeover: int) -> dp.Chain:
    """A market of `tiers` price tiers with random transitions, reclaims and prices."""
    M = tiers + 1
    market = rng.random((M, M)) + np.eye(M) * 4.0         # states persist, as markets do
    after = rng.random((tiers, M))
    spot_usd = np.sort(rng.uniform(0.5, 2.5, tiers))
    return dp.Chain(market=market / market.sum(axis=1, keepdims=True),
                    spot=np.diag(rng.uniform(0.85, 0.99, tiers)),
                    after_reclaim=after / after.sum(axis=1, keepdims=True),
                    od_usd=3.0, spot_usd=spot_usd, od_launch_usd=3.0 * changeover,
                    spot_launch_usd=spot_usd * changeover, tier_of=tuple(range(tiers)))


def reference(work: int, deadline: int, changeover: int, chain: dp.Chain
              ) -> dict[tuple[int, int, int], tuple[int, float]]:
    """{(decision state, work left, steps left): (best action, its lead over the next best)}
    by backward induction, one state at a time (g = 1)."""
    W, K, C = work, deadline, changeover
    T = chain.tiers
    M = T + 1
    P, U = chain.market.tolist(), chain.spot.tolist()
    AR = np.atleast_2d(chain.after_reclaim).tolist()
    lost = [1.0 - sum(U[t]) for t in range(T)]
    sp = np.broadcast_to(chain.spot_usd, (T,)).tolist()
    sp_launch = np.broadcast_to(chain.spot_launch_usd, (T,)).tolist()

    def start(n_states: int) -> list[list[float]]:
        return [[0.0] + [dp.BIG] * W for _ in range(n_states)]

    def ev(row: list[float], values: list[list[float]], r: int) -> float:
        return sum(p * v[r] for p, v in zip(row, values))

    idle = start(M)
    od = [start(M) for _ in range(max(C, 1))]       # od[c]: c launch steps still to pass
    sv = [start(T) for _ in range(max(C, 1))]
    out: dict[tuple[int, int, int], tuple[int, float]] = {}
    for k in range(1, K + 1):
        n_idle, n_od, n_sv = start(M), [start(M) for _ in od], [start(T) for _ in sv]
        for r in range(1, W + 1):
            wait = [ev(P[m], idle, r) + dp.TIE_USD for m in range(M)]
            after = [ev(AR[t], idle, r) for t in range(T)]
            stay_od = [chain.od_usd + ev(P[m], od[0], r - 1) for m in range(M)]
            stay_sp = [(1.0 - lost[t]) * sp[t] + ev(U[t], sv[0], r - 1) + lost[t] * after[t]
                       for t in range(T)]
            if C >= 1:
                land_od = [chain.od_launch_usd + ev(P[m], od[C - 1], r) for m in range(M)]
                land_sp = [sp_launch[t] + ev(U[t], sv[C - 1], r) + lost[t] * after[t]
                           for t in range(T)]
            else:
                land_od = [chain.od_launch_usd + x for x in stay_od]
                land_sp = [sp_launch[t] + stay_sp[t] for t in range(T)]
            choices = {}
            for m in range(M):
                spot = [land_sp[m - 1]] if m else []
                choices[m] = [wait[m], land_od[m], *spot]
                choices[M + m] = [wait[m], stay_od[m], *spot]
            for t in range(T):
                choices[2 * M + t] = [wait[1 + t], land_od[1 + t], stay_sp[t]]
            for m in range(M):
                n_idle[m][r] = min(choices[m])
                n_od[0][m][r] = min(choices[M + m])
            for t in range(T):
                n_sv[0][t][r] = min(choices[2 * M + t])
            for c in range(1, len(od)):
                for m in range(M):
                    n_od[c][m][r] = ev(P[m], od[c - 1], r)
                for t in range(T):
                    n_sv[c][t][r] = ev(U[t], sv[c - 1], r) + lost[t] * after[t]
            for s, vals in choices.items():
                best = int(np.argmin(vals))        # ties to the first: wait, on-demand, spot
                lead = min((v - vals[best] for i, v in enumerate(vals) if i != best))
                if n_idle[0][r] >= dp.BIG:         # not even waiting can finish: on-demand
                    best, lead = dp.ON_DEMAND, float("inf")
                out[(s, r, k)] = (best, lead)
        idle, od, sv = n_idle, n_od, n_sv
    return out


@pytest.mark.parametrize("tiers,changeover", [(1, 0), (1, 2), (2, 1), (3, 3)])
def test_the_table_holds_the_best_action_of_every_state_and_step(tiers, changeover):
    """Steps across several blocks (and a partial last one); every (state, work, steps left)
    the job can still finish from, where the best action leads the next by more than
    rounding, holds the reference's action."""
    rng = np.random.default_rng(tiers * 10 + changeover)
    work, deadline = 24, 2 * dp.BLOCK_STEPS + 17
    chain = random_chain(rng, tiers, changeover)
    table = dp.solve(work, deadline, changeover, chain, 1)
    checked = 0
    for (state, r, k), (best, lead) in reference(work, deadline, changeover, chain).items():
        if r <= k and lead > 1e-6:
            assert table.action(state, k, r) == best, (state, r, k)
            checked += 1
    # the comparison covers every kind of action, not a table of on-demand
    assert checked > 0.9 * (2 * (tiers + 1) + tiers) * work * (deadline - work)
    assert set(table.acts.tolist()) >= {dp.WAIT, dp.ON_DEMAND, dp.SPOT}

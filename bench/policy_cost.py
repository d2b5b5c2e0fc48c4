"""What one deadline decision costs the daemon (issue 26): `markov-tiers` and `spotrun`.

The daemon asks the policy once per interval with the market it recorded, a new
MarketHistory each interval (`extended`), so no cache outlives the interval except the
policy's own (its plan and its choice points). This replays that: a market grown row by
row from the synthetic family (4 pools, 300 s ticks), one job per shape, a decision per
row, and times `decide` alone (not the history's growth, the daemon's part).

Printed per shape: the plan's refit (fit and solve) CPU time and table size, then per
decision the mean and the worst CPU time of `markov-tiers` (the plan alone; refits
included: on the grid, at a change of the pools' price order and at a surprise) and
`spotrun` (the plan behind its guard, which also replays its shadow windows at each choice
point), and what 1,000 jobs of that shape cost the daemon in CPU seconds per wall-clock
second at one decision per 300 s interval (spotrun).

    .venv/bin/python bench/policy_cost.py                # about a minute
    .venv/bin/python bench/policy_cost.py --start 3700   # after the regime change
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from spotrun.decide.policy import JobProgress, Mode, make_policy  # noqa: E402
from spotrun.decide.policy import markov as mk                     # noqa: E402
from spotrun.decide.policy.history import MarketHistory             # noqa: E402
from spotrun.simulate.model import build_model                     # noqa: E402
from spotrun.simulate.synthetic import regime_change_market        # noqa: E402

SHAPES = ((2.0, 1.25), (8.0, 2.0), (48.0, 1.25), (48.0, 5.0))
JOBS = 1000


def grown(h: MarketHistory, upto: int) -> MarketHistory:
    """The history as the daemon holds it after recording rows 0..upto."""
    return MarketHistory(h.pools, h.up[:upto + 1], h.price[:upto + 1],
                         h.od_price_usd_per_hour, h.tick_s)


def decide_times(name: str, h: MarketHistory, start: int, shape: tuple[int, int, int],
                 ticks: int) -> np.ndarray:
    """CPU seconds of each decision of one job that stays idle (nothing settles), on the
    market the daemon would have recorded, one row per decision."""
    work, deadline, changeover = shape
    policy = make_policy(name)
    market = grown(h, start)
    out = []
    for tau in range(ticks):
        t = start + tau
        if tau:
            market = market.extended(h.up[t], h.price[t])
        job = JobProgress(work_total_s=work * h.tick_s, work_done_s=0.0,
                          time_left_s=(deadline - tau) * h.tick_s, elapsed_s=tau * h.tick_s,
                          changeover_s=changeover * h.tick_s, tick_s=h.tick_s, mode=Mode.IDLE)
        t0 = time.process_time()
        policy.decide(job, market.view(t))
        out.append(time.process_time() - t0)
    return np.asarray(out)


def main() -> None:
    """Time the plan's refits and the decisions per shape; print the 1,000-job figure."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--start", type=int, default=2900, help="the job's first market row")
    ap.add_argument("--ticks", type=int, default=400, help="decisions timed per job (at most)")
    args = ap.parse_args()
    trace, prices = regime_change_market(seed=0)
    print(f"{'job':>11} {'refit ms':>9} {'table KB':>9} {'plan us':>10} {'max ms':>7} "
          f"{'spotrun us':>10} {'max ms':>7} {'1000 jobs':>10}")
    tick_s = 300.0
    for work_h, factor in SHAPES:
        m = build_model(trace, prices, spot_price_usd_per_hour=None, od_price_usd_per_hour=3.06,
                        work_hours=work_h, deadline_hours=work_h * factor,
                        changeover_hours=0.2)
        shape = (m.work_ticks, m.deadline_ticks, m.changeover_ticks)
        h = m.history
        tick_s = h.tick_s
        t0 = time.process_time()
        table = mk.table_for(grown(h, args.start), args.start, shape)
        refit_ms = (time.process_time() - t0) * 1000.0
        ticks = min(m.deadline_ticks, args.ticks)
        mk_t = decide_times("markov-tiers", h, args.start, shape, ticks)
        sr_t = decide_times("spotrun", h, args.start, shape, ticks)
        per_s = JOBS * sr_t.mean() / tick_s
        print(f"{work_h:4g} h x{factor:<5g} {refit_ms:9.1f} {table.nbytes / 1024:9.0f} "
              f"{mk_t.mean() * 1e6:10.0f} {mk_t.max() * 1e3:7.1f} {sr_t.mean() * 1e6:10.0f} "
              f"{sr_t.max() * 1e3:7.0f} {per_s:8.3f} s/s")
    print(f"\n1000 jobs: CPU seconds per wall second for {JOBS} jobs of that shape under "
          f"spotrun, one decision per {tick_s:g} s (mean over the job's first "
          f"{args.ticks} decisions at most)")


if __name__ == "__main__":
    main()

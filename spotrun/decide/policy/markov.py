"""`markov`: plan the job's exact remaining work and slack on a model of the market seen so far.

A candidate of the `spotrun` policy (spotrun.py), which follows it only where the recent
market's shadow runs show it beats the better simple rule.

- The model (refit every quarter deadline, on a grid of market rows shared by every run):
  over the last deadline's worth of market rows (markets drift; the job's own span is the
  best guess for the job's), a Markov chain of "some pool up" (its up- and down-runs), the
  per-tick reclaim hazard of a job on spot (every pool's reclaims over its up-ticks), the
  chance that some pool is up right after a reclaim, the spot price of the cheapest pool up
  at the refit and the on-demand price. Prior: the provider's mean time between reclaims
  (MarketHistory.mtbf_prior_h, else the packaged priors' pooled figure) as one pseudo-
  reclaim, and one pseudo-outage of a changeover and a tick; a long history outweighs both.
- The plan (markov_dp.py): the expected-cost-optimal action for every (time left, work
  left, placement, some pool up) of the job's shape, by backward induction, on a grid
  coarsened to at most 720 steps of time; one table per refit serves every run of that
  shape, whatever its progress, so live and shadow runs share it.
- Each tick: mid-changeover, carry on; otherwise the table's action for the job's exact
  work and time left. Spot means the cheapest pool up now (the one that has been up
  longest on a tie); a job on spot stays in its pool.
- State: only caches; every choice is a function of the market rows up to the refit and
  the job's shape, so a restarted daemon with the same recorded market decides the same.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from functools import lru_cache

import numpy as np

from spotrun.decide.policy import markov_dp as dp
from spotrun.decide.policy.base import (IDLE, ON_DEMAND, Decision, JobProgress, Mode,
                                        SafePolicy, job_shape)
from spotrun.decide.policy.market import MarketHistory, MarketView

REFITS_PER_DEADLINE = 4
FIT_DEADLINES = 1.0            # the fit's window, in the job's deadlines
PRIOR_RUNS = 1.0
_CACHE_BYTES = 64 * 1024 * 1024   # solved tables kept per market history
_EPS = 1e-9

# Solved tables per history: {(row, work, deadline, changeover): Table}, least recent first.
_TABLES: "weakref.WeakKeyDictionary[MarketHistory, OrderedDict]" = weakref.WeakKeyDictionary()


@lru_cache(maxsize=1)
def packaged_mtbf_h() -> float:
    """Mean hours between reclaims over every family of the packaged priors (the fallback)."""
    from spotrun.costmodel.risk import packaged_trace_priors
    fams = (packaged_trace_priors().get("families") or {}).values()
    hours = sum(float(f["all"]["up_hours"]) for f in fams if "all" in f)
    reclaims = sum(float(f["all"]["reclaims"]) for f in fams if "all" in f)
    return hours / reclaims if reclaims > 0 else 4.0


def refit_ticks(deadline_ticks: int) -> int:
    """Rows between refits: a quarter deadline (at least one row)."""
    return max(1, -(-deadline_ticks // REFITS_PER_DEADLINE))


def _rate(ends: int, exposure: int, prior_ticks: float) -> float:
    """P(a run ends at the next tick): ends over ticks seen, plus pseudo-runs of the prior."""
    w = PRIOR_RUNS
    return min(max((ends + w) / (exposure + w * prior_ticks), 0.0), 1.0)


def fit(h: MarketHistory, row: int, shape: tuple[int, int, int], g: int) -> dp.Chain:
    """The model of the market as known at `row`, at the scale of g-tick steps."""
    work, deadline, changeover = shape
    window = max(2, int(round(deadline * FIT_DEADLINES)))
    lo = max(0, row + 1 - window)
    prior_h = h.mtbf_prior_h or [packaged_mtbf_h()] * len(h.pools)
    mtbf_ticks = float(np.mean(prior_h)) * 3600.0 / h.tick_s
    up = h.up[lo:row + 1]
    x = h.some_up()[0][lo:row + 1]
    on, off = up[:-1], ~x[:-1]
    ended = on & ~up[1:]
    # every pool's up-runs (a spot job's pool), and the runs of "no pool up"
    p_reclaim = _rate(np.count_nonzero(ended), np.count_nonzero(on), mtbf_ticks)
    p_back = _rate(np.count_nonzero(off & x[1:]), np.count_nonzero(off), changeover + 1.0)
    # when a pool's run ends at tick i + 1: is another pool up then, and when the next step
    # starts (a reclaimed job's next decision)?
    i, _ = np.nonzero(ended)
    rho1 = np.count_nonzero(x[i + 1]) / (len(i) + 1.0) if len(h.pools) > 1 else 0.0
    late = i[i + 1 + g < len(x)]
    rho_g = np.count_nonzero(x[late + 1 + g]) / (len(late) + 1.0)
    # per tick: none up -> some up; some up (the pool a launch takes) ends, another may be up
    market = np.array([[1.0 - p_back, p_back],
                       [p_reclaim * (1.0 - rho1), 1.0 - p_reclaim * (1.0 - rho1)]])
    price = h.price_rows[row]
    live = [p for p, u in zip(price, h.up_rows[row]) if u]
    spot_usd = min(live) if live else min(price)
    tick_h = h.tick_s / 3600.0
    od = h.od_price_usd_per_hour
    return dp.Chain(market=np.linalg.matrix_power(market, g),
                    spot=np.array([[(1.0 - p_reclaim) ** g]]),
                    after_reclaim=np.array([1.0 - rho_g, rho_g]),
                    od_usd=g * od * tick_h, spot_usd=g * spot_usd * tick_h,
                    od_launch_usd=changeover * od * tick_h,
                    spot_launch_usd=changeover * spot_usd * tick_h)


def table_for(h: MarketHistory, row: int, shape: tuple[int, int, int]) -> dp.Table:
    """The plan for the job shape from the model fitted at `row` (cached per history)."""
    cache = _TABLES.setdefault(h, OrderedDict())
    key = (row, *shape)
    hit = cache.get(key)
    if hit is not None:
        cache.move_to_end(key)
        return hit
    work, deadline, changeover = shape
    g = dp.step_ticks(deadline, changeover)
    table = dp.solve(work, deadline, changeover, fit(h, row, shape, g), g)
    cache[key] = table
    held = sum(t.nbytes for t in cache.values())
    while held > _CACHE_BYTES and len(cache) > 1:
        _, old = cache.popitem(last=False)
        held -= old.nbytes
    return table


def cheapest_up(market: MarketView) -> int:
    """The cheapest pool up now, the one up longest on a tie; -1 when none is up."""
    best, key = -1, (float("inf"), 0)
    for j, (ok, p) in enumerate(zip(market.up_now(), market.price_now())):
        if ok and (p, -market.age_ticks(j)) < key:
            best, key = j, (p, -market.age_ticks(j))
    return best


class MarkovPolicy(SafePolicy):
    """Follows the plan solved on the market model of the latest refit (a `spotrun` candidate)."""

    name = "markov"

    def __init__(self) -> None:
        self._sizes: tuple[float, float, float, float] | None = None
        self._shape = (0, 0, 0)
        self._grid = 1
        self._key: tuple | None = None
        self._table: dp.Table | None = None

    def table(self, job: JobProgress, market: MarketView) -> dp.Table:
        """The plan in force at this tick (solved at the latest refit row)."""
        sizes = (job.work_total_s, job.deadline_s, job.changeover_s, job.tick_s)
        if sizes != self._sizes:
            self._sizes, self._shape = sizes, job_shape(job)
            self._grid = refit_ticks(self._shape[1])
        key = (market.now // self._grid * self._grid, self._shape)
        if key != self._key or self._table is None:
            self._table = table_for(market.h, key[0], self._shape)
            self._key = key
        return self._table

    def choose(self, job: JobProgress, market: MarketView) -> Decision:
        """See the module docstring."""
        if job.mode is not Mode.IDLE and job.changeover_left_s > _EPS:
            return job.current
        tick = job.tick_s
        table = self.table(job, market)
        best = cheapest_up(market)
        some_up = best >= 0
        state = dp.decision_state(job.mode.value, some_up, 0, table.buckets)
        act = table.action(state, job.time_left_s / tick, job.remaining_s / tick)
        if act == dp.ON_DEMAND:
            return ON_DEMAND
        if act == dp.SPOT:
            if job.mode is Mode.SPOT:
                return job.current
            if some_up:
                return Decision(Mode.SPOT, market.pools[best])
        return IDLE

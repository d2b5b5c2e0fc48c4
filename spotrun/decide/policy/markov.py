"""`markov-tiers`: plan the job's exact remaining work and slack on a model of the market so far.

The plan of `spotrun` (spotrun.py), which follows it unless the recent market's shadow
runs show the better simple rule beating it beyond their noise.

- The model (refit every half deadline, on a grid of market rows shared by every run, and
  at the rows markov_refit.py names: the pools' price order changed, or an outage of every
  pool outlasted twice the model's mean): over the last deadline's worth of market rows
  (markets drift; the job's own span is the best guess for the job's), and at least the
  last 48 h (a short job's span holds too few runs to fit; after a surprise, only the rows
  since the regime change), a Markov chain of the market state: none up, or the cheapest
  price tier with a pool up (pools within 5 % of a tier's cheapest price share it, at most
  4 tiers, priced at the refit; one pool, or flat prices: one tier, "some pool up"),
  fitted on the state's own transitions; per tier, the reclaim hazard of a job on spot
  (the reclaims a job placed the plan's way would have met on the fit's rows, over its
  ticks on spot: pools differ, and it takes the cheapest, longest-up one and stays), the
  market state a step after a reclaim of the tier's pools, and the spot price (its
  cheapest pool up at the refit); the on-demand price. Prior: the provider's mean time
  between reclaims (MarketHistory.mtbf_prior_h, else the packaged priors' pooled figure)
  as one pseudo-reclaim per up-state, and one pseudo-outage of a changeover and a tick; a
  long history outweighs both.
- The plan (markov_dp.py): the expected-cost-optimal action for every (time left, work
  left, placement, market state) of the job's shape, by backward induction, on a grid
  coarsened to at most 720 steps of time; one table per refit serves every run of that
  shape, whatever its progress, so live and shadow runs share it.
- Each tick: mid-changeover, carry on; otherwise the table's action for the job's exact
  work and time left. Spot means the cheapest pool up now in the cheapest tier up (the one
  that has been up longest on a tie); a job on spot stays in its pool.
- State: only caches; every refit row and choice is a function of the market rows up to
  it and the job's shape, so a restarted daemon with the same recorded market decides the
  same.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from functools import lru_cache

import numpy as np

from spotrun.decide.policy import markov_dp as dp
from spotrun.decide.policy.base import (IDLE, ON_DEMAND, Decision, JobProgress, Mode,
                                        SafePolicy, job_shape)
from spotrun.decide.policy.history import MarketHistory, MarketView
from spotrun.decide.policy.markov_refit import (base_row, change_point, first_surprise,
                                                market_states, next_refit, price_tiers)

REFITS_PER_DEADLINE = 2
FIT_DEADLINES = 1.0            # the fit's window, in the job's deadlines
# ... and at least two days of rows: a short job's own span holds too few runs to fit
MIN_FIT_H = 48.0
# More tiers than MAX_TIERS would spread a window's rows too thin.
MAX_TIERS = 4
PRIOR_RUNS = 1.0
_CACHE_BYTES = 64 * 1024 * 1024   # solved tables kept per market history
_EPS = 1e-9

# Solved tables per history: {(row, work, deadline, changeover): Table}, least recent first.
_TABLES: "weakref.WeakKeyDictionary[MarketHistory, OrderedDict]" = weakref.WeakKeyDictionary()


@lru_cache(maxsize=1)
def packaged_mtbf_h() -> float:
    """Mean hours between reclaims over every family of the packaged priors (the fallback)."""
    # lazy: start-up cost (numpy, the priors)
    from spotrun.costmodel.risk import packaged_trace_priors
    fams = (packaged_trace_priors().get("families") or {}).values()
    hours = sum(float(f["all"]["up_hours"]) for f in fams if "all" in f)
    reclaims = sum(float(f["all"]["reclaims"]) for f in fams if "all" in f)
    return hours / reclaims if reclaims > 0 else 4.0


def refit_ticks(deadline_ticks: int) -> int:
    """Rows between refits: half a deadline (at least one row)."""
    return max(1, -(-deadline_ticks // REFITS_PER_DEADLINE))


def _rate(ends: int, exposure: int, prior_ticks: float) -> float:
    """P(a run ends at the next tick): ends over ticks seen, plus PRIOR_RUNS pseudo-runs of the prior."""
    w = PRIOR_RUNS
    return min(max((ends + w) / (exposure + w * prior_ticks), 0.0), 1.0)


def placed_reclaims(up: np.ndarray, price: np.ndarray, age: np.ndarray) -> tuple[int, int]:
    """(reclaims, ticks on spot) of a job that, whenever a pool is up, takes the cheapest one
    up (the one up longest on a tie, `age` as MarketHistory.ages: as `cheapest_up`) and stays
    until it is reclaimed."""
    n = len(up)
    some_up = np.flatnonzero(up[:-1].any(axis=1))
    ends = ticks = r = 0
    # one pass per placement: a window holds a few dozen reclaims, not thousands of rows
    while (k := int(np.searchsorted(some_up, r))) < len(some_up):
        r = int(some_up[k])
        pools = np.flatnonzero(up[r])
        j = int(pools[np.lexsort((-age[r, pools], price[r, pools]))[0]])
        down = np.flatnonzero(~up[r + 1:, j])
        if not len(down):                # still up at the window's end
            return ends, ticks + n - 1 - r
        ticks += 1 + int(down[0])
        ends += 1
        r += 1 + int(down[0])
    return ends, ticks


def fit(h: MarketHistory, row: int, shape: tuple[int, int, int], g: int,
        max_tiers: int = MAX_TIERS, surprise: bool = False,
        rows: tuple[int, int] | None = None) -> dp.Chain:
    """The model of the market as known at `row`, at the scale of g-tick steps.

    `rows` (lo, hi): fit the transitions on rows lo..hi-1 instead of the window ending at
    `row` (the benchmark's whole-trace reference; a policy never passes it)."""
    work, deadline, changeover = shape
    window = max(2, int(round(deadline * FIT_DEADLINES)), int(MIN_FIT_H * 3600.0 / h.tick_s))
    lo, hi = rows if rows is not None else (max(0, row + 1 - window), row + 1)
    prior_h = np.asarray(h.mtbf_prior_h or [packaged_mtbf_h()] * len(h.pools), dtype=float)
    mtbf_ticks = prior_h * 3600.0 / h.tick_s
    tier_of = price_tiers(h.price_rows[row], max_tiers)
    tiers = np.asarray(tier_of)
    T = int(tiers.max()) + 1
    M = T + 1
    up, prices, ages = h.up[lo:hi], h.price[lo:hi], h.ages[lo:hi]
    m = market_states(up, tier_of)
    if surprise:          # a regime change: fit only the rows after it
        cut = change_point(m, M)
        up, prices, ages, m = up[cut:], prices[cut:], ages[cut:], m[cut:]
    # the market's own transitions, plus one pseudo-run per state: an outage of a
    # changeover and a tick, an up-state of the provider's mean time between reclaims
    counts = np.zeros((M, M))
    np.add.at(counts, (m[:-1], m[1:]), 1.0)
    for a in range(M):
        length = changeover + 1.0 if a == 0 else float(np.mean(mtbf_ticks[tiers == a - 1]))
        counts[a, a] += PRIOR_RUNS * (length - 1.0)
        counts[a, [b for b in range(M) if b != a]] += PRIOR_RUNS / (M - 1)
    market = counts / counts.sum(axis=1, keepdims=True)
    on = up[:-1]
    ended = on & ~up[1:]
    spot = np.zeros((T, T))
    after = np.zeros((T, M))
    i, j = np.nonzero(ended)
    for t in range(T):
        in_t = tiers == t
        # the reclaims a job placed the plan's way would have met: pools differ, and the
        # plan takes the cheapest, longest-up one (their pooled rate overstates its risk)
        ends, ticks = placed_reclaims(up[:, in_t], prices[:, in_t], ages[:, in_t])
        spot[t, t] = (1.0 - _rate(ends, ticks, float(np.mean(mtbf_ticks[in_t])))) ** g
        # the market state when the next step starts after a reclaim of this tier's pool
        # (one pseudo-observation of none up)
        late = i[in_t[j] & (i + 1 + g < len(m))]
        np.add.at(after[t], m[late + 1 + g], 1.0)
        after[t, 0] += 1.0
        after[t] /= after[t].sum()
    # a tier's price: its cheapest pool up at the refit (with none up, its cheapest pool)
    price = np.asarray(h.price_rows[row])
    live = np.asarray(h.up_rows[row])
    tier_usd = np.array([price[(tiers == t) & live].min() if ((tiers == t) & live).any()
                         else price[tiers == t].min() for t in range(T)])
    tick_h = h.tick_s / 3600.0
    od = h.od_price_usd_per_hour
    return dp.Chain(market=np.linalg.matrix_power(market, g), spot=spot, after_reclaim=after,
                    od_usd=g * od * tick_h, spot_usd=g * tier_usd * tick_h,
                    od_launch_usd=changeover * od * tick_h,
                    spot_launch_usd=changeover * tier_usd * tick_h, tier_of=tier_of,
                    outage_ticks=float(1.0 / max(1.0 - market[0, 0], _EPS)))


def table_for(h: MarketHistory, row: int, shape: tuple[int, int, int],
              max_tiers: int = MAX_TIERS, surprise: bool = False,
              rows: tuple[int, int] | None = None) -> dp.Table:
    """The plan for the job shape from the model fitted at `row` (cached per history)."""
    cache = _TABLES.setdefault(h, OrderedDict())
    key = (row, *shape, max_tiers, surprise, rows)
    hit = cache.get(key)
    if hit is not None:
        cache.move_to_end(key)
        return hit
    work, deadline, changeover = shape
    g = dp.step_ticks(deadline, changeover)
    chain = fit(h, row, shape, g, max_tiers, surprise, rows)
    table = dp.solve(work, deadline, changeover, chain, g)
    cache[key] = table
    held = sum(t.nbytes for t in cache.values())
    while held > _CACHE_BYTES and len(cache) > 1:
        _, old = cache.popitem(last=False)
        held -= old.nbytes
    return table


def cheapest_up(market: MarketView, tier_of: tuple[int, ...]) -> tuple[int, int]:
    """(market state, pool): the cheapest tier with a pool up, and its cheapest pool now
    (the one up longest on a tie); (0, -1) when none is up."""
    best, key = -1, (len(tier_of), float("inf"), 0)
    for j, (ok, p) in enumerate(zip(market.up_now(), market.price_now())):
        if ok and (tier_of[j], p, -market.age_ticks(j)) < key:
            best, key = j, (tier_of[j], p, -market.age_ticks(j))
    return (0, -1) if best < 0 else (1 + tier_of[best], best)


class MarkovTiersPolicy(SafePolicy):
    """Follows the plan solved on the market model of the latest refit (`spotrun`'s plan).

    The pools are in price tiers: it may wait for a cheaper pool while a dearer one is up."""

    name = "markov-tiers"
    max_tiers = MAX_TIERS

    def __init__(self) -> None:
        self._sizes: tuple[float, float, float, float] | None = None
        self._shape = (0, 0, 0)
        self._grid = 1
        self._key: tuple | None = None
        self._table: dp.Table | None = None
        self._scanned = -1          # the last row looked at for a surprise
        # the table holds for rows _scanned.._until-1 of history _h: no refit and no
        # surprise falls there (so a tick between costs one comparison, not a search). On a
        # recorded market _until may lie past now: it says only when to look again, and the
        # table returned is still the one the rows up to now give. A weak reference: the
        # daemon replaces its history each interval, and frees the old one
        self._h: weakref.ref | None = None
        self._until = -1

    def table(self, job: JobProgress, market: MarketView) -> dp.Table:
        """The plan in force at this tick (solved at the latest refit row)."""
        sizes = (job.work_total_s, job.deadline_s, job.changeover_s, job.tick_s)
        h, now = market.h, market.now
        if (sizes == self._sizes and self._h is not None and self._h() is h
                and self._scanned <= now < self._until):
            return self._table                                  # type: ignore[return-value]
        if sizes != self._sizes:
            self._sizes, self._shape = sizes, job_shape(job)
            self._grid = refit_ticks(self._shape[1])
        key = (base_row(h, now, self._grid, self.max_tiers), self._shape)
        if key != self._key or self._table is None:
            self._table = table_for(h, key[0], self._shape, self.max_tiers)
            self._key, self._scanned = key, key[0]
        # surprises since: each refits, and the next is looked for under the new model
        while self._scanned < now:
            t = self._table
            x = first_surprise(h, t.tier_of, t.outage_ticks, self._scanned + 1, now)
            if x < 0:
                self._scanned = now
            else:
                self._table = table_for(h, x, self._shape, self.max_tiers, surprise=True)
                self._scanned = x
        t = self._table
        until = min(next_refit(h, now, self._grid, self.max_tiers), len(h))
        nxt = first_surprise(h, t.tier_of, t.outage_ticks, now + 1, until - 1)
        self._h, self._until = weakref.ref(h), until if nxt < 0 else nxt
        return t

    def choose(self, job: JobProgress, market: MarketView) -> Decision:
        """See the module docstring."""
        if job.mode is not Mode.IDLE and job.changeover_left_s > _EPS:
            return job.current
        tick = job.tick_s
        table = self.table(job, market)
        m, best = cheapest_up(market, table.tier_of)
        tier = table.tier_of[market.pools.index(job.pool)] if job.mode is Mode.SPOT else 0
        state = dp.decision_state(job.mode.value, m, tier, table.tiers)
        act = table.action(state, job.time_left_s / tick, job.remaining_s / tick)
        if act == dp.ON_DEMAND:
            return ON_DEMAND
        if act == dp.SPOT:
            if job.mode is Mode.SPOT:
                return job.current
            if best >= 0:
                return Decision(Mode.SPOT, market.pools[best])
        return IDLE


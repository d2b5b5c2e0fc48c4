"""spotrun's own policy: multi-pool, deadline-aware, driven by the observed market."""

from __future__ import annotations

import numpy as np

from spotrun.policy.base import Decision, IDLE, JobProgress, Mode, ON_DEMAND, SafePolicy
from spotrun.policy.market import MarketView


class _PoolModel:
    """What a pool's past says about its up-stretches (cached until the next reclaim)."""

    __slots__ = ("n", "lengths", "tail_sum", "prod_fraction")

    def __init__(self, market: MarketView, j: int, changeover_ticks: float) -> None:
        lengths = np.sort(market.up_stretches(j))
        self.n = len(lengths)
        self.lengths = lengths
        # suffix sums for E[S | S > a]
        self.tail_sum = np.concatenate([np.cumsum(lengths[::-1])[::-1], [0.0]])
        seen = market.now + 1
        self.prod_fraction = float(np.maximum(lengths - changeover_ticks, 0).sum()) / seen

    def median_remaining(self, age: int) -> float:
        """Median of stretch - age over stretches longer than age; age when none was seen."""
        i = int(np.searchsorted(self.lengths, age, side="right"))
        if i >= self.n:
            return float(age)
        return float(np.median(self.lengths[i:])) - age

    def expected_remaining(self, age: int) -> float:
        """E[stretch - age | stretch > age] in ticks; `age` itself when nothing longer was seen."""
        i = int(np.searchsorted(self.lengths, age, side="right"))
        k = self.n - i
        if k == 0:
            return float(age)
        return float(self.tail_sum[i]) / k - age


class SpotrunPolicy(SafePolicy):
    """Multi-pool, deadline-aware policy (the daemon's default)."""

    name = "spotrun"

    def __init__(self, beta: float = 0.0, h: float = 3.0, move: float = 0.0) -> None:
        self.beta, self.h, self.move = beta, h, move
        self._models: dict[int, tuple[int, _PoolModel]] = {}

    def _model(self, market: MarketView, j: int, c_ticks: float) -> _PoolModel:
        count = market.reclaims(j)
        hit = self._models.get(j)
        if hit is None or hit[0] != count:
            hit = (count, _PoolModel(market, j, c_ticks))
            self._models[j] = hit
        return hit[1]

    def choose(self, job: JobProgress, market: MarketView) -> Decision:
        """Stay on spot; else launch the best pool; on-demand when slack nears the reserve."""
        tick = job.tick_s
        c = job.changeover_s / tick
        r = job.remaining_s / tick
        slack = job.slack_s / tick
        up = market.up_now()
        price = market.price_now()
        on_spot = job.mode is Mode.SPOT
        if on_spot and not self.move:
            return job.current
        best_j, best_cost, best_prod, need = -1, float("inf"), 0.0, float("inf")
        for j, ok in enumerate(up):
            m = self._model(market, j, c)
            seen = market.now + 1
            a = (market.uptime_fraction(j) * seen + 1) / (seen + 2)
            rho = (market.reclaims(j) + 1) / (a * seen + 1)
            need = min(need, rho * (c + 1) + self.beta * (1 - a) / a)
            if not ok:
                continue
            rem = m.expected_remaining(market.age_ticks(j))
            prod = max(rem - c, 0.5)
            cost = price[j] * (1.0 + c / prod)
            if cost < best_cost:
                best_j, best_cost, best_prod = j, cost, prod
        if on_spot:
            i = market.pools.index(job.pool)
            med = self._model(market, best_j, c).median_remaining(market.age_ticks(best_j))
            if best_j != i and (price[i] - price[best_j]) * min(med - c, r) > \
                    self.move * c * price[best_j] and slack - (c + 1) >= r * need + c + 1:
                return Decision(Mode.SPOT, market.pools[best_j])
            return job.current
        reserve = r * need + (c + 1)
        if best_j >= 0:
            if job.mode is Mode.ON_DEMAND and slack - (c + 1) < reserve:
                return ON_DEMAND
            return Decision(Mode.SPOT, market.pools[best_j])
        hold = self.h * c if job.mode is Mode.ON_DEMAND else 0.0
        if slack <= reserve + hold:
            return ON_DEMAND
        return IDLE

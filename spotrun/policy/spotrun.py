"""spotrun's own policy: multi-pool, deadline-aware, driven by the observed market.

Everything it uses is known at run time: each pool's history so far (up-stretch
lengths, reclaims per up tick), prices now, and the job's progress and deadline.
No constant is fitted to a trace; the only scales are the changeover and the tick.

- Pool choice: the lowest expected cost per productive tick,
  price x (1 + changeover / expected productive run), where the expected run is
  E[stretch - age | stretch > age] from that pool's completed up-stretches (heavy
  tails make a stretch that has lasted long likely to last longer).
- Slack reserve: the remaining work, run on spot, is expected to lose
  remaining x (reclaims per up tick) x (changeover + 1) ticks; plus one relaunch.
- Spot down: wait while the slack exceeds the reserve, else on-demand; once on
  on-demand, stay there until spot is back (each hop pays a changeover).
- Spot up: launch it; from on-demand only if the slack after the changeover still
  covers the reserve. On spot, stay, unless another pool is cheaper by more than two
  changeovers' worth (money and slack) over its median remaining stretch.
"""

from __future__ import annotations

import numpy as np

from spotrun.policy.base import Decision, IDLE, JobProgress, Mode, ON_DEMAND, SafePolicy
from spotrun.policy.market import MarketView


class _PoolModel:
    """What a pool's completed up-stretches say (rebuilt only after a new reclaim)."""

    __slots__ = ("n", "lengths", "tail_sum")

    def __init__(self, market: MarketView, j: int) -> None:
        self.lengths = np.sort(market.up_stretches(j))
        self.n = len(self.lengths)
        self.tail_sum = np.concatenate([np.cumsum(self.lengths[::-1])[::-1], [0.0]])

    def expected_remaining(self, age: int) -> float:
        """E[stretch - age | stretch > age] in ticks; `age` when nothing longer was seen."""
        i = int(np.searchsorted(self.lengths, age, side="right"))
        k = self.n - i
        return float(age) if k == 0 else float(self.tail_sum[i]) / k - age

    def median_remaining(self, age: int) -> float:
        """Median of stretch - age over stretches longer than age; `age` when none."""
        i = int(np.searchsorted(self.lengths, age, side="right"))
        return float(age) if i >= self.n else float(np.median(self.lengths[i:])) - age


class SpotrunPolicy(SafePolicy):
    """Multi-pool, deadline-aware policy (the daemon's default)."""

    name = "spotrun"

    # A move between spot pools pays one changeover in money and one in slack.
    MOVE_CHANGEOVERS = 2.0

    def __init__(self) -> None:
        self._models: dict[int, tuple[int, _PoolModel]] = {}

    def _model(self, market: MarketView, j: int) -> _PoolModel:
        count = market.reclaims(j)
        hit = self._models.get(j)
        if hit is None or hit[0] != count:
            hit = (count, _PoolModel(market, j))
            self._models[j] = hit
        return hit[1]

    def choose(self, job: JobProgress, market: MarketView) -> Decision:
        """See the module docstring."""
        tick = job.tick_s
        c = job.changeover_s / tick
        r = job.remaining_s / tick
        slack = job.slack_s / tick
        up = market.up_now()
        price = market.price_now()
        seen = market.now + 1
        best_j, best_cost, loss_per_tick = -1, float("inf"), float("inf")
        for j, ok in enumerate(up):
            up_ticks = market.uptime_fraction(j) * seen
            # reclaims per up tick, with one pseudo-observation so a fresh pool is not "safe"
            loss_per_tick = min(loss_per_tick,
                                (market.reclaims(j) + 1) / (up_ticks + 1) * (c + 1))
            if not ok:
                continue
            run = self._model(market, j).expected_remaining(market.age_ticks(j))
            cost = price[j] * (1.0 + c / max(run - c, 0.5))
            if cost < best_cost:
                best_j, best_cost = j, cost
        reserve = r * loss_per_tick + (c + 1)
        if job.mode is Mode.SPOT:
            return self._maybe_move(job, market, best_j, c, r, slack, reserve)
        if best_j >= 0:
            if job.mode is Mode.ON_DEMAND and slack - (c + 1) < reserve:
                return ON_DEMAND
            return Decision(Mode.SPOT, market.pools[best_j])
        if job.mode is Mode.ON_DEMAND or slack <= reserve:
            return ON_DEMAND
        return IDLE

    def _maybe_move(self, job: JobProgress, market: MarketView, best_j: int, c: float,
                    r: float, slack: float, reserve: float) -> Decision:
        """Stay on the current pool unless a move clearly pays for itself."""
        i = market.pools.index(job.pool or "")
        if best_j < 0 or best_j == i or slack - (c + 1) < reserve:
            return job.current
        price = market.price_now()
        run = self._model(market, best_j).median_remaining(market.age_ticks(best_j))
        gain = (price[i] - price[best_j]) * min(run - c, r)
        if gain > self.MOVE_CHANGEOVERS * c * price[best_j]:
            return Decision(Mode.SPOT, market.pools[best_j])
        return job.current

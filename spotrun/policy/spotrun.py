"""spotrun's own policy: multi-pool, deadline-aware, driven by the observed market.

Everything it uses is known at run time: each pool's history so far (up- and
down-time, reclaims, up-stretch lengths), prices now, and the job's progress and
deadline. The scales are the job's own: changeover, tick, remaining work, slack.

- Slack reserve. Doing the remaining work r on spot is expected to cost
  r x k ticks of slack, k = observed waiting per up tick (no pool up) plus the
  best pool's reclaim losses ((changeover + 1) per reclaim) per productive tick.
  The reserve is r x min(k / 4, s0) + changeover + 1, s0 = the job's initial slack
  per unit of work: a quarter of the expected need (waiting is heavy-tailed: the
  mean is set by a few long outages), and never more than Uniform Progress keeps
  (its straight line holds r x s0), so tight deadlines behave like it.
- Spot down: wait while the slack exceeds the reserve, else on-demand; on
  on-demand, stay there until spot is back.
- Spot up: take the cheapest pool (equal prices: the one whose current stretch
  is expected to last longest). From on-demand only when the stretch is expected
  to pay: its productive ticks at the on-demand price beat its paid ticks at the
  spot price by more than a changeover on on-demand (the way back).
- On spot: stay until reclaimed, unless the slack covers the reserve and a
  cheaper pool's median remaining stretch saves more than two changeovers.
"""

from __future__ import annotations

import numpy as np

from spotrun.policy.base import Decision, IDLE, JobProgress, Mode, ON_DEMAND, SafePolicy
from spotrun.policy.market import MarketView

# Share of the expected slack need to reserve (see the module docstring).
RESERVE_SHARE = 0.25
# A move between spot pools pays one changeover in money and one in slack.
MOVE_CHANGEOVERS = 2.0


class _PoolModel:
    """What a pool's completed up-stretches say (rebuilt only after a new reclaim)."""

    __slots__ = ("n", "lengths", "tail_sum")

    def __init__(self, market: MarketView, j: int) -> None:
        self.lengths = np.sort(market.up_stretches(j)).astype(np.float64)
        self.n = len(self.lengths)
        self.tail_sum = np.concatenate([np.cumsum(self.lengths[::-1])[::-1], [0.0]])

    def _longer(self, age: int) -> int:
        return int(np.searchsorted(self.lengths, age, side="right"))

    def expected_remaining(self, age: int) -> float:
        """E[stretch - age | stretch > age] in ticks; `age` when nothing longer was seen."""
        i = self._longer(age)
        k = self.n - i
        return float(age) if k == 0 else float(self.tail_sum[i]) / k - age

    def median_remaining(self, age: int) -> float:
        """Median of stretch - age over stretches longer than age; `age` when none."""
        i = self._longer(age)
        return float(age) if i >= self.n else float(np.median(self.lengths[i:])) - age

    def launch_ticks(self, age: int, c: float, r: float) -> tuple[float, float]:
        """(paid, productive) ticks expected from a launch now, capped at the work left."""
        i = self._longer(age)
        if i >= self.n:
            paid = min(float(age), r + c)
            return paid, max(paid - c, 0.0)
        rem = np.minimum(self.lengths[i:] - age, r + c)
        return float(rem.mean()), float(np.maximum(rem - c, 0.0).mean())


class SpotrunPolicy(SafePolicy):
    """Multi-pool, deadline-aware policy (the daemon's default)."""

    name = "spotrun"

    def __init__(self) -> None:
        self._models: dict[int, tuple[int, _PoolModel]] = {}
        self._none_up = 0        # observed ticks with no pool up, rows 0.._last
        self._last = -1

    def _model(self, market: MarketView, j: int) -> _PoolModel:
        count = market.reclaims(j)
        hit = self._models.get(j)
        if hit is None or hit[0] != count:
            hit = (count, _PoolModel(market, j))
            self._models[j] = hit
        return hit[1]

    def _count_none_up(self, market: MarketView) -> int:
        """Ticks 0..now with no pool up (incremental; recounted if `now` went back)."""
        now = market.now
        if now < self._last:
            self._none_up, self._last = 0, -1
        if now > self._last:
            lo = self._last + 1
            any_up = np.zeros(now + 1 - lo, dtype=bool)
            for j in range(len(market.pools)):
                any_up |= market.up_history(j)[lo:]
            self._none_up += int((~any_up).sum())
            self._last = now
        return self._none_up

    def slack_per_work(self, market: MarketView, c: float) -> float:
        """Expected slack ticks spent per productive spot tick: waiting plus reclaims."""
        seen = market.now + 1
        none_up = self._count_none_up(market)
        # one pseudo-observation each, so a short history is not read as "always up"
        wait = (none_up + 1) / max(seen - none_up, 1)
        loss = float("inf")
        for j in range(len(market.pools)):
            up_ticks = market.uptime_fraction(j) * seen
            n = market.reclaims(j) + 1
            loss = min(loss, n * (c + 1) / max(up_ticks - n * c, 1.0))
        return wait + loss

    def reserve_ticks(self, job: JobProgress, market: MarketView) -> float:
        """Slack (ticks) to keep for the remaining work's expected waiting and reclaims."""
        c = job.changeover_s / job.tick_s
        r = job.remaining_s / job.tick_s
        s0 = (job.deadline_s - job.work_total_s - job.changeover_s) / job.work_total_s
        share = min(RESERVE_SHARE * self.slack_per_work(market, c), max(s0, 0.0))
        return r * share + c + 1

    def choose(self, job: JobProgress, market: MarketView) -> Decision:
        """See the module docstring."""
        tick = job.tick_s
        c = job.changeover_s / tick
        r = job.remaining_s / tick
        slack = job.slack_s / tick
        reserve = self.reserve_ticks(job, market)
        if job.mode is Mode.SPOT:
            return self._maybe_move(job, market, c, r, slack - (c + 1) >= reserve)
        best_j = self._cheapest_up(market)
        if best_j >= 0:
            if job.mode is Mode.ON_DEMAND:
                paid, prod = self._model(market, best_j).launch_ticks(
                    market.age_ticks(best_j), c, r)
                od, spot = market.od_price_usd_per_hour, market.price_now()[best_j]
                if prod * od - paid * spot <= c * od:
                    return ON_DEMAND
            return Decision(Mode.SPOT, market.pools[best_j])
        if job.mode is Mode.ON_DEMAND or slack <= reserve:
            return ON_DEMAND
        return IDLE

    def _cheapest_up(self, market: MarketView) -> int:
        """Index of the cheapest pool up now (ties: longest expected stretch), or -1."""
        price = market.price_now()
        best_j, best_key = -1, (float("inf"), 0.0)
        for j, ok in enumerate(market.up_now()):
            if not ok or price[j] > best_key[0]:
                continue
            key = (price[j], -self._model(market, j).expected_remaining(market.age_ticks(j)))
            if key < best_key:
                best_j, best_key = j, key
        return best_j

    def _maybe_move(self, job: JobProgress, market: MarketView, c: float, r: float,
                    slack_ok: bool) -> Decision:
        """Stay on the current pool unless a cheaper one clearly pays for the move."""
        if not slack_ok:
            return job.current
        price = market.price_now()
        i = market.pools.index(job.pool or "")
        best_j, best_price = -1, price[i]
        for j, ok in enumerate(market.up_now()):
            if ok and price[j] < best_price:
                best_j, best_price = j, price[j]
        if best_j < 0:
            return job.current
        run = self._model(market, best_j).median_remaining(market.age_ticks(best_j))
        gain = (price[i] - best_price) * min(run - c, r)
        if gain > MOVE_CHANGEOVERS * c * best_price:
            return Decision(Mode.SPOT, market.pools[best_j])
        return job.current

"""`reserve`: a multi-pool, deadline-aware policy with a slack reserve, from the observed market.

Issue 7's `spotrun`, then a candidate of issue 14's rule-first selector; kept as a named
policy (the one that moves a running job from one spot pool to another; docs/simulate.md).

Everything it uses is known at run time: each pool's history so far (up- and
down-time, reclaims, up-stretch lengths), prices now, and the job's progress and
deadline. The scales are the job's own: changeover, tick, remaining work, slack.

- Slack reserve. Once the slack is down to the reserve, outages are bridged on
  on-demand, so from then on waiting costs no slack; what still does is spot's
  reclaims: each loses its tick and pays the relaunch's changeover. The reserve
  is r x min(l, s0) + changeover + 1: l = reclaims ((changeover + 1) each) per
  productive tick of the steadiest pool over the last deadline's worth of
  history (markets drift; the last span as long as the job's is the best guess
  for the job's), s0 = the job's initial slack per unit of work (never more than
  Uniform Progress keeps: its straight line holds r x s0).
- Spot down: wait while the slack exceeds the reserve, else on-demand; on
  on-demand, stay there until spot is back.
- Spot up: take the pool with the lowest expected price per productive tick,
  price x paid / productive ticks of a launch now, from all pools' completed
  up-stretches longer than that pool's current age (heavy tails: a stretch that
  has lasted is likely to last), weighted by the pool's own odds of outliving
  its current age. From on-demand only when the stretch is expected
  to pay: its productive ticks at the on-demand price beat its paid ticks at the
  spot price by more than a changeover on on-demand (the way back).
- Several pools, slack beyond the full expected need (r x (waiting + l)): from
  idle, launch only on a stretch older than a gate (1..16 changeovers, the
  largest whose waits for the expected launches fit that spare slack), so the
  launch lands on a stretch that has shown it lasts; a launch's changeover is the
  main cost once slack is ample. Reclaims come in waves across pools, so a gated
  launch also waits until no pool as cheap as the chosen one has been reclaimed
  within the last changeover + 1 ticks (a launch whose changeover overlaps the
  wave is the one most likely lost); that wait is counted in the gate's budget.
- On spot: stay until reclaimed, unless the slack covers the reserve and a
  cheaper pool's median remaining stretch saves more than two changeovers.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from spotrun.decide.policy.base import Decision, IDLE, JobProgress, Mode, ON_DEMAND, SafePolicy
from spotrun.decide.policy.history import MarketView

# A move between spot pools pays one changeover in money and one in slack.
MOVE_CHANGEOVERS = 2.0
# Gates tried, largest first, in changeovers (powers of two up to 16).
GATE_CHANGEOVERS = (16.0, 8.0, 4.0, 2.0, 1.0)


class _PoolModel:
    """What a pool's completed up-stretches say (rebuilt only after a new reclaim)."""

    __slots__ = ("n", "lengths", "tail_sum")

    def __init__(self, market: MarketView, pools: Iterable[int]) -> None:
        self.lengths = np.sort(np.concatenate(
            [market.up_stretches(j) for j in pools])).astype(np.float64)
        self.n = len(self.lengths)
        self.tail_sum = np.concatenate([np.cumsum(self.lengths[::-1])[::-1], [0.0]])

    def _longer(self, age: float) -> int:
        return int(np.searchsorted(self.lengths, age, side="right"))

    def longer_than(self, ticks: float) -> int:
        """How many observed stretches lasted more than `ticks`."""
        return self.n - self._longer(ticks)

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


class ReservePolicy(SafePolicy):
    """Multi-pool, deadline-aware policy with a slack reserve (issue 7's `spotrun`)."""

    name = "reserve"

    def __init__(self) -> None:
        self._models: dict[int, tuple[int, _PoolModel]] = {}
        self._pooled_model: tuple[int, _PoolModel] | None = None
        self._cum_none = [0]     # [t]: observed ticks 0..t-1 with no pool up, t <= _last + 1
        self._last = -1

    def _model(self, market: MarketView, j: int) -> _PoolModel:
        count = market.reclaims(j)
        hit = self._models.get(j)
        if hit is None or hit[0] != count:
            hit = (count, _PoolModel(market, [j]))
            self._models[j] = hit
        return hit[1]

    def _none_up_before(self, market: MarketView, t: int) -> int:
        """Observed ticks 0..t-1 with no pool up (kept incrementally; rebuilt if `now` fell)."""
        now = market.now
        if now < self._last:
            self._cum_none, self._last = [0], -1
        if now > self._last:
            lo = self._last + 1
            any_up = np.zeros(now + 1 - lo, dtype=bool)
            for j in range(len(market.pools)):
                any_up |= market.up_history(j)[lo:]
            self._cum_none.extend((self._cum_none[-1] + np.cumsum(~any_up)).tolist())
            self._last = now
        return self._cum_none[t]

    def slack_per_work(self, market: MarketView, c: float, window: int) -> float:
        """Expected slack ticks spent per productive spot tick: waiting plus reclaims.

        Measured over the last `window` ticks (the job's deadline: the market of the
        last such span is the best guess for the next one).
        """
        now = market.now
        lo = max(0, now + 1 - max(window, 1))
        seen = now + 1 - lo
        none_up = self._none_up_before(market, now + 1) - self._none_up_before(market, lo)
        # one pseudo-observation each, so a short history is not read as "always up"
        wait = (none_up + 1) / max(seen - none_up, 1)
        return wait + self.reclaim_loss_per_work(market, c, window)

    @staticmethod
    def _pool_counts(market: MarketView, window: int) -> list[tuple[float, int]]:
        """Per pool, over the last `window` ticks: (up ticks, reclaims + 1 pseudo-reclaim)."""
        now = market.now
        lo = max(0, now + 1 - max(window, 1))
        cum_up = market.h.cum_up
        before = market.h.view(lo - 1) if lo > 0 else None
        out = []
        for j in range(len(market.pools)):
            up_ticks = float(cum_up[now, j] - (cum_up[lo - 1, j] if lo > 0 else 0))
            n = market.reclaims(j) - (before.reclaims(j) if before is not None else 0) + 1
            out.append((up_ticks, n))
        return out

    @staticmethod
    def _window(job: JobProgress) -> int:
        """The job's deadline in ticks: how far back the market statistics look."""
        return int(round(job.deadline_s / job.tick_s))

    def reclaim_loss_per_work(self, market: MarketView, c: float, window: int) -> float:
        """Slack ticks the steadiest pool's reclaims cost per productive tick (last `window`)."""
        return min(n * (c + 1) / max(up_ticks - n * c, 1.0)
                   for up_ticks, n in self._pool_counts(market, window))

    def reserve_ticks(self, job: JobProgress, market: MarketView) -> float:
        """Slack (ticks) to keep for the remaining work's reclaims once outages are bridged."""
        c = job.changeover_s / job.tick_s
        r = job.remaining_s / job.tick_s
        s0 = (job.deadline_s - job.work_total_s - job.changeover_s) / job.work_total_s
        loss = self.reclaim_loss_per_work(market, c, self._window(job))
        return r * min(loss, max(s0, 0.0)) + c + 1

    def choose(self, job: JobProgress, market: MarketView) -> Decision:
        """See the module docstring."""
        tick = job.tick_s
        c = job.changeover_s / tick
        r = job.remaining_s / tick
        slack = job.slack_s / tick
        reserve = self.reserve_ticks(job, market)
        if job.mode is Mode.SPOT:
            return self._maybe_move(job, market, c, r, slack - (c + 1) >= reserve)
        best_j = self._best_up(market, c, r)
        if best_j >= 0:
            if job.mode is Mode.IDLE:
                gate = self._gate_ticks(job, market, c, r)
                if gate > 0 and (market.age_ticks(best_j) < gate
                                 or self._calm_ticks(market, best_j) < self._settle_ticks(c)):
                    return IDLE
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

    def _pooled(self, market: MarketView) -> _PoolModel:
        """Up-stretches of all pools together (the age effect is common to all)."""
        key = sum(market.reclaims(j) for j in range(len(market.pools)))
        if self._pooled_model is None or self._pooled_model[0] != key:
            self._pooled_model = (key, _PoolModel(market, range(len(market.pools))))
        return self._pooled_model[1]

    def _best_up(self, market: MarketView, c: float, r: float) -> int:
        """The pool up now with the lowest expected price per productive tick, or -1."""
        price = market.price_now()
        up = market.up_now()
        if sum(up) <= 1:
            return up.index(True) if any(up) else -1
        model = self._pooled(market)
        best_j, best = -1, float("inf")
        for j, ok in enumerate(up):
            if ok:
                age = market.age_ticks(j)
                paid, prod = model.launch_ticks(age, c, r)
                # the pool's own odds of outliving this age (one pseudo-survivor): a pool
                # whose stretches all end young is not judged by the others' long ones
                own = self._model(market, j)
                live = (own.longer_than(age) + 1) / (own.longer_than(age - 1) + 1)
                paid, prod = live * paid + (1.0 - live), live * prod
                cost = price[j] * paid / max(prod, 0.5)
                if cost < best:
                    best_j, best = j, cost
        return best_j

    def _gate_ticks(self, job: JobProgress, market: MarketView, c: float, r: float) -> float:
        """How old a stretch must be before a launch from idle: spare slack spent on waiting.

        Only with several pools (waiting lets the one that lasts show itself). Spare =
        slack beyond the full expected need; each expected launch may wait the gate
        (twice when a single pool is up: it may end and leave nothing to launch on).
        """
        if len(market.pools) < 2:
            return 0.0
        window = self._window(job)
        spare = job.slack_s / job.tick_s - r * self.slack_per_work(market, c, window) - (c + 1)
        if spare <= 0:
            return 0.0
        # reclaims per productive tick of the steadiest pool: launches still to come
        rate = min(n / max(up_ticks - n * c, 1.0)
                   for up_ticks, n in self._pool_counts(market, window))
        waits = (1.0 + r * rate) * (1.0 if sum(market.up_now()) >= 2 else 2.0)
        model = self._pooled(market)
        settle = self._settle_ticks(c)
        for mult in GATE_CHANGEOVERS:
            gate = mult * c
            # never wait for an age that no observed stretch outlived by a changeover
            if (gate + settle) * waits <= spare and model.longer_than(gate + c) > 0:
                return gate
        return 0.0

    @staticmethod
    def _settle_ticks(c: float) -> float:
        """Quiet ticks a gated launch waits for after a reclaim wave: its changeover + 1."""
        return c + 1.0

    @staticmethod
    def _calm_ticks(market: MarketView, j: int) -> float:
        """Ticks since the last reclaim of any pool priced no higher than pool j now."""
        price = market.price_now()
        since = float("inf")
        for k, p in enumerate(price):
            if p <= price[j]:
                last = market.last_reclaim_tick(k)
                if last is not None:
                    since = min(since, market.now - last)
        return since

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

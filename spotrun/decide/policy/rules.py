"""The reference rules: on-demand only, greedy, and Uniform Progress (NSDI'24).

Each works with one pool or many: when it (re)launches on spot it takes the cheapest
pool available now, and it stays on a spot pool until that pool reclaims it.
"""

from __future__ import annotations

from spotrun.decide.policy.base import Decision, IDLE, JobProgress, Mode, ON_DEMAND, SafePolicy
from spotrun.decide.policy.history import MarketView


def cheapest_up(market: MarketView) -> str | None:
    """The cheapest pool available now, or None."""
    up = market.up_now()
    price = market.price_now()
    best, best_price = None, float("inf")
    for j, ok in enumerate(up):
        if ok and price[j] < best_price:
            best, best_price = j, price[j]
    return None if best is None else market.pools[best]


class OnDemandPolicy(SafePolicy):
    """Always on-demand: the baseline."""

    name = "on-demand"

    def choose(self, job: JobProgress, market: MarketView) -> Decision:
        """On-demand."""
        return ON_DEMAND


class GreedyPolicy(SafePolicy):
    """Spot whenever available, else wait; on-demand only when the safety net says so."""

    name = "greedy"

    def choose(self, job: JobProgress, market: MarketView) -> Decision:
        """Stay on spot; else the cheapest pool up; else idle."""
        if job.mode is Mode.SPOT:
            return job.current
        pool = cheapest_up(market)
        return Decision(Mode.SPOT, pool) if pool else IDLE


class UniformProgressPolicy(SafePolicy):
    """Uniform Progress: on-demand when behind the straight line to the deadline.

    Rules (Wu et al., "Can't Be Late", NSDI'24): take spot whenever available and stay
    until reclaimed; when idle and behind the line, use on-demand; on on-demand stay
    until ahead of the line at t + 2 x changeover (hysteresis); safety net near the end.
    """

    name = "uniform-progress"

    def __init__(self, hysteresis_over_spot: bool = False) -> None:
        # False: spot available beats the hysteresis (the authors' simulator); True: the
        # paper's wording read strictly (stay on on-demand until ahead).
        self.hysteresis_over_spot = hysteresis_over_spot

    def _behind(self, job: JobProgress, extra_s: float) -> bool:
        expected = job.work_total_s * (job.elapsed_s + extra_s) / job.deadline_s
        return job.work_done_s < expected

    def choose(self, job: JobProgress, market: MarketView) -> Decision:
        """Spot if up; else on-demand when behind (with hysteresis); else idle."""
        if job.mode is Mode.SPOT:
            return job.current
        hold_od = job.mode is Mode.ON_DEMAND and self._behind(job, 2 * job.changeover_s)
        if hold_od and self.hysteresis_over_spot:
            return ON_DEMAND
        pool = cheapest_up(market)
        if pool:
            return Decision(Mode.SPOT, pool)
        if hold_od or self._behind(job, 0.0):
            return ON_DEMAND
        return IDLE

"""Pools in several clouds in a replay: what moving the checkpoint to another cloud costs, and
which launches the replay keeps closed (docs/simulate.md, "Several clouds").

The checkpoint lives in the cloud of the job's last launch once the job has made progress. A
launch in another cloud pays the source cloud's egress for the checkpoint (in full, at the
launch: the copy is made before the first step) and its changeover is longer by the copy's
ticks. On-demand runs in the checkpoint's cloud at that cloud's price; with free moves, or
nothing to move yet, in the cloud where on-demand is cheapest.

Two launches stay closed while a move costs anything, so that a policy that knows nothing of
clouds still behaves as the daemon's decision does (docs/cost-model.md, "Moving between
clouds": the move is added to the candidate's cost, its copy to its hours):

- one whose longer changeover would break the safety net (an on-demand finish in the new
  cloud must still fit after a reclaim at its last changeover tick);
- one that does not pay for itself: the pool's spot price plus the move's dollars (egress,
  and the copy's ticks at that price) spread over the hours the job may expect to work there
  must be below the best price in the checkpoint's cloud now (its on-demand price, or its
  cheapest spot pool up and open), as the daemon ranks a move against staying. Those hours are the remaining work's, or the pool's mean hours
  between reclaims when fewer (the daemon's horizon, docs/cost-model.md): its up hours seen
  so far plus the prior (the provider's, else the packaged priors' pooled figure) over its
  reclaims seen so far plus one, so a move is not paid for a stretch the job leaves again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spotrun.decide.policy.history import MarketView

NO_CLOUD = -1          # no checkpoint to move yet


@dataclass(frozen=True)
class CloudMoves:
    """The clouds of a replay's pools and the price of moving a checkpoint between them."""

    clouds: tuple[str, ...]
    pool_cloud: tuple[int, ...]          # per pool (history column): index into clouds
    od_usd_per_hour: tuple[float, ...]   # per cloud
    egress_usd: tuple[float, ...]        # per source cloud: the checkpoint's egress out of it
    copy_ticks: int = 0                  # ticks a move adds to the changeover

    @property
    def free(self) -> bool:
        """True when a move costs neither dollars nor time (no checkpoint size given)."""
        return self.copy_ticks == 0 and not any(self.egress_usd)

    def cheapest_od_cloud(self) -> int:
        """The cloud with the lowest on-demand price (the first one given on a tie)."""
        return min(range(len(self.clouds)), key=lambda k: self.od_usd_per_hour[k])

    def od_cloud(self, ckpt: int) -> int:
        """Where an on-demand launch runs from a checkpoint in cloud ckpt (NO_CLOUD: none)."""
        return self.cheapest_od_cloud() if ckpt == NO_CLOUD or self.free else ckpt

    def launch(self, ckpt: int, dst: int) -> tuple[float, int]:
        """(egress USD, extra changeover ticks) of a launch in cloud dst from ckpt."""
        if ckpt == NO_CLOUD or dst == ckpt:
            return 0.0, 0
        return self.egress_usd[ckpt], self.copy_ticks

    def closed(self, market: "MarketView", ckpt: int, *, slack_ticks: int,
               remaining_ticks: int, changeover_ticks: int) -> list[str]:
        """Pools of other clouds than ckpt that a launch may not go to now (see the module).

        slack_ticks: time left - remaining work - changeover, as the safety net counts it.
        """
        if ckpt == NO_CLOUD or self.free:
            return []
        tick_h = market.tick_s / 3600.0
        too_late = slack_ticks < changeover_ticks + self.copy_ticks + 1
        egress_usd = self.egress_usd[ckpt]
        prices_usd_per_hour = market.price_now()
        up, shut = market.up_now(), market.closed_now()
        stay_usd_per_hour = min([self.od_usd_per_hour[ckpt]] + [
            prices_usd_per_hour[j] for j, k in enumerate(self.pool_cloud)
            if k == ckpt and up[j] and not (shut is not None and shut[j])])
        out = []
        for j, k in enumerate(self.pool_cloud):
            if k == ckpt:
                continue
            price_usd_per_hour = prices_usd_per_hour[j]
            move_usd = egress_usd + self.copy_ticks * tick_h * price_usd_per_hour
            horizon_h = min(max(remaining_ticks, 1) * tick_h,
                            mean_hours_between_reclaims(market, j))
            if too_late or price_usd_per_hour + move_usd / horizon_h >= stay_usd_per_hour:
                out.append(market.pools[j])
        return out


def mean_hours_between_reclaims(market: "MarketView", j: int) -> float:
    """Pool j's up hours seen so far plus the prior, over its reclaims seen so far plus one."""
    # lazy: markov loads the packaged priors on first use
    from spotrun.decide.policy.markov import packaged_mtbf_h
    h = market.h
    prior_h = h.mtbf_prior_h[j] if h.mtbf_prior_h else packaged_mtbf_h()
    up_h = float(h.cum_up[market.now, j]) * market.tick_s / 3600.0
    return (prior_h + up_h) / (1 + market.reclaims(j))

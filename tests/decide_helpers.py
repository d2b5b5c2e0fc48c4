"""Ranking on a market of given prices, for tests of the cost model (spotrun.decide.rank)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from spotrun.decide import catalog_snapshot, hours_left, rank


def rank_candidates(spec: Any, *, catalog: Any, zones: Any, prices: Any, history: Any,
                    region: str, now: datetime, **kw: Any) -> Any:
    """The decision module's ranking on a market of these prices."""
    market = catalog_snapshot(catalog, region, zones, now)
    for t in catalog.names():
        market.on_demand[t] = prices.on_demand_price(t)
        for z in zones:
            market.spot[(t, z)] = prices.spot_price(t, z)
    return rank(spec, catalog=catalog, market=market, history=history,
                hours_left=hours_left(spec.policy.deadline, now), **kw)

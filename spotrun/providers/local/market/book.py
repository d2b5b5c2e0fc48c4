"""The market's order book: which pools exist, which are available, and at what price.

Pure functions of the trace position; the trace is replayed cyclically (after its
last row the market starts again at row 0) so a long-lived market never runs dry.
Every trace column is a zone; every priced catalog type can launch in every zone.
The spot price of a type is the zone's trace price scaled by the type's on-demand
price over the trace type's on-demand price.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from spotrun.catalog import Catalog
from spotrun.traces import PriceBook, Trace


@dataclass(frozen=True)
class PricePointPos:
    """A price change point at a trace position (unwrapped row index)."""

    zone: str
    position: float
    price_usd_per_hour: float


class MarketBook:
    """Availability and prices of every (type, zone) pool at any trace position."""

    def __init__(self, trace: Trace, *, catalog: Catalog, region: str, trace_type: str,
                 prices: PriceBook | None = None, spot_price_usd_per_hour: float = 0.0) -> None:
        self.trace = trace
        self.catalog = catalog
        self.region = region
        self.trace_type = trace_type
        self.zones = list(trace.pools)
        self.rows = len(trace)
        self._up = trace.up()
        self._trace_od = catalog.get(trace_type).on_demand_price(region)
        self._prices = self._price_matrix(prices, spot_price_usd_per_hour)

    def _price_matrix(self, prices: PriceBook | None, override: float) -> np.ndarray:
        if override > 0:
            return np.full((self.rows, len(self.zones)), float(override))
        if prices is not None:
            return prices.matrix(self.trace)
        snap = self.catalog.get(self.trace_type).spot_snapshot_usd_per_hour
        # No price file and no --spot-price: the catalog's spot snapshot midpoint.
        fallback = (snap[0] + snap[1]) / 2 if snap else math.nan
        return np.full((self.rows, len(self.zones)), fallback)

    def row(self, position: float) -> int:
        """The trace row in effect at a position (cyclic)."""
        return int(math.floor(position)) % self.rows

    def zone_index(self, zone: str) -> int:
        """Column of a zone; -1 if the market does not offer it."""
        try:
            return self.zones.index(zone)
        except ValueError:
            return -1

    def available(self, zone: str, position: float) -> bool:
        """True when the zone has spot capacity at the position."""
        j = self.zone_index(zone)
        return j >= 0 and bool(self._up[self.row(position), j])

    def on_demand_price(self, instance_type: str) -> float | None:
        """Catalog on-demand USD/h in the market's region; None for unknown/unpriced types."""
        if instance_type not in self.catalog:
            return None
        return self.catalog.get(instance_type).on_demand_price(self.region)

    def instance_types(self) -> list[str]:
        """Catalog types the market sells (those with an on-demand price)."""
        return [n for n in self.catalog.names() if self.on_demand_price(n) is not None]

    def _ratio(self, instance_type: str) -> float | None:
        od = self.on_demand_price(instance_type)
        if od is None or not self._trace_od:
            return None
        return od / self._trace_od

    def spot_price(self, instance_type: str, zone: str, position: float) -> float | None:
        """Spot USD/h of a pool at a position; None for unknown types, zones or prices."""
        j = self.zone_index(zone)
        ratio = self._ratio(instance_type)
        if j < 0 or ratio is None:
            return None
        base = float(self._prices[self.row(position), j])
        return None if math.isnan(base) else round(base * ratio, 6)

    def next_unavailable(self, zone: str, position: float) -> int | None:
        """First whole row after position where the zone is unavailable (unwrapped); None: never."""
        j = self.zone_index(zone)
        if j < 0:
            return None
        start = int(math.floor(position))
        for k in range(1, self.rows + 1):
            if not self._up[(start + k) % self.rows, j]:
                return start + k
        return None

    def price_points(self, instance_type: str, zone: str, pos0: float,
                     pos1: float) -> list[PricePointPos]:
        """Spot price change points in (pos0, pos1], plus the price in effect at pos0."""
        # Clock arithmetic leaves positions like -1e-13 for row 0; that must not read the
        # previous cycle's last row.
        pos0, pos1 = round(pos0, 6), round(pos1, 6)
        j = self.zone_index(zone)
        first = self.spot_price(instance_type, zone, pos0)
        if j < 0 or first is None:
            return []
        out = [PricePointPos(zone, pos0, first)]
        col = self._prices[:, j]
        last = first
        r = int(math.floor(pos0)) + 1
        while r <= pos1:
            # Jump to the next change row (cyclic) instead of walking every row.
            here = self.spot_price(instance_type, zone, r)
            if here is not None and here != last:
                out.append(PricePointPos(zone, float(r), here))
                last = here
            r = self._next_change_row(col, r)
        return out

    def _next_change_row(self, col: np.ndarray, r: int) -> int:
        i = r % self.rows
        diff = np.nonzero(col[i + 1:] != col[i:-1])[0] if i + 1 < self.rows else np.array([])
        if len(diff):
            return r + int(diff[0]) + 1
        return r + (self.rows - i)   # the next cycle's row 0

"""The prices every provider serves alike: on-demand from its catalog, history oldest first.

A provider mixes in `Pricing` and keeps only what differs: where its spot change points come
from (`_price_points`: EC2's spot price history, GCP's catalog price list, the local market).
"""

from __future__ import annotations

from datetime import datetime
from typing import Iterable

from spotrun.catalog import Catalog
from spotrun.errors import ConfigError
from spotrun.providers.base import PricePoint


class Pricing:
    """on_demand_price and price_history of the Provider protocol (needs catalog and region)."""

    catalog: Catalog
    region: str

    def on_demand_price(self, instance_type: str) -> float:
        """Catalog on-demand USD/h in this provider's region (else any region it lists)."""
        price = self.catalog.get(instance_type).on_demand_price(self.region)
        if price is None:
            raise ConfigError("no on-demand price in the catalog", field="instance_type",
                              value=instance_type)
        return price

    def price_history(self, instance_type: str, zones: list[str], start: datetime,
                      end: datetime) -> list[PricePoint]:
        """Spot change points in [start, end] plus the one in effect at start, oldest first."""
        points = self._price_points(instance_type, zones, start, end)
        return sorted(points, key=lambda p: (p.ts, p.zone))

    def _price_points(self, instance_type: str, zones: list[str], start: datetime,
                      end: datetime) -> Iterable[PricePoint]:
        """The provider's own change points for price_history, in any order."""
        raise NotImplementedError

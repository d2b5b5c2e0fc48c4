"""Where prices come from: a provider (live) or the catalog snapshot."""

from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable

from spotrun.catalog import Catalog
from spotrun.errors import SpotrunError


@runtime_checkable
class PriceSource(Protocol):
    """USD/h per pool; spotrun.providers.base.Provider satisfies it."""

    def spot_price(self, instance_type: str, zone: str) -> float | None:
        """The spot price now, or None if the pool has none."""

    def on_demand_price(self, instance_type: str) -> float | None:
        """The on-demand price, or None if unlisted."""


class CatalogPrices:
    """Prices from the packaged catalog: on-demand by region, spot = midpoint of the snapshot.

    The snapshot gives only min-max over a region's zones (one point in time), so every zone
    gets the midpoint; live prices come from a provider (`spotrun plan`).
    """

    def __init__(self, catalog: Catalog, region: str) -> None:
        self.catalog = catalog
        self.region = region

    def spot_price(self, instance_type: str, zone: str) -> float | None:
        """The region's listed spot price, else the midpoint of the type's spot snapshot, or
        None when it has neither."""
        t = self.catalog.types.get(instance_type)
        by_region = (t.extra.get("spot_usd_per_hour") or {}) if t is not None else {}
        if self.region in by_region:
            return float(by_region[self.region])   # a catalog that prices each region
        if t is None or t.spot_snapshot_usd_per_hour is None:
            return None
        lo, hi = t.spot_snapshot_usd_per_hour
        return (lo + hi) / 2.0

    def on_demand_price(self, instance_type: str) -> float | None:
        """The region's on-demand price (any listed region as fallback), or None."""
        t = self.catalog.types.get(instance_type)
        return None if t is None else t.on_demand_price(self.region)


def safe_price(fn: Callable[..., float | None], *args: str) -> float | None:
    """A price call that treats a provider error as 'no price for this pool'."""
    try:
        price = fn(*args)
    except SpotrunError:
        return None
    return None if price is None or price <= 0 else float(price)

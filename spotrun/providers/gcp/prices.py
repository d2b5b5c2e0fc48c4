"""Spot and on-demand prices of GCP machine types, from the packaged catalog.

GCP publishes Spot prices as a price list, per region and the same in every zone of it, and
changes them at most once a day (older copies of its pricing page: once every 30 days;
docs/gcp-facts.md [G5]); there is no spot price history API as EC2 has. So the catalog
(spotrun/data/catalog/gcp.yaml, sourced in docs/gcp-facts.md) is the price source: a type's
price in a zone is its region's, and a zone the catalog does not list for the type has no
price (the decision skips that pool). Price history is flat: one change point, the price in
effect, at the window's start.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from spotrun.catalog import Catalog
from spotrun.providers.base import PricePoint

_ZONE = re.compile(r"^(?P<region>.+\d)-[a-z]$")


def region_of(zone: str) -> str:
    """us-central1-a -> us-central1."""
    m = _ZONE.match(zone)
    return m.group("region") if m else zone


class CatalogPrices:
    """Prices per (type, zone) from the catalog rows' per-region figures."""

    def __init__(self, catalog: Catalog, region: str) -> None:
        self.catalog = catalog
        self.region = region

    def _row(self, instance_type: str) -> Any:
        return self.catalog.types.get(instance_type)

    def offered(self, instance_type: str, zone: str) -> bool:
        """The catalog lists the type in this zone (a row without zones: every zone)."""
        row = self._row(instance_type)
        if row is None:
            return False
        zones = row.extra.get("zones")
        if not isinstance(zones, dict):
            return True
        return zone in (zones.get(region_of(zone)) or [])

    def spot(self, instance_type: str, zone: str) -> float | None:
        """The Spot USD/h in the zone's region, or None (unknown type, not offered there)."""
        row = self._row(instance_type)
        if row is None or not self.offered(instance_type, zone):
            return None
        by_region = row.extra.get("spot_usd_per_hour") or {}
        price = by_region.get(region_of(zone))
        if price is None and row.spot_snapshot_usd_per_hour:
            lo, hi = row.spot_snapshot_usd_per_hour
            price = (lo + hi) / 2.0
        return float(price) if price else None

    def spot_only(self, instance_type: str) -> bool:
        """The type is sold as Spot only (its on-demand figure is a baseline, not a market)."""
        row = self._row(instance_type)
        return bool(row is not None and row.extra.get("spot_only"))

    def history(self, instance_type: str, zones: list[str], start: datetime,
                end: datetime) -> list[PricePoint]:
        """One change point per priced zone: the catalog price, in effect from `start`."""
        out = []
        for zone in zones:
            price = self.spot(instance_type, zone)
            if price is not None and start <= end:
                out.append(PricePoint(instance_type=instance_type, zone=zone, ts=start,
                                      price_usd_per_hour=price))
        return out

"""Spot prices from `describe_spot_price_history`: the price now, and change points."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from spotrun.providers.base import PricePoint

PRODUCT = "Linux/UNIX"
HISTORY_PAGE_SIZE = 1000     # rows per DescribeSpotPriceHistory page (EC2's most)


class SpotPrices:
    """Reads spot prices through one EC2 client, caching the current price per pool."""

    def __init__(self, ec2: Any, clock: Callable[[], datetime], ttl_s: float = 300.0) -> None:
        self.ec2 = ec2
        self.clock = clock
        self.ttl = timedelta(seconds=ttl_s)
        self._cache: dict[tuple[str, str], tuple[datetime, float | None]] = {}

    def current(self, instance_type: str, zone: str) -> float | None:
        """The price in effect now (cached for ttl_s), or None if the pool has none."""
        now = self.clock()
        hit = self._cache.get((instance_type, zone))
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        # StartTime = now makes EC2 return the point in effect now, newest first.
        resp = self.ec2.describe_spot_price_history(
            InstanceTypes=[instance_type], AvailabilityZone=zone, StartTime=now,
            EndTime=now, ProductDescriptions=[PRODUCT], MaxResults=10)
        rows = [r for r in resp.get("SpotPriceHistory", [])
                if r.get("AvailabilityZone") == zone and r.get("InstanceType") == instance_type]
        price = None
        if rows:
            newest = max(rows, key=lambda r: r["Timestamp"])
            price = float(newest["SpotPrice"])
        self._cache[(instance_type, zone)] = (now, price)
        return price

    def history(self, instance_type: str, zones: list[str], start: datetime,
                end: datetime) -> list[PricePoint]:
        """Change points in [start, end] plus the one in effect at start (in no order)."""
        kw: dict[str, Any] = {"InstanceTypes": [instance_type], "StartTime": start,
                              "EndTime": end, "ProductDescriptions": [PRODUCT],
                              "PaginationConfig": {"PageSize": HISTORY_PAGE_SIZE}}
        if zones:
            kw["Filters"] = [{"Name": "availability-zone", "Values": list(zones)}]
        points: dict[tuple[str, datetime], PricePoint] = {}
        for page in self.ec2.get_paginator("describe_spot_price_history").paginate(**kw):
            for r in page.get("SpotPriceHistory", []):
                if zones and r["AvailabilityZone"] not in zones:
                    continue
                ts = _utc(r["Timestamp"])
                points[(r["AvailabilityZone"], ts)] = PricePoint(
                    instance_type=r["InstanceType"], zone=r["AvailabilityZone"], ts=ts,
                    price_usd_per_hour=float(r["SpotPrice"]))
        return list(points.values())


def _utc(ts: datetime) -> datetime:
    return ts.replace(tzinfo=timezone.utc) if ts.tzinfo is None else ts.astimezone(timezone.utc)

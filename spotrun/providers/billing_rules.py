"""Billing rules per provider, as data, and the one function that applies them at an end.

AWS (documented): per-second billing with a 60 s minimum (Linux); a spot instance
interrupted by EC2 in its first hour costs nothing, after that the seconds used;
an instance we stop or terminate costs the seconds used. Storage: S3 Standard
$0.023 per GB-month, PUT-class requests $0.005 per 1,000; EBS gp3 $0.08 per GB-month.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from spotrun.states import Market

HOURS_PER_MONTH = 730.0          # AWS prices GB-month over a 730-hour month
BYTES_PER_GB = 1024 ** 3         # S3 and EBS bill binary gigabytes


class SpendKind(str, Enum):
    """What a ledger row is for (SpendEntry.kind)."""

    COMPUTE = "compute"          # instance seconds at the price in effect
    ADJUSTMENT = "adjustment"    # top-up to the minimum / whole-second rounding at the end
    CORRECTION = "correction"    # reverses rows: free reclaim, seconds booked past the end
    VOLUME = "volume"            # attached block storage, GB-month
    STORAGE = "storage"          # object storage (checkpoints, logs), GB-month
    REQUESTS = "requests"        # object-store write requests
    EGRESS = "egress"            # bytes copied out of a cloud (a checkpoint moved, issue 43)

    @classmethod
    def instance_kinds(cls) -> tuple[str, ...]:
        """Kinds that make up an instance's compute bill."""
        return (cls.COMPUTE.value, cls.ADJUSTMENT.value, cls.CORRECTION.value)


class PriceSource(str, Enum):
    """Where a booked price came from (SpendEntry.price_source)."""

    SPOT_HISTORY = "spot-price-history"
    SPOT_NOW = "spot-price-now"          # no history for the span: the current price
    LAUNCH = "launch-price"              # no price at all: the price recorded at launch
    ON_DEMAND = "on-demand-catalog"
    STORAGE_PRICE = "storage-price-list"
    BOOKED = "booked-rows"               # a correction copies the rows it reverses


@dataclass(frozen=True)
class BillingRules:
    """How one provider bills instances and storage."""

    provider: str
    granularity_s: float = 1.0
    minimum_s: float = 60.0
    spot_reclaim_free_within_s: float = 3600.0   # 0 = reclaims are always charged
    storage_usd_per_gb_month: float = 0.023
    put_requests_usd_per_1000: float = 0.005
    volume_usd_per_gb_month: float = 0.08

    def billed_seconds(self, used_s: float, *, market: Market, reclaimed_by_provider: bool
                       ) -> float:
        """Seconds billed for an instance that ran used_s and has ended."""
        if used_s <= 0:
            return 0.0
        if (market is Market.SPOT and reclaimed_by_provider
                and used_s < self.spot_reclaim_free_within_s):
            return 0.0
        rounded = math.ceil(used_s / self.granularity_s - 1e-9) * self.granularity_s
        return max(rounded, self.minimum_s)

    def storage_usd(self, size_bytes: float, seconds: float) -> float:
        """Object storage cost of size_bytes held for seconds."""
        return size_bytes / BYTES_PER_GB * seconds / 3600.0 / HOURS_PER_MONTH \
            * self.storage_usd_per_gb_month

    def volume_usd(self, size_gb: float, seconds: float) -> float:
        """Block-volume cost of size_gb attached for seconds."""
        return size_gb * seconds / 3600.0 / HOURS_PER_MONTH * self.volume_usd_per_gb_month

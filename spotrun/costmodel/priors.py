"""Priors: preemption rate per zone (from a real trace) and overheads, until history exists."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spotrun.catalog import Catalog
from spotrun.traces import Trace


@dataclass(frozen=True)
class ZonePrior:
    """A zone's observed exposure: hours available and reclaims in them."""

    up_hours: float
    reclaims: int

    @property
    def mtbf_h(self) -> float:
        """Mean hours between reclaims (= mean available stretch)."""
        return self.up_hours / max(self.reclaims, 1)


@dataclass(frozen=True)
class Priors:
    """Every prior the cost model uses, read from the catalog (see aws.yaml for sources).

    The notice's prior is the provider's (ProviderFacts.notice_prior, costmodel/notice_loss.py).
    """

    zones: dict[str, ZonePrior] = field(default_factory=dict)
    regions: dict[str, ZonePrior] = field(default_factory=dict)
    default: ZonePrior = ZonePrior(up_hours=6336.3, reclaims=1887)
    restart_s: float = 900.0
    checkpoint_min_s: float = 10.0
    checkpoint_s_per_gb: float = 1.0
    interval_min_s: float = 60.0
    interval_max_s: float = 3600.0
    recency_half_life_h: float = 72.0

    def zone(self, zone: str) -> ZonePrior:
        """The zone's prior; else its region's pooled one; else the pooled default."""
        if zone in self.zones:
            return self.zones[zone]
        region = zone[:-1] if zone and zone[-1].isalpha() else zone
        return self.regions.get(region, self.default)


def _zp(raw: dict[str, Any]) -> ZonePrior:
    return ZonePrior(up_hours=float(raw["up_hours"]), reclaims=int(raw["reclaims"]))


def priors_from_catalog(catalog: Catalog) -> Priors:
    """Priors recorded in the catalog's preemption_priors and overhead_priors sections."""
    pre = catalog.meta.get("preemption_priors") or {}
    over = catalog.meta.get("overhead_priors") or {}
    kw: dict[str, Any] = {k: float(v) for k, v in over.items()
                          if k in Priors.__dataclass_fields__}
    if pre.get("default"):
        kw["default"] = _zp(pre["default"])
    return Priors(zones={z: _zp(r) for z, r in (pre.get("zones") or {}).items()},
                  regions={z: _zp(r) for z, r in (pre.get("regions") or {}).items()}, **kw)


def zone_priors_from_trace(trace: Trace) -> dict[str, ZonePrior]:
    """Per pool: hours available and available->unavailable transitions (how aws.yaml was made).

    Each row counts for the gap to the next row (the last row for one tick); the trace's end
    is censoring, not a reclaim.
    """
    gaps = np.diff(trace.elapsed_s, append=trace.elapsed_s[-1] + trace.tick_s)
    up = trace.up(1)
    out: dict[str, ZonePrior] = {}
    for j, pool in enumerate(trace.pools):
        u = up[:, j]
        # up -> 0 is a reclaim; up -> blank is the end of that pool's trace (censored).
        reclaims = int(np.count_nonzero(u[:-1] & (trace.available[1:, j] == 0)))
        out[pool] = ZonePrior(up_hours=float(gaps[u].sum() / 3600.0), reclaims=reclaims)
    return out


def pooled(priors: list[ZonePrior]) -> ZonePrior:
    """Several zones as one: summed hours over summed reclaims."""
    return ZonePrior(up_hours=sum(p.up_hours for p in priors),
                     reclaims=sum(p.reclaims for p in priors))

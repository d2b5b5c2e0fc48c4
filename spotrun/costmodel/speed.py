"""Training speed of an instance type relative to the job's reference: per-GPU speed x scaling.

Across nodes the same curve is read at nodes x GPUs; the gain over one node is kept in full
between EFA types and only in part without EFA (catalog `node_scaling`).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Mapping

from spotrun.catalog import Catalog, InstanceType
from spotrun.errors import ConfigError

PRECISION_GROUP = {"fp16": "amp", "bf16": "amp", "fp8": "amp", "fp32": "fp32", "tf32": "fp32"}


@dataclass(frozen=True)
class ScalingCurve:
    """Speedup of N GPUs over one, piecewise-linear between measured points."""

    points: tuple[tuple[int, float], ...]

    @classmethod
    def from_mapping(cls, raw: Mapping[int, float]) -> "ScalingCurve":
        """Build from {gpus: speedup}; needs at least one point, speedups > 0."""
        pts = sorted((int(k), float(v)) for k, v in raw.items())
        if not pts or any(n < 1 or s <= 0 for n, s in pts):
            raise ConfigError("scaling needs points {gpus >= 1: speedup > 0}", field="scaling",
                              value=dict(raw))
        if pts[0][0] != 1:
            pts.insert(0, (1, 1.0))   # one GPU is the unit
        return cls(tuple(pts))

    def __call__(self, gpus: int) -> float:
        """Speedup at `gpus` (linear between points, last slope beyond the last point)."""
        ns = [n for n, _ in self.points]
        if gpus <= ns[0]:
            return self.points[0][1] * gpus / ns[0]
        i = bisect.bisect_left(ns, gpus)
        if i < len(ns) and ns[i] == gpus:
            return self.points[i][1]
        if i == len(ns):   # beyond the last point: extend the last segment
            i = len(ns) - 1
            if i == 0:
                return self.points[0][1] * gpus
        (n0, s0), (n1, s1) = self.points[i - 1], self.points[i]
        return s0 + (s1 - s0) * (gpus - n0) / (n1 - n0)


def default_scaling(catalog: Catalog) -> ScalingCurve:
    """The catalog's scaling_default (BRIEF: 1.0/1.8/3.2/5.6/8.5 for 1/2/4/8/16 GPUs)."""
    raw = catalog.meta.get("scaling_default") or {1: 1.0, 2: 1.8, 4: 3.2, 8: 5.6, 16: 8.5}
    return ScalingCurve.from_mapping(raw)


def gpu_speed(catalog: Catalog, itype: InstanceType, precision: str) -> float:
    """Per-GPU throughput of the type's GPU relative to a V100 (catalog gpu_speed)."""
    table = catalog.meta.get("gpu_speed") or {}
    row = table.get(itype.gpu)
    group = PRECISION_GROUP.get(precision, "amp")
    if row is None or group not in row:
        raise ConfigError(f"catalog has no {group} speed for GPU {itype.gpu}",
                          field=f"gpu_speed.{itype.gpu}", value=itype.name)
    return float(row[group])


def node_factor(catalog: Catalog, itype: InstanceType) -> float:
    """Share of the cross-node gain kept: node_scaling.efa on EFA types, else .no_efa."""
    table = catalog.meta.get("node_scaling") or {}
    return float(table.get("efa" if itype.efa else "no_efa", 1.0 if itype.efa else 0.64))


def instance_speed(catalog: Catalog, itype: InstanceType, *, precision: str, sharding: str,
                   scaling: ScalingCurve, gpus: int | None = None, nodes: int = 1) -> float:
    """Throughput in V100 units of `nodes` nodes of `gpus` GPUs of the type (default all):
    per-GPU speed x scaling(GPUs) x interconnect, plus the kept share of the nodes' gain."""
    n = itype.gpus if gpus is None else gpus
    one = scaling(n)
    total = one
    if nodes > 1:
        total = one + (scaling(n * nodes) - one) * node_factor(catalog, itype)
    speed = gpu_speed(catalog, itype, precision) * total
    if sharding == "fsdp" and n > 1 and itype.extra.get("interconnect") == "pcie":
        speed *= float(catalog.meta.get("sharded_pcie_factor", 1.0))
    return speed

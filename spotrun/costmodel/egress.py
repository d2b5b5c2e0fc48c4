"""What moving a checkpoint to another cloud costs: the egress dollars and the copy's hours.

A candidate in another cloud than the job's latest checkpoint pays, before its first step, the
checkpoint's bytes at the source cloud's published internet egress rate (its catalog's
`egress` section; every figure sourced in docs/cost-model.md, "Moving between clouds"), and
waits while the bytes are copied at the copy throughput measured so far (a prior before any
copy was measured). Inside one cloud nothing is billed here: a job's store is in the region
its instances launch in, where store-to-instance transfer is free on AWS and GCP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spotrun.catalog import Catalog
from spotrun.errors import ConfigError

# Before any copy between clouds was measured: 50 MB/s through the daemon host (one stream
# per object, four objects at once). Deliberately low: a prior that is too high sends a large
# checkpoint across clouds for a saving the copy then eats. Replaced by measured copies
# (spotrun.costmodel.egress.Throughput).
PRIOR_COPY_BYTES_PER_S = 50e6


@dataclass(frozen=True)
class EgressRate:
    """One cloud's published price for bytes that leave it for the internet."""

    cloud: str
    usd_per_gb: float          # the published rate, per the cloud's own billing unit
    gb_bytes: int              # that unit in bytes (10^9 for AWS's "GB", 2^30 for GCP's GiB)
    source: str                # the source tag of docs/cost-model.md

    def usd(self, nbytes: int) -> float:
        """Dollars to send nbytes out of this cloud."""
        return max(nbytes, 0) / self.gb_bytes * self.usd_per_gb


def egress_rate(cloud: str, catalog: Catalog) -> EgressRate:
    """The egress rate a cloud's catalog declares (its `egress` section); ConfigError if none."""
    raw = catalog.meta.get("egress")
    if not isinstance(raw, dict) or "internet_usd_per_gb" not in raw:
        raise ConfigError(f"the {cloud} catalog declares no egress rate", field="egress",
                          value=cloud, hint="add an `egress` section to its catalog YAML")
    return EgressRate(cloud=cloud, usd_per_gb=float(raw["internet_usd_per_gb"]),
                      gb_bytes=int(raw.get("gb_bytes", 10**9)),
                      source=str(raw.get("source", "")))


@dataclass(frozen=True)
class Throughput:
    """The copy throughput between clouds: the measured mean, else the prior."""

    bytes_per_s: float = PRIOR_COPY_BYTES_PER_S
    source: str = "prior"      # "prior" | "measured (N copies)"

    @classmethod
    def measured(cls, copies: list[tuple[int, float]]) -> "Throughput":
        """From (bytes, seconds) of past copies: their total bytes over total seconds; the
        prior when there are none (a copy of no bytes or no time says nothing)."""
        rows = [(b, s) for b, s in copies if b > 0 and s > 0]
        if not rows:
            return cls()
        total_b = sum(b for b, _ in rows)
        total_s = sum(s for _, s in rows)
        return cls(bytes_per_s=total_b / total_s, source=f"measured ({len(rows)} copies)")


@dataclass(frozen=True)
class Move:
    """What it costs to start the next attempt in `dst_cloud` from a checkpoint in `src_cloud`."""

    src_cloud: str
    dst_cloud: str
    nbytes: int
    usd: float                 # egress billed by the source cloud
    transfer_s: float          # wall seconds of copying before the first step
    rate_source: str = ""
    throughput_source: str = ""

    @property
    def crosses(self) -> bool:
        """True when the checkpoint has to leave its cloud."""
        return self.src_cloud != self.dst_cloud

    def to_dict(self) -> dict[str, Any]:
        """The `egress` block of a plan row."""
        return {"from": self.src_cloud, "to": self.dst_cloud, "bytes": self.nbytes,
                "usd": round(self.usd, 4), "transfer_s": round(self.transfer_s, 1),
                "rate": self.rate_source, "throughput": self.throughput_source}


def move(nbytes: int, src_cloud: str, dst_cloud: str, rate: EgressRate | None,
         throughput: Throughput = Throughput()) -> Move:
    """The move of nbytes from src_cloud to dst_cloud: nothing inside one cloud."""
    if src_cloud == dst_cloud or nbytes <= 0:
        return Move(src_cloud, dst_cloud, max(nbytes, 0), 0.0, 0.0)
    if rate is None or rate.cloud != src_cloud:
        raise ConfigError("no egress rate for the checkpoint's cloud", field="egress",
                          value=src_cloud)
    return Move(src_cloud, dst_cloud, nbytes, rate.usd(nbytes),
                nbytes / max(throughput.bytes_per_s, 1.0), rate_source=rate.source,
                throughput_source=throughput.source)

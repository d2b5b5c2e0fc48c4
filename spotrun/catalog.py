"""The instance catalog: GPU instance types with specs and on-demand prices."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any, Callable


from spotrun.errors import ConfigError
from spotrun.yamlload import safe_load


@dataclass(frozen=True)
class InstanceType:
    """One catalog row."""

    name: str
    gpu: str
    gpus: int
    gpu_memory_gib: float
    vcpus: int
    ram_gib: float
    od_usd_per_hour: dict[str, float] = field(default_factory=dict)
    spot_snapshot_usd_per_hour: tuple[float, float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def on_demand_price(self, region: str = "us-east-1") -> float | None:
        """On-demand USD/h in region (falls back to any listed region), or None if unlisted."""
        if region in self.od_usd_per_hour:
            return self.od_usd_per_hour[region]
        return next(iter(self.od_usd_per_hour.values()), None)

    @property
    def efa(self) -> bool:
        """True when the type has EFA between nodes (catalog `efa`; no data = False)."""
        return bool(self.extra.get("efa", False))


@dataclass(frozen=True)
class Catalog:
    """All known instance types of one provider family."""

    types: dict[str, InstanceType]
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict)   # other top-level sections (cost model)

    def get(self, name: str) -> InstanceType:
        """The named type; raises ConfigError if unknown."""
        try:
            return self.types[name]
        except KeyError:
            raise ConfigError("unknown instance type", field="instance_type", value=name,
                              hint="see `spotrun plan` for the catalog") from None

    def __contains__(self, name: object) -> bool:
        return name in self.types

    def names(self) -> list[str]:
        """Type names in catalog order."""
        return list(self.types)


def parse_catalog(raw: dict[str, Any]) -> Catalog:
    """Build a Catalog from its YAML mapping."""
    types: dict[str, InstanceType] = {}
    known = {"gpu", "gpus", "gpu_memory_gib", "vcpus", "ram_gib", "od_usd_per_hour",
             "spot_snapshot_usd_per_hour"}
    for name, row in (raw.get("instance_types") or {}).items():
        snap = row.get("spot_snapshot_usd_per_hour")
        types[name] = InstanceType(
            name=name, gpu=str(row["gpu"]), gpus=int(row["gpus"]),
            gpu_memory_gib=float(row["gpu_memory_gib"]), vcpus=int(row["vcpus"]),
            ram_gib=float(row["ram_gib"]),
            od_usd_per_hour={k: float(v) for k, v in (row.get("od_usd_per_hour") or {}).items()},
            spot_snapshot_usd_per_hour=tuple(snap) if snap else None,
            extra={k: v for k, v in row.items() if k not in known},
        )
    meta = {k: v for k, v in raw.items() if k not in ("instance_types", "source")}
    return Catalog(types=types, source=str(raw.get("source", "")), meta=meta)


@lru_cache(maxsize=4)
def load_catalog(name: str = "aws") -> Catalog:
    """The packaged catalog `spotrun/data/catalog/<name>.yaml`."""
    text = resources.files("spotrun.data").joinpath("catalog", f"{name}.yaml").read_text("utf-8")
    return parse_catalog(safe_load(text))


def catalog_od_price(region: str, name: str = "aws") -> Callable[[str], float | None]:
    """On-demand USD/h by instance type from a packaged catalog (None if unlisted)."""
    cat = load_catalog(name)

    def price(instance_type: str) -> float | None:
        t = cat.types.get(instance_type)
        return t.on_demand_price(region) if t is not None else None
    return price

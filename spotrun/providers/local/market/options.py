"""How a market is started: options shared by `market serve/start`, ensure_market and the provider."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

from spotrun.catalog import load_catalog
from spotrun.errors import BadInputError
from spotrun.providers.local.market.book import MarketBook
from spotrun.traces import Trace, load_prices, load_trace

DEMO_TRACE = "p3.2xlarge_4az_demo.csv"
DEMO_PRICES = "p3.2xlarge_4az_demo_prices.csv"
PACINGS = ("rehearsal", "fixed")


def packaged_trace(name: str) -> Path:
    """Path of a trace extract shipped in spotrun/data/traces/."""
    return Path(str(resources.files("spotrun.data").joinpath("traces", name)))


@dataclass(frozen=True)
class MarketOptions:
    """Everything that defines a market; stored in its state dir at first start."""

    trace: str = ""                  # availability CSV; "" = the packaged demo extract
    prices: str = ""                 # price CSV; "" = packaged prices with the packaged trace
    pools: tuple[str, ...] = ()      # trace columns offered; () = all
    instance_type: str = "p3.2xlarge"  # the type the trace measured
    time_scale: float = 60.0         # market seconds per wall second
    start_tick: int = 0              # trace row at the market's epoch
    notice_s: float = 120.0          # interruption notice lead, market seconds
    spot_price_usd_per_hour: float = 0.0  # > 0 overrides the price file
    region: str = "us-east-1"
    grace_s: float = 5.0             # wall seconds between SIGTERM and SIGKILL on terminate
    instance_command: str = ""       # tests only: replaces `python -m spotrun agent ...`
    pacing: str = "fixed"            # "rehearsal": slower during start-ups and notices
    startup_max_s: float = 300.0     # wall seconds an unready instance keeps the clock at x1
    notice_wall_s: float = 20.0      # rehearsal: wall seconds a notice lasts (<= notice_s)
    boot_s: float = 0.0              # rehearsal: market seconds an instance boots (fast)
    boot_s_by_type: tuple[tuple[str, float], ...] = ()   # per-type boot_s

    def validate(self) -> "MarketOptions":
        """Check ranges; raises BadInputError naming the option."""
        if not (self.time_scale > 0 and math.isfinite(self.time_scale)):
            raise BadInputError("must be > 0", field="time_scale", value=self.time_scale)
        for name in ("notice_s", "spot_price_usd_per_hour", "grace_s"):
            if getattr(self, name) < 0:
                raise BadInputError("must be >= 0", field=name, value=getattr(self, name))
        if self.pacing not in PACINGS:
            raise BadInputError(f"must be one of {', '.join(PACINGS)}", field="pacing",
                                value=self.pacing)
        for name in ("startup_max_s", "notice_wall_s", "boot_s"):
            if getattr(self, name) < 0:
                raise BadInputError("must be >= 0", field=name, value=getattr(self, name))
        for itype, seconds in self.boot_s_by_type:
            if seconds < 0:
                raise BadInputError("must be >= 0", field=f"boot_s_by_type.{itype}",
                                    value=seconds)
        if self.start_tick < 0:
            raise BadInputError("must be >= 0", field="start_tick", value=self.start_tick)
        if self.instance_type not in load_catalog():
            raise BadInputError("not in the catalog", field="instance_type",
                                value=self.instance_type)
        return self

    def boot_s_of(self, instance_type: str) -> float:
        """Market seconds an instance of this type boots before its job starts."""
        return dict(self.boot_s_by_type).get(instance_type, self.boot_s)

    def notice_rate(self) -> float:
        """Market seconds per wall second while a paced market serves a notice."""
        if self.notice_wall_s <= 0 or self.notice_s <= 0:
            return self.time_scale
        return min(self.time_scale, max(1.0, self.notice_s / self.notice_wall_s))

    def trace_path(self) -> Path:
        """The availability CSV to replay."""
        return Path(self.trace).expanduser().resolve() if self.trace else packaged_trace(DEMO_TRACE)

    def prices_path(self) -> Path | None:
        """The price CSV, or None (then --spot-price or the catalog snapshot)."""
        if self.prices:
            return Path(self.prices).expanduser().resolve()
        return None if self.trace else packaged_trace(DEMO_PRICES)

    def load_trace(self) -> Trace:
        """The trace, narrowed to the chosen pools."""
        trace = load_trace(self.trace_path())
        return trace.select(list(self.pools)) if self.pools else trace

    def load_book(self) -> MarketBook:
        """The order book for these options."""
        self.validate()
        trace = self.load_trace()
        prices_path = self.prices_path()
        prices = load_prices(prices_path) if prices_path and self.spot_price_usd_per_hour <= 0 \
            else None
        return MarketBook(trace, catalog=load_catalog(), region=self.region,
                          trace_type=self.instance_type, prices=prices,
                          spot_price_usd_per_hour=self.spot_price_usd_per_hour)

    def to_argv(self) -> list[str]:
        """The `spotrun market serve` options that reproduce these."""
        argv = ["--time-scale", repr(self.time_scale), "--start-tick", str(self.start_tick),
                "--notice-s", repr(self.notice_s), "--instance-type", self.instance_type,
                "--region", self.region, "--grace-s", repr(self.grace_s),
                "--pacing", self.pacing, "--startup-max-s", repr(self.startup_max_s),
                "--notice-wall-s", repr(self.notice_wall_s), "--boot-s", repr(self.boot_s)]
        for itype, seconds in self.boot_s_by_type:
            argv += ["--boot-s-for", f"{itype}={seconds!r}"]
        if self.trace:
            argv += ["--trace", str(self.trace_path())]
        if self.prices:
            argv += ["--prices", str(self.prices_path())]
        for pool in self.pools:
            argv += ["--pool", pool]
        if self.spot_price_usd_per_hour > 0:
            argv += ["--spot-price", repr(self.spot_price_usd_per_hour)]
        if self.instance_command:
            argv += ["--instance-command", self.instance_command]
        return argv

    def to_json(self) -> str:
        """Serialise (stored in the state dir)."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "MarketOptions":
        """Build from a dict, ignoring unknown keys (state written by another version)."""
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in raw.items() if k in known}
        if "pools" in kw:
            kw["pools"] = tuple(kw["pools"])
        if "boot_s_by_type" in kw:
            pairs = kw["boot_s_by_type"]
            pairs = pairs.items() if isinstance(pairs, dict) else pairs
            kw["boot_s_by_type"] = tuple(sorted((str(t), float(s)) for t, s in pairs))
        return cls(**kw)

    @classmethod
    def from_settings(cls, settings: Any, **overrides: Any) -> "MarketOptions":
        """Options from Settings.local (and settings.region)."""
        local = settings.local
        base = cls(trace=local.trace, prices=local.prices, pools=tuple(local.pools),
                   instance_type=local.instance_type, time_scale=local.time_scale,
                   start_tick=local.start_tick, notice_s=local.notice_s,
                   spot_price_usd_per_hour=local.spot_price_usd_per_hour,
                   region=settings.region, pacing=local.pacing,
                   startup_max_s=local.startup_max_s, notice_wall_s=local.notice_wall_s,
                   boot_s=local.boot_s, boot_s_by_type=tuple(sorted(local.boot_s_by_type.items())))
        return cls.from_dict({**asdict(base), **overrides})

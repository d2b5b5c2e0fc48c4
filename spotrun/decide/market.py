"""The market the decision sees: spot prices, availability and on-demand prices at one moment.

One value, built once per decision from the provider (live), or from the catalog snapshot
when no provider can be asked; `plan`, `submit --dry-run` and the daemon all decide on one.
Decide builds it from what the provider serves (zones, clock, prices, and the features it
declares: spotrun.providers.base.ProviderFeature); the provider never calls back here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from datetime import datetime
from typing import Any, Callable, Iterable

from spotrun.catalog import Catalog
from spotrun.costmodel.price_source import CatalogPrices, safe_price
from spotrun.decide.quarantine import NO_QUARANTINE, PoolNotice, Quarantine
from spotrun.providers.base import Pool, PoolView, ProviderFeature, RestingMarket
from spotrun.states import Market

PoolKey = tuple[str, str]


@dataclass(frozen=True)
class MarketSnapshot:
    """Prices and spot availability per pool at `at` (provider clock)."""

    zones: tuple[str, ...]
    spot: dict[PoolKey, float | None]
    on_demand: dict[str, float | None]
    at: datetime
    source: str                                   # "live", "catalog snapshot", ...
    available: dict[PoolKey, bool] = field(default_factory=dict)  # missing: not known
    # Recent interruption notices: a spot pool with one is closed to launches for a while.
    quarantine: Quarantine = NO_QUARANTINE
    # Providers without a market view are asked per pool, once, only for pools a decision reads.
    fetch: Callable[[str, str], float | None] | None = field(default=None, compare=False,
                                                             repr=False)

    def spot_price(self, instance_type: str, zone: str) -> float | None:
        """Spot USD/h of a pool, or None when it has none."""
        key = (instance_type, zone)
        if key not in self.spot and self.fetch is not None:
            self.spot[key] = self.fetch(instance_type, zone)
        return self.spot.get(key)

    def on_demand_price(self, instance_type: str) -> float | None:
        """On-demand USD/h of a type, or None when unlisted."""
        return self.on_demand.get(instance_type)

    def is_available(self, instance_type: str, zone: str) -> bool:
        """False only when the provider said the pool has no spot capacity now."""
        return self.available.get((instance_type, zone), True)

    def notice_in(self, instance_type: str, zone: str) -> PoolNotice | None:
        """The notice that closes the spot pool at this snapshot's time, or None."""
        return self.quarantine.notice_in(instance_type, zone, self.at)

    def closed_zones(self, instance_type: str) -> frozenset[str]:
        """The zones whose spot pool of this type a notice closes now."""
        return frozenset(z for t, z in self.quarantine.closed(self.at) if t == instance_type)

    def cheapest_spot(self, types: Iterable[str]) -> tuple[float, str, str] | None:
        """(price, type, zone) of the cheapest priced spot pool among types, or None."""
        best: tuple[float, str, str] | None = None
        wanted = set(types)
        for (t, z), p in self.spot.items():
            if t in wanted and p is not None and (best is None or p < best[0]):
                best = (p, t, z)
        return best

    def to_dict(self) -> dict[str, Any]:
        """Where the prices came from, for `--json` output."""
        return {"source": self.source, "at": self.at.isoformat(), "zones": list(self.zones)}


def catalog_snapshot(catalog: Catalog, region: str, zones: Iterable[str], at: datetime,
                     types: Iterable[str] | None = None) -> MarketSnapshot:
    """The packaged catalog's prices (spot: the snapshot's midpoint in every zone)."""
    prices = CatalogPrices(catalog, region)
    names = list(types or catalog.names())
    zl = tuple(zones)
    return MarketSnapshot(
        zones=zl, at=at, source="catalog snapshot",
        spot={(t, z): prices.spot_price(t, z) for t in names for z in zl},
        on_demand={t: prices.on_demand_price(t) for t in names})


def provider_snapshot(provider: Any, types: Iterable[str], zones: Iterable[str] | None = None,
                      ) -> MarketSnapshot:
    """The provider's live view: its market_view where it has one, else price calls per pool."""
    return SnapshotSource(provider, types).snapshot(zones)


def peek_snapshot(provider: Any, types: Iterable[str], zones: Iterable[str] | None = None,
                  ) -> MarketSnapshot:
    """The market as the daemon would read it, starting and writing nothing (plan, dry-run):
    a resting market where the provider serves one (a local market not running), else live."""
    names = list(types)
    if ProviderFeature.RESTING_MARKET in provider.features:
        rest = provider.resting_market(names)
        if rest is not None:
            return resting_snapshot(rest, zones)
    return provider_snapshot(provider, names, zones)


def resting_snapshot(rest: RestingMarket, zones: Iterable[str] | None = None) -> MarketSnapshot:
    """A resting market cut to these zones (default: all of its own), in its zone order."""
    wanted = set(zones or ())
    zl = tuple(z for z in rest.zones if not wanted or z in wanted)
    spot, avail = _pool_rows(rest.pools, zl)
    return MarketSnapshot(zones=zl, at=rest.at, source=rest.source, spot=spot, available=avail,
                          on_demand=dict(rest.on_demand))


def _pool_rows(rows: Iterable[PoolView], zones: tuple[str, ...]
               ) -> tuple[dict[PoolKey, float | None], dict[PoolKey, bool]]:
    """Spot prices (NaN: none) and availability of the pools in these zones."""
    spot: dict[PoolKey, float | None] = {}
    avail: dict[PoolKey, bool] = {}
    for row in rows:
        if row.zone in zones:
            p = row.spot_price_usd_per_hour
            spot[(row.instance_type, row.zone)] = None if p is None or (
                isinstance(p, float) and math.isnan(p)) else float(p)
            avail[(row.instance_type, row.zone)] = bool(row.available)
    return spot, avail


class SnapshotSource:
    """One moment of a provider's market, cut for any zone list: the provider is asked once.

    The daemon's scheduler reads one per pass and decides every job on it; each cut is what
    `provider_snapshot(provider, types, zones)` returns at that moment.
    """

    def __init__(self, provider: Any, types: Iterable[str],
                 notices: Callable[[datetime], Quarantine] | None = None) -> None:
        self.provider = provider
        self.names = list(types)
        # The recent notices at the snapshot's time (e.g. decide.quarantine.recent_notices),
        # read once with the moment; None: no quarantine.
        self._notices = notices
        self._quarantine: Quarantine | None = None
        self._zones: tuple[str, ...] | None = None
        self._at: datetime | None = None
        self._rows: list[Any] | None = None
        self._od: dict[str, float | None] | None = None
        self._cooling: list[Pool] | None = None   # pools that refused capacity lately
        self._cuts: dict[tuple[str, ...] | None, MarketSnapshot] = {}
        self._prints: dict[tuple[Any, ...], int] = {}

    def snapshot(self, zones: Iterable[str] | None = None) -> MarketSnapshot:
        """The market over these zones (default: every zone of the provider)."""
        key = tuple(zones) if zones else None
        got = self._cuts.get(key)
        if got is None:
            got = self._cuts[key] = self._cut(key)
        return got

    def fingerprint(self, zones: Iterable[str] | None = None,
                    types: Iterable[str] | None = None) -> int:
        """snapshot_fingerprint of a cut, computed once per (zones, types)."""
        market = self.snapshot(zones)
        names = None if market.fetch is None or types is None else tuple(types)
        key = (market.zones, names)
        got = self._prints.get(key)
        if got is None:
            got = self._prints[key] = snapshot_fingerprint(market, names)
        return got

    def _cut(self, key: tuple[str, ...] | None) -> MarketSnapshot:
        provider = self.provider
        if key is None and self._zones is None:
            self._zones = tuple(provider.zones())
        zl = key if key is not None else self._zones
        assert zl is not None
        if self._at is None:
            self._at = provider.now()
        if self._quarantine is None:
            self._quarantine = (self._notices(self._at) if self._notices is not None
                                else NO_QUARANTINE)
        spot: dict[PoolKey, float | None] = {}
        avail: dict[PoolKey, bool] = {}
        fetch: Callable[[str, str], float | None] | None = None
        if ProviderFeature.MARKET_VIEW in provider.features:
            if self._rows is None:
                self._rows = list(provider.market_view(self.names))
            rows = self._rows
            # The provider's own zone order (a trace's column order) is what policies index by.
            seen = list(dict.fromkeys(r.zone for r in rows if r.zone in zl))
            zl = tuple(seen + [z for z in zl if z not in seen])
            spot, avail = _pool_rows(rows, zl)
        else:
            fetch = partial(safe_price, provider.spot_price)
        if ProviderFeature.CAPACITY_COOLDOWN in provider.features:
            if self._cooling is None:
                self._cooling = [p for p in map(Pool.from_key, provider.pools_cooling())
                                 if p is not None and p.market is Market.SPOT]
            for p in self._cooling:
                if p.zone in zl:
                    avail[(p.instance_type, p.zone)] = False
        if self._od is None:
            self._od = {t: safe_price(provider.on_demand_price, t) for t in self.names}
        return MarketSnapshot(zones=zl, spot=spot, on_demand=dict(self._od), at=self._at,
                              source=provider.snapshot_source, available=avail,
                              quarantine=self._quarantine, fetch=fetch)


def snapshot_fingerprint(market: MarketSnapshot, types: Iterable[str] | None = None) -> int:
    """A hash of everything a decision reads from the snapshot, its time aside.

    Zones in order, spot prices and availability per pool, on-demand prices, the pools a
    notice closes at its time (so a notice, and the end of its quarantine, is a change). A
    snapshot that
    fetches prices per pool is read for `types` in its zones (fetching them as a decision
    would); without types, only the pools it holds count.
    """
    if market.fetch is not None and types is not None:
        spot = tuple((t, z, market.spot_price(t, z)) for t in types for z in market.zones)
    else:
        spot = tuple(market.spot.items())
    return hash((market.source, market.zones, spot, tuple(market.available.items()),
                 tuple(market.on_demand.items()), market.quarantine.closed(market.at)))

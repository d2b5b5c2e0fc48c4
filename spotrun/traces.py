"""Spot-market traces: availability per pool per tick, and price change points.

Format (see the brief): header row; first column `tick`; then `time_utc` (ISO-8601)
or `elapsed_s`; then one column per pool holding how many spot instances are
available (blank = the pool's trace has ended: unavailable). Prices:
`zone,tick,time_utc,spot_price_usd_per_hour` change points, each holding until
the zone's next row. Used by the local market and by `spotrun simulate`.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np

from spotrun.errors import BadInputError


@dataclass
class Trace:
    """Availability of each pool at each tick."""

    ticks: np.ndarray            # int64, as in the file
    elapsed_s: np.ndarray        # float64 seconds since the first row
    pools: list[str]
    available: np.ndarray        # int64 [n_ticks, n_pools]; -1 = blank (trace ended)
    source: str = ""
    start_time: datetime | None = None

    @property
    def tick_s(self) -> float:
        """Tick length: the median gap between rows."""
        if len(self.elapsed_s) < 2:
            return 1.0
        return float(np.median(np.diff(self.elapsed_s)))

    def __len__(self) -> int:
        return len(self.ticks)

    def pool_index(self, pool: str) -> int:
        """Column index of pool; raises BadInputError naming the known pools."""
        try:
            return self.pools.index(pool)
        except ValueError:
            raise BadInputError(f"unknown pool {pool!r}; allowed: {', '.join(self.pools)}",
                                field="pool", value=pool) from None

    def up(self, nodes: int = 1) -> np.ndarray:
        """Bool [n_ticks, n_pools]: the pool can hold `nodes` instances at that tick."""
        return self.available >= nodes

    def select(self, pools: list[str]) -> "Trace":
        """A trace with only these pools (in this order)."""
        idx = [self.pool_index(p) for p in pools]
        return Trace(ticks=self.ticks, elapsed_s=self.elapsed_s, pools=list(pools),
                     available=self.available[:, idx], source=self.source,
                     start_time=self.start_time)


@dataclass
class PriceBook:
    """Spot price change points per pool (by tick)."""

    points: dict[str, tuple[list[int], list[float]]] = field(default_factory=dict)
    default_usd_per_hour: float | None = None

    def matrix(self, trace: Trace) -> np.ndarray:
        """Float [n_ticks, n_pools] of prices in effect (NaN where unknown)."""
        out = np.full((len(trace), len(trace.pools)), np.nan)
        for j, pool in enumerate(trace.pools):
            series = self.points.get(pool) or self.points.get(_zone_of(pool))
            if not series:
                if self.default_usd_per_hour is not None:
                    out[:, j] = self.default_usd_per_hour
                continue
            ticks, prices = series
            idx = np.searchsorted(np.asarray(ticks), trace.ticks, side="right") - 1
            out[:, j] = np.asarray(prices)[np.clip(idx, 0, None)]
        return out


def _zone_of(pool: str) -> str:
    return pool.split("_", 1)[0]


def load_trace(path: str | Path) -> Trace:
    """Read an availability CSV; raises BadInputError on a malformed file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInputError(f"cannot read trace: {exc}", field="trace", value=str(p)) from None
    rows = list(csv.reader(text.splitlines()))
    if len(rows) < 2 or not rows[0] or rows[0][0] != "tick" or len(rows[0]) < 3:
        raise BadInputError("allowed: CSV with header tick,time_utc|elapsed_s,<pool>...",
                            field="trace", value=str(p))
    header = rows[0]
    time_col = header[1]
    if time_col not in ("time_utc", "elapsed_s"):
        raise BadInputError("second column must be time_utc or elapsed_s", field="trace",
                            value=time_col)
    pools = header[2:]
    n = len(rows) - 1
    ticks = np.empty(n, dtype=np.int64)
    elapsed = np.empty(n, dtype=np.float64)
    avail = np.full((n, len(pools)), -1, dtype=np.int64)
    start: datetime | None = None
    for i, row in enumerate(rows[1:]):
        try:
            ticks[i] = int(row[0])
            if time_col == "time_utc":
                t = datetime.fromisoformat(row[1].replace("Z", "+00:00"))
                if start is None:
                    start = t
                elapsed[i] = (t - start).total_seconds()
            else:
                elapsed[i] = float(row[1])
            for j, cell in enumerate(row[2:2 + len(pools)]):
                if cell.strip() != "":
                    avail[i, j] = int(float(cell))
        except (ValueError, IndexError):
            raise BadInputError(f"malformed row {i + 2}", field="trace", value=str(p)) from None
    return Trace(ticks=ticks, elapsed_s=elapsed, pools=pools, available=avail, source=str(p),
                 start_time=start)


def load_prices(path: str | Path) -> PriceBook:
    """Read a price change-point CSV (zone,tick,time_utc,spot_price_usd_per_hour)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInputError(f"cannot read prices: {exc}", field="prices", value=str(p)) from None
    reader = csv.DictReader(text.splitlines())
    need = {"zone", "tick", "spot_price_usd_per_hour"}
    if not reader.fieldnames or not need <= set(reader.fieldnames):
        raise BadInputError("allowed: CSV with header zone,tick,time_utc,spot_price_usd_per_hour",
                            field="prices", value=str(p))
    raw: dict[str, list[tuple[int, float]]] = {}
    for i, row in enumerate(reader):
        try:
            raw.setdefault(row["zone"], []).append((int(row["tick"]),
                                                    float(row["spot_price_usd_per_hour"])))
        except (ValueError, TypeError):
            raise BadInputError(f"malformed row {i + 2}", field="prices", value=str(p)) from None
    book = PriceBook()
    for zone, pts in raw.items():
        pts.sort()
        book.points[zone] = ([t for t, _ in pts], [v for _, v in pts])
    return book

"""Spot-market traces: availability per pool per tick, and price change points.

Format (see the brief): header row; first column `tick`; then `time_utc` (ISO-8601)
or `elapsed_s`; then one column per pool holding how many spot instances are
available (blank = the pool's trace has ended: unavailable). Prices:
`zone,tick,time_utc,spot_price_usd_per_hour` change points, each holding until
the zone's next row. Used by the local market and by `spotrun simulate`.

The same availability also reads from the JSON shape the public GCP traces have
(skypilot-org/spot-traces, e.g. `preemption/1-node/gcp-04-30-2023/us-central1-c_c3-88.json`):
`{"metadata": {"gap_seconds": 30}, "data": [1, 1, 0, ...]}`, one pool per file named by its
stem, or `"data": {"<pool>": [...], ...}` for several; a directory of such files is one trace
with a pool per file (docs/gcp.md, "A GCP-shaped availability trace").
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

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
    """Read an availability CSV, or a JSON trace (a file or a directory of them: see the
    module docstring); raises BadInputError on a malformed one."""
    p = Path(path)
    if p.is_dir() or p.suffix.lower() == ".json":
        return load_json_trace(p)
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


def _json_pools(p: Path) -> tuple[float, dict[str, list[Any]]]:
    """(gap_seconds, {pool: counts}) of one JSON trace file."""
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
        gap = float(raw["metadata"]["gap_seconds"])
        data = raw["data"]
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInputError(f"cannot read trace: {exc}", field="trace", value=str(p)) from None
    except (ValueError, KeyError, TypeError):
        raise BadInputError('allowed: JSON {"metadata": {"gap_seconds": N}, "data": [...]}',
                            field="trace", value=str(p)) from None
    pools = data if isinstance(data, dict) else {p.stem: data}
    if not (gap > 0) or not pools or not all(isinstance(v, list) for v in pools.values()):
        raise BadInputError("gap_seconds must be > 0 and data a list (or pool -> list)",
                            field="trace", value=str(p))
    return gap, {str(k): v for k, v in pools.items()}


def load_json_trace(path: str | Path) -> Trace:
    """A JSON trace file, or a directory of them (a pool per file, by name): one Trace."""
    p = Path(path)
    files = sorted(p.glob("*.json")) if p.is_dir() else [p]
    if not files:
        raise BadInputError("no *.json trace files in the directory", field="trace",
                            value=str(p))
    gaps: set[float] = set()
    pools: dict[str, list[Any]] = {}
    for f in files:
        gap, found = _json_pools(f)
        gaps.add(gap)
        for name, series in found.items():
            if name in pools:
                raise BadInputError(f"pool {name!r} is given twice", field="trace",
                                    value=str(f))
            pools[name] = series
    if len(gaps) != 1:
        raise BadInputError(f"every file must have the same gap_seconds; found "
                            f"{', '.join(f'{g:g}' for g in sorted(gaps))}", field="trace",
                            value=str(p))
    n = max(len(v) for v in pools.values())
    if n == 0:
        raise BadInputError("the trace has no rows", field="trace", value=str(p))
    avail = np.full((n, len(pools)), -1, dtype=np.int64)   # past a pool's end: blank
    for j, series in enumerate(pools.values()):
        try:
            avail[:len(series), j] = [int(x) for x in series]
        except (TypeError, ValueError):
            raise BadInputError(f"pool {list(pools)[j]!r}: counts must be integers",
                                field="trace", value=str(p)) from None
    return Trace(ticks=np.arange(n, dtype=np.int64),
                 elapsed_s=np.arange(n, dtype=np.float64) * gaps.pop(),
                 pools=list(pools), available=avail, source=str(p))


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

"""What a policy may know about the spot market: history up to now, never after.

`MarketHistory` holds availability and prices per pool for ticks 0..n-1 plus
statistics derived causally (each value at tick t depends only on ticks <= t).
`MarketView` is that history seen at one tick `now`: its accessors never index
past `now`. The simulator builds one history over the whole trace and moves
`now`; the daemon builds one from what it has observed so far (`now` = last row).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np

# Guards ceil of seconds over ticks against float noise (as simulate.model rounds).
_ROUND_EPS = 1e-9


def run_ages(up: np.ndarray) -> np.ndarray:
    """Int [n, P]: how many ticks each column's current run of one value (up or down, or
    any state) has lasted at each tick."""
    n, n_pools = up.shape
    ages = np.ones((n, n_pools), dtype=np.int64)
    if n == 0:
        return ages
    idx = np.arange(n)[:, None]
    change = np.ones((n, n_pools), dtype=bool)
    change[1:] = up[1:] != up[:-1]
    start = np.where(change, idx, 0)
    start = np.maximum.accumulate(start, axis=0)
    return idx - start + 1


def closed_after_reclaims(up: np.ndarray, tick_s: float, window_s: float) -> np.ndarray:
    """Bool [n, P]: pool j is closed to launches at tick t, a reclaim (up -> down) having been
    seen at some r <= t with (t - r) x tick_s < window_s: each reclaim of the trace counts as
    an interruption notice in its pool at that tick (decide/quarantine.py). Causal."""
    n, n_pools = up.shape
    if window_s <= 0 or n == 0:
        return np.zeros((n, n_pools), dtype=bool)
    # Ticks a reclaim keeps its pool closed, its own tick included.
    k = max(1, math.ceil(window_s / tick_s - _ROUND_EPS))
    ends = np.zeros((n, n_pools), dtype=np.int64)
    ends[1:] = up[:-1] & ~up[1:]
    seen = np.cumsum(ends, axis=0)
    before = np.zeros_like(seen)
    if k < n:
        before[k:] = seen[:-k]
    return (seen - before) > 0


def _stretches(col: np.ndarray, value: bool) -> tuple[np.ndarray, np.ndarray]:
    """(observed_at, length) of completed runs of `value`; observed when the run ends."""
    x = np.concatenate(([0], (col == value).astype(np.int8), [0])).astype(np.int8)
    d = np.diff(x)
    starts = np.flatnonzero(d == 1)
    ends = np.flatnonzero(d == -1)           # first tick after the run
    keep = ends < len(col)                   # runs still going at the end are not complete
    return ends[keep], (ends - starts)[keep]


@dataclass
class _PoolRuns:
    up_ends: np.ndarray       # tick at which each completed up-run was seen to end (a reclaim)
    up_lengths: np.ndarray
    down_ends: np.ndarray
    down_lengths: np.ndarray


class MarketHistory:
    """Availability and prices of every pool, ticks 0..n-1, with causal statistics."""

    def __init__(self, pools: list[str], up: np.ndarray, price_usd_per_hour: np.ndarray,
                 od_price_usd_per_hour: float, tick_s: float,
                 mtbf_prior_h: list[float] | None = None, *,
                 notice_quarantine_s: float = 0.0) -> None:
        self.pools = list(pools)
        # The provider's prior mean hours between reclaims per pool (its risk data), weighed
        # by policies as one pseudo-reclaim; None: they use the packaged pooled figure.
        self.mtbf_prior_h = None if mtbf_prior_h is None else [float(x) for x in mtbf_prior_h]
        # How long a reclaim seen here closes its pool to launches (the provider's
        # notice_quarantine_s; 0: never).
        self.notice_quarantine_s = float(notice_quarantine_s)
        self._closed_rows: list[list[bool]] | None = None
        self.up = np.ascontiguousarray(up, dtype=bool)
        self.price = np.ascontiguousarray(price_usd_per_hour, dtype=np.float64)
        self.od_price_usd_per_hour = float(od_price_usd_per_hour)
        self.tick_s = float(tick_s)
        self.cum_up = np.cumsum(self.up, axis=0)
        self.ages = run_ages(self.up)
        self.runs = []
        for j in range(len(self.pools)):
            ue, ul = _stretches(self.up[:, j], True)
            de, dl = _stretches(self.up[:, j], False)
            self.runs.append(_PoolRuns(ue, ul, de, dl))
        self._up_end_lists = [r.up_ends.tolist() for r in self.runs]
        # Python rows: policies read one row per decision, much faster than numpy scalars.
        self.up_rows: list[list[bool]] = self.up.tolist()
        self.price_rows: list[list[float]] = self.price.tolist()
        self._down_end_lists = [r.down_ends.tolist() for r in self.runs]
        self._some_up: tuple[np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.up)

    def some_up(self) -> tuple[np.ndarray, np.ndarray]:
        """(bool [n]: some pool up at each tick, int [n]: how long that state has lasted).

        Causal like every statistic here; computed on first use.
        """
        if self._some_up is None:
            x = self.up.any(axis=1)
            self._some_up = (x, run_ages(x[:, None])[:, 0])
        return self._some_up

    def closed_rows(self) -> list[list[bool]] | None:
        """Per tick and pool: closed by a reclaim seen within the quarantine (None: no
        quarantine). Computed on first use."""
        if self.notice_quarantine_s <= 0:
            return None
        if self._closed_rows is None:
            self._closed_rows = closed_after_reclaims(self.up, self.tick_s,
                                                      self.notice_quarantine_s).tolist()
        return self._closed_rows

    def view(self, now: int) -> "MarketView":
        """The market as known at tick now."""
        if not 0 <= now < len(self.up_rows):
            raise IndexError(f"tick {now} outside the observed history")
        return MarketView(self, now)

    def extended(self, up_row: np.ndarray, price_row: np.ndarray) -> "MarketHistory":
        """A new history with one more observed tick (the daemon's way to grow it)."""
        return MarketHistory(self.pools, np.vstack([self.up, up_row[None, :]]),
                             np.vstack([self.price, price_row[None, :]]),
                             self.od_price_usd_per_hour, self.tick_s, self.mtbf_prior_h,
                             notice_quarantine_s=self.notice_quarantine_s)


class MarketView:
    """The market at tick `now`: current availability and prices, and the past."""

    __slots__ = ("h", "now")

    def __init__(self, history: MarketHistory, now: int) -> None:
        self.h = history
        self.now = now

    @property
    def pools(self) -> list[str]:
        """Pool names, in column order."""
        return self.h.pools

    @property
    def tick_s(self) -> float:
        """Seconds per observation."""
        return self.h.tick_s

    @property
    def od_price_usd_per_hour(self) -> float:
        """On-demand price."""
        return self.h.od_price_usd_per_hour

    def up_now(self) -> list[bool]:
        """Bool per pool: spot available now (do not modify)."""
        return self.h.up_rows[self.now]

    def closed_now(self) -> list[bool] | None:
        """Bool per pool: a reclaim seen within the quarantine closes it to launches now
        (None: the history has no quarantine)."""
        rows = self.h.closed_rows()
        return None if rows is None else rows[self.now]

    def price_now(self) -> list[float]:
        """Spot price per pool now, USD/hour (do not modify)."""
        return self.h.price_rows[self.now]

    def age_ticks(self, j: int) -> int:
        """How long pool j has been in its current state (up or down), in ticks."""
        return int(self.h.ages[self.now, j])

    def uptime_fraction(self, j: int) -> float:
        """Share of observed ticks (0..now) in which pool j was available."""
        return float(self.h.cum_up[self.now, j]) / (self.now + 1)

    def reclaims(self, j: int) -> int:
        """Up-runs of pool j seen to end so far (each a reclaim for a job on it)."""
        return bisect.bisect_right(self.h._up_end_lists[j], self.now)

    def last_reclaim_tick(self, j: int) -> int | None:
        """The tick at which pool j was last seen to go down from up (None: never so far)."""
        k = self.reclaims(j)
        return self.h._up_end_lists[j][k - 1] if k else None

    def up_stretches(self, j: int) -> np.ndarray:
        """Lengths (ticks) of pool j's completed up-runs observed so far."""
        r = self.h.runs[j]
        return r.up_lengths[:self.reclaims(j)]

    def down_stretches(self, j: int) -> np.ndarray:
        """Lengths (ticks) of pool j's completed down-runs observed so far."""
        r = self.h.runs[j]
        k = bisect.bisect_right(self.h._down_end_lists[j], self.now)
        return r.down_lengths[:k]

    def up_history(self, j: int) -> np.ndarray:
        """Availability of pool j for ticks 0..now (read-only view)."""
        v = self.h.up[:self.now + 1, j]
        v.flags.writeable = False
        return v


class ClosedView(MarketView):
    """The market at `now` with some pools closed to launches: they look unavailable now."""

    __slots__ = ("_up",)

    def __init__(self, view: MarketView, closed: set[int]) -> None:
        super().__init__(view.h, view.now)
        self._up = [ok and j not in closed for j, ok in enumerate(view.up_now())]

    def up_now(self) -> list[bool]:
        """Bool per pool: spot available now and not closed (do not modify)."""
        return self._up

"""A seeded synthetic market that changes regime halfway (bench and tests, issue 14).

No trace was tuned on it. First half: long up-stretches and short outages in every pool
(a market where waiting for spot pays). Second half: short, flappy up-stretches and long
outages, with outages shared by all pools a third of the time, and the pools' price order
reversed (a market where bridging on on-demand pays, and last month's cheap pool is dear).
"""

from __future__ import annotations

import numpy as np

from spotrun.traces import PriceBook, Trace

TICK_S = 300.0
ROWS = 7200                      # 600 h of 5-minute ticks
POOLS = ["syn-a", "syn-b", "syn-c", "syn-d"]
PRICES_FIRST = [0.90, 1.00, 1.15, 1.30]
# (mean up-stretch, mean outage) in ticks, per half
REGIMES = ((48.0, 12.0), (12.0, 24.0))


def _alternating(rng: np.random.Generator, n: int, up_mean: float, down_mean: float) -> np.ndarray:
    """Bool [n]: geometric up and down runs with these means, starting in a random state."""
    out = np.zeros(n, dtype=bool)
    state = bool(rng.random() < up_mean / (up_mean + down_mean))
    i = 0
    while i < n:
        length = int(rng.geometric(1.0 / (up_mean if state else down_mean)))
        out[i:i + length] = state
        i += length
        state = not state
    return out


def regime_change_market(seed: int = 0) -> tuple[Trace, PriceBook]:
    """The synthetic trace and its prices (deterministic for a seed)."""
    rng = np.random.default_rng(seed)
    half = ROWS // 2
    avail = np.zeros((ROWS, len(POOLS)), dtype=np.int64)
    for j in range(len(POOLS)):
        first = _alternating(rng, half, *REGIMES[0])
        second = _alternating(rng, ROWS - half, *REGIMES[1])
        avail[:, j] = np.concatenate([first, second])
    # market-wide outages in the second half: a third of its ticks, in runs of ~2 h
    shared = _alternating(rng, ROWS - half, 48.0, 24.0)
    avail[half:][~shared] = 0
    prices = PriceBook(points={
        p: ([0, half], [PRICES_FIRST[j], PRICES_FIRST[len(POOLS) - 1 - j]])
        for j, p in enumerate(POOLS)})
    ticks = np.arange(ROWS, dtype=np.int64)
    trace = Trace(ticks=ticks, elapsed_s=ticks * TICK_S, pools=list(POOLS), available=avail,
                  source=f"synthetic-regime-change-seed{seed}")
    return trace, prices

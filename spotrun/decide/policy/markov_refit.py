"""When the `markov-tiers` plan refits its market model, besides every half deadline.

Two events make the model of the latest refit stale before its time, and each refits it
at the row it is seen (so the refit rows, like every choice, are a function of the market
rows and the job's shape: a restarted daemon finds the same ones):

- the pools' price tiers change (with more than one tier): a plan must not go on waiting for
  last week's cheap pool once it is the dear one;
- a surprise: no pool has been up for SURPRISE_RUNS times the model's mean outage. The
  market has likely changed regime (outages grew), so the refit fits only the rows after
  the most likely change of the market's transitions (`change_point`), when that change
  is beyond chance; otherwise its usual window. The next surprise is looked for under the
  new model.
"""

from __future__ import annotations

import bisect
import weakref

import numpy as np

from spotrun.decide.policy.history import MarketHistory, run_ages

# Pools within TIER_GAP of a tier's cheapest price share it.
TIER_GAP = 0.05
SURPRISE_RUNS = 2.0
# A change point must raise the chain's log-likelihood ratio past CP_LR (twice the gain in
# log-likelihood; about 6 standard deviations for the few free transition rates) and leave
# CP_MIN_ROWS rows on each side.
CP_LR = 30.0
CP_MIN_ROWS = 24

# Per history: {max_tiers: rows at which the tiers change}, {tier_of: (states, ages)}.
_TIER_CHANGES: "weakref.WeakKeyDictionary[MarketHistory, dict]" = weakref.WeakKeyDictionary()
_STATES: "weakref.WeakKeyDictionary[MarketHistory, dict]" = weakref.WeakKeyDictionary()


def price_tiers(price_row: list[float], max_tiers: int) -> tuple[int, ...]:
    """Each pool's price tier at a row: cheapest first, next past TIER_GAP, max_tiers at most."""
    order = sorted(range(len(price_row)), key=lambda j: price_row[j])
    tier_of = [0] * len(price_row)
    t, base = 0, price_row[order[0]] if order else 0.0
    for j in order:
        if price_row[j] > base * (1.0 + TIER_GAP) and t + 1 < max_tiers:
            t, base = t + 1, price_row[j]
        tier_of[j] = t
    return tuple(tier_of)


def market_states(up: np.ndarray, tier_of: tuple[int, ...]) -> np.ndarray:
    """Per row: 0 when no pool is up, else 1 + the cheapest tier with a pool up."""
    tiers = np.asarray(tier_of)
    top = int(tiers.max()) + 1
    t_min = np.where(up, tiers[None, :], top).min(axis=1)
    return np.where(t_min == top, 0, t_min + 1)


def tier_changes(h: MarketHistory, max_tiers: int) -> list[int]:
    """Rows at which the pools' price tiers differ from the row before (cached per history)."""
    per = _TIER_CHANGES.setdefault(h, {})
    hit = per.get(max_tiers)
    if hit is None:
        moved = np.flatnonzero((h.price[1:] != h.price[:-1]).any(axis=1)) + 1
        hit = []
        last = price_tiers(h.price_rows[0], max_tiers) if len(h) else ()
        for r in moved.tolist():
            tiers = price_tiers(h.price_rows[r], max_tiers)
            if tiers != last:
                hit.append(r)
                last = tiers
        per[max_tiers] = hit
    return hit


def base_row(h: MarketHistory, now: int, grid: int, max_tiers: int) -> int:
    """The latest scheduled refit at `now`: a row of the grid, or a later change of the tiers."""
    row = now // grid * grid
    if max_tiers > 1:
        changes = tier_changes(h, max_tiers)
        k = bisect.bisect_right(changes, now)
        if k and changes[k - 1] > row:
            row = changes[k - 1]
    return row


def next_refit(h: MarketHistory, now: int, grid: int, max_tiers: int) -> int:
    """The first row after `now` whose scheduled refit (`base_row`) may differ from now's."""
    row = (now // grid + 1) * grid
    if max_tiers > 1:
        changes = tier_changes(h, max_tiers)
        k = bisect.bisect_right(changes, now)
        if k < len(changes):
            row = min(row, changes[k])
    return row


def state_runs(h: MarketHistory, tier_of: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(market state per row, how many rows it has lasted) for these tiers (cached per history)."""
    per = _STATES.setdefault(h, {})
    hit = per.get(tier_of)
    if hit is None:
        m = market_states(h.up, tier_of)
        hit = per[tier_of] = (m, run_ages(m[:, None])[:, 0])
    return hit


def first_surprise(h: MarketHistory, tier_of: tuple[int, ...], outage_ticks: float,
                   lo: int, hi: int) -> int:
    """The first row in lo..hi at which an outage of every pool reaches SURPRISE_RUNS times
    the model's mean outage (-1: none). Only the row it reaches the mark counts, so one
    outage refits a model once."""
    if hi < lo:
        return -1
    m, age = state_runs(h, tier_of)
    mark = max(2, int(np.ceil(SURPRISE_RUNS * outage_ticks)))
    hit = np.flatnonzero((m[lo:hi + 1] == 0) & (age[lo:hi + 1] == mark))
    return lo + int(hit[0]) if len(hit) else -1


def _log_likelihood(counts: np.ndarray) -> np.ndarray:
    """Log-likelihood of a Markov chain's transitions from their counts [..., M, M]."""
    total = counts.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(counts > 0, counts * np.log(counts / np.where(total > 0, total, 1.0)),
                         0.0)
    return terms.sum(axis=(-1, -2))


def change_point(m: np.ndarray, n_states: int) -> int:
    """Index into m after which its transitions most likely changed; 0 when no split beats
    one chain by CP_LR (twice the log-likelihood gained)."""
    if len(m) < 2 * CP_MIN_ROWS + 1:
        return 0
    M = n_states
    onehot = np.zeros((len(m) - 1, M * M))
    onehot[np.arange(len(m) - 1), m[:-1] * M + m[1:]] = 1.0
    cum = np.cumsum(onehot, axis=0).reshape(-1, M, M)
    total = cum[-1]
    splits = np.arange(CP_MIN_ROWS, len(m) - CP_MIN_ROWS)
    before = cum[splits - 1]                    # transitions into rows 1..split
    gain = 2.0 * (_log_likelihood(before) + _log_likelihood(total[None] - before)
                  - _log_likelihood(total))
    k = int(np.argmax(gain))
    return int(splits[k]) if gain[k] > CP_LR else 0

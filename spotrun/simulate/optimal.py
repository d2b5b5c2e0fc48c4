"""The hindsight optimum: exact dynamic programming over ticks x lost time x placement.

Simulator only (it sees the whole trace). State at the start of tick tau of a run:
`lost` = ticks so far without progress (idle, changeover, reclaim), so the work done
is tau - lost, and the placement m the job was productive on (0 idle, 1 on-demand,
2+j spot pool j). Moves follow the simulator's rules exactly:
  idle          -> lost + 1, free;
  stay in m     -> progress, pays m's price (spot needs the pool up);
  launch m'     -> C ticks of changeover at m''s prices (spot needs the pool up for all
                   of them, and not closed by a recent reclaim at tau), then productive
                   in m' at lost + C;
  on spot j with j down at tau -> reclaimed: idle this tick, unpaid.
A launch that is later abandoned or reclaimed mid-changeover is never better than
idling, so the DP omits it. Runs are batched (numpy over starts x lost) per tick.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from spotrun.decide.policy.base import Decision, IDLE, Mode, ON_DEMAND

if TYPE_CHECKING:
    from spotrun.simulate.model import SimModel

_INF = np.inf
_CHUNK_BYTES = 160 * 1024 * 1024


def _launch_windows(up: np.ndarray, price: np.ndarray, c: int) -> tuple[np.ndarray, np.ndarray]:
    """Per (tick, pool): changeover cost starting there, and whether the pool stays up."""
    n, n_pools = up.shape
    if c == 0:
        return np.zeros((n, n_pools)), up.copy()
    cu = np.vstack([np.zeros((1, n_pools), dtype=np.int64), np.cumsum(up, axis=0)])
    cp = np.vstack([np.zeros((1, n_pools)), np.cumsum(price, axis=0)])
    ok = np.zeros((n, n_pools), dtype=bool)
    cost = np.full((n, n_pools), _INF)
    m = n - c + 1
    if m > 0:
        ok[:m] = (cu[c:c + m] - cu[:m]) == c
        cost[:m] = cp[c:c + m] - cp[:m]
    return cost, ok


class _Inputs:
    """Per-run arrays, placements on-demand then pools, USD per tick (inf = not allowed)."""

    def __init__(self, model: "SimModel", rows: np.ndarray) -> None:
        h = model.history
        tick_h = model.tick_h
        self.D, self.W, self.C = model.deadline_ticks, model.work_ticks, model.changeover_ticks
        self.L = self.D - self.W
        self.M = 2 + len(h.pools)
        self.S = len(rows)
        od = h.od_price_usd_per_hour * tick_h
        lc, lok = _launch_windows(h.up, h.price * tick_h, self.C)
        idx = rows[None, :] + np.arange(self.D)[:, None]                   # [D, S]
        D, S, K = self.D, self.S, self.M - 1
        self.up = np.ones((D, K, S), dtype=bool)
        self.up[:, 1:] = h.up[idx].transpose(0, 2, 1)
        self.cost = np.full((D, K, S), od)
        self.cost[:, 1:] = np.where(self.up[:, 1:], (h.price * tick_h)[idx].transpose(0, 2, 1),
                                    _INF)
        self.lc = np.full((D, K, S), od * self.C)
        # A launch into a pool a recent reclaim closed is not allowed (decide/quarantine.py).
        shut = h.closed_rows()
        if shut is not None:
            lok = lok & ~np.asarray(shut, dtype=bool)
        self.lc[:, 1:] = np.where(lok[idx], lc[idx], _INF).transpose(0, 2, 1)
        late = np.arange(D) + self.C > D                                    # lands too late
        self.lc[late] = _INF
        self.down = ~self.up


def _step(inp: _Inputs, tau: int, v1: np.ndarray, vc: np.ndarray, out: np.ndarray,
          tmp: np.ndarray, want_choice: bool) -> np.ndarray | None:
    """V at tau into out, from V at tau+1 (v1) and tau+C (vc); arrays [M, S, Lp].

    Only lost-time values lo..hi are computed: below lo the work is done (V = 0, kept
    from the terminal fill), above hi the state cannot be reached by tick tau.
    """
    C = inp.C
    lo, hi = max(0, tau - inp.W + 1), min(inp.L, tau)
    if lo > hi:
        return None
    band = slice(lo, hi + 1)
    n = hi + 1 - lo
    idle_val = v1[0, :, lo + 1:hi + 2]                                       # [S, n]
    stay = tmp[0][:, :, :n]
    np.add(inp.cost[tau][:, :, None], v1[1:, :, band], out=stay)            # [K, S, n]
    if C == 0:
        # Launching is staying's cost where a launch is allowed (lc: 0 there, else inf).
        cand = tmp[1][:, :, :n]
        np.add(stay, inp.lc[tau][:, :, None], out=cand)
    else:
        cand = tmp[1][:, :, :n]
        np.add(inp.lc[tau][:, :, None], vc[1:, :, lo + C:hi + C + 1], out=cand)
    launch = cand.min(axis=0)
    a = np.minimum(idle_val, launch)
    out[0, :, band] = a
    dst = out[1:, :, band]
    np.minimum(a[None], stay, out=dst)
    np.copyto(dst, idle_val[None], where=inp.down[tau][:, :, None])
    if not want_choice:
        return None
    # -1 idle, 0 stay, 1 + k launch placement k (k over on-demand, pools)
    choice = np.full((inp.M, inp.S, inp.L + 1), -1, dtype=np.int8)
    ca = np.where(launch < idle_val, 1 + cand.argmin(axis=0), -1)
    choice[0, :, band] = ca
    stay_wins = stay <= a[None]
    choice[1:, :, band] = np.where(inp.up[tau][:, :, None], np.where(stay_wins, 0, ca[None]), -1)
    return choice


def _solve(inp: _Inputs, want_choice: bool) -> tuple[float | np.ndarray, list[np.ndarray]]:
    """Backward pass; returns V[idle, :, lost 0] at tick 0 and, if asked, the choices."""
    D, C = inp.D, inp.C
    Lp = inp.L + 1 + C + 1
    R = max(C + 1, 2)                # ring[tau % R] = V at tau; starts as the deadline's V
    ring = []
    for _ in range(R):
        v = np.full((inp.M, inp.S, Lp), _INF)
        v[:, :, :inp.L + 1] = 0.0
        ring.append(v)
    tmp = np.empty((2, inp.M - 1, inp.S, inp.L + 1))
    choices: list[np.ndarray] = [None] * D if want_choice else []  # type: ignore[list-item]
    for tau in range(D - 1, -1, -1):
        v1 = ring[(tau + 1) % R]
        vc = ring[(tau + C) % R]
        out = ring[tau % R]
        ch = _step(inp, tau, v1, vc, out, tmp, want_choice)
        if want_choice:
            choices[tau] = ch if ch is not None else np.full((inp.M, inp.S, inp.L + 1), -1,
                                                             dtype=np.int8)
    return ring[0][0, :, 0], choices


def optimal_costs(model: "SimModel", rows: np.ndarray) -> np.ndarray:
    """Hindsight-optimal cost (USD) of each run starting at rows (batched)."""
    rows = np.asarray(rows, dtype=np.int64)
    per_run = (model.changeover_ticks + 2) * (len(model.pools) + 2) * \
        (model.deadline_ticks - model.work_ticks + model.changeover_ticks + 2) * 8 * 4
    chunk = max(1, _CHUNK_BYTES // max(per_run, 1))
    out = np.empty(len(rows))
    for i in range(0, len(rows), chunk):
        inp = _Inputs(model, rows[i:i + chunk])
        v0, _ = _solve(inp, want_choice=False)
        out[i:i + chunk] = v0
    return out


def optimal_schedule(model: "SimModel", row: int) -> tuple[float, list[Decision]]:
    """The optimal cost of one run and its decision for every tick until the work is done."""
    inp = _Inputs(model, np.asarray([row], dtype=np.int64))
    v0, choices = _solve(inp, want_choice=True)
    h = model.history
    pools = h.pools
    placements = [ON_DEMAND] + [Decision(Mode.SPOT, p) for p in pools]
    out: list[Decision] = []
    tau, lost, m = 0, 0, 0
    while tau < inp.D and tau - lost < inp.W:
        if m >= 2 and not h.up[row + tau, m - 2]:
            out.append(IDLE)             # reclaimed (the DP never plans this; kept for safety)
            tau, lost, m = tau + 1, lost + 1, 0
            continue
        c = int(choices[tau][m, 0, lost])
        if c == -1:
            out.append(IDLE)
            tau, lost, m = tau + 1, lost + 1, 0
        elif c == 0:
            out.append(placements[m - 1])
            tau += 1
        else:
            out.extend([placements[c - 1]] * inp.C)
            tau, lost, m = tau + inp.C, lost + inp.C, c
    return float(v0[0]), out

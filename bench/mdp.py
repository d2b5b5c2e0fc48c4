"""Finite-horizon MDP for one deadline job on a Markov spot market (bench only, issue 14).

State at the start of tick tau of a run: the market's hidden state h (an index into a
Markov chain whose transition from tick t to t+1 is given), the placement m (0 idle,
1 + k * Cc + c: placement k (0 on-demand, 1 + j spot pool j) with c ticks of changeover
still to pay, Cc = max(C, 1)), and `lost` = ticks so far without progress (so the work
done is tau - lost and the slack is D - W - C - lost ticks). The moves follow
`spotrun.simulate.engine.run_policy` exactly: on spot in a pool that is down at tau the
tick is a reclaim (idle, unpaid, no decision); otherwise idle, stay, or launch a placement
(pays the tick, C ticks of changeover). Actions are restricted as `safety_net` restricts
every product policy (idle needs 1 tick of slack, spot needs the changeover still to pay
+ 1), so the optimum here is the best any policy under the net can do in expectation with
the information h carries.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

BIG = 1e12


class MarkovDP:
    """Backward induction for one window; keeps the argmin choice of every reachable state."""

    def __init__(self, work: int, deadline: int, changeover: int, obs: np.ndarray,
                 trans: Callable[[int], np.ndarray], price_per_tick: np.ndarray) -> None:
        self.W, self.D, self.C = work, deadline, changeover
        self.L = deadline - work
        self.obs = np.asarray(obs, dtype=bool)            # [H, P]
        self.H, self.P = self.obs.shape
        self.K = 1 + self.P
        self.Cc = max(changeover, 1)
        self.M = 1 + self.K * self.Cc
        self.choices: list[np.ndarray] = [None] * deadline  # type: ignore[list-item]
        self.lo = np.array([max(0, t - work + 1) for t in range(deadline)])
        self.v0 = self._solve(trans, np.asarray(price_per_tick, dtype=np.float64))

    def m_index(self, k: int, c: int) -> int:
        """Placement index of placement k with c changeover ticks still to pay."""
        return 1 + k * self.Cc + c

    def _solve(self, trans: Callable[[int], np.ndarray], price: np.ndarray) -> np.ndarray:
        W, D, C, L, H, K, M = self.W, self.D, self.C, self.L, self.H, self.K, self.M
        Lp = L + 2
        ks = np.array([(m - 1) // self.Cc for m in range(1, M)])
        cs = np.array([(m - 1) % self.Cc for m in range(1, M)])
        has_c = cs > 0
        prev_c = np.where(has_c, [self.m_index(k, c - 1) if c > 0 else 0
                                  for k, c in zip(ks, cs)], 0)
        land = [self.m_index(k, C - 1) if C > 0 else self.m_index(k, 0) for k in range(K)]
        spot_m = ks >= 1
        down = ~self.obs                                            # [H, P]
        reclaimed = np.zeros((H, M - 1), dtype=bool)
        reclaimed[:, spot_m] = down[:, ks[spot_m] - 1]
        v = np.zeros((H, M, Lp))
        v[:, :, L + 1] = BIG
        for tau in range(D - 1, -1, -1):
            lo, hi = int(self.lo[tau]), min(L, tau)
            n = hi - lo + 1
            T = trans(tau)
            ev = np.tensordot(T, v[:, :, lo:hi + 2], axes=(1, 0))   # [H, M, n + 1]
            e0, e1 = ev[:, :, :n], ev[:, :, 1:]
            slack = L - C - np.arange(lo, hi + 1)                   # [n]
            p = price[tau]                                          # [K]
            q_idle = np.where(slack >= 1, e1[:, 0, :], BIG)         # [H, n]
            nxt = e1 if C > 0 else e0
            q_launch = p[None, :, None] + nxt[:, land, :]           # [H, K, n]
            spot_ok = self.obs[:, :, None] & (slack >= C + 1)[None, None, :]
            q_launch[:, 1:, :] = np.where(spot_ok, q_launch[:, 1:, :], BIG)
            stay_next = np.where(has_c[None, :, None], e1[:, prev_c, :], e0[:, 1:, :])
            q_stay = p[ks][None, :, None] + stay_next               # [H, M-1, n]
            stay_ok = (~spot_m[:, None]) | (slack[None, :] >= cs[:, None] + 1)
            q_stay = np.where(stay_ok[None], q_stay, BIG)
            # options per (h, m, n): 0 stay, 1 idle, 2 + k launch k (not the current k)
            opts = np.empty((H, M, 2 + K, n))
            opts[:, 0, 0] = BIG
            opts[:, 1:, 0] = q_stay
            opts[:, :, 1] = q_idle[:, None, :]
            opts[:, :, 2:] = q_launch[:, None, :, :]
            for k in range(K):
                opts[:, 1:, 2 + k][:, ks == k] = BIG
            choice = opts.argmin(axis=2)
            best = np.take_along_axis(opts, choice[:, :, None, :], axis=2)[:, :, 0, :]
            rec = np.broadcast_to(e1[:, :1, :], (H, M - 1, n))
            best[:, 1:] = np.where(reclaimed[:, :, None], rec, best[:, 1:])
            new = np.zeros((H, M, Lp))
            new[:, :, lo:hi + 1] = best
            new[:, :, hi + 1:] = BIG          # lost > tau: not reachable; L + 1: past the deadline
            v = new
            self.choices[tau] = choice.astype(np.int8)
        return v[:, 0, 0].copy()

    def choice(self, tau: int, h: int, m: int, lost: int) -> int:
        """-1 idle, 0 stay, 1 + k launch placement k (0 on-demand, 1 + j pool j)."""
        c = int(self.choices[tau][h, m, lost - int(self.lo[tau])])
        return 0 if c == 0 else (-1 if c == 1 else c - 1)


def chain2(up_mean: float, down_mean: float) -> np.ndarray:
    """2x2 transition of geometric up/down runs with these means (index 0 down, 1 up)."""
    return np.array([[1 - 1 / down_mean, 1 / down_mean], [1 / up_mean, 1 - 1 / up_mean]])


def stationary2(up_mean: float, down_mean: float) -> np.ndarray:
    """(P(down), P(up)) of that chain."""
    return np.array([down_mean, up_mean]) / (up_mean + down_mean)


def kron_all(mats: list[np.ndarray]) -> np.ndarray:
    """Kronecker product, the first matrix the most significant bit."""
    out = np.ones((1, 1))
    for a in mats:
        out = np.kron(out, a)
    return out

"""The `markov-tiers` plan's solver: backward induction for one job shape on a fitted market.

The market model (markov.fit) is a Markov chain over price tiers: the pools fall into a few
tiers by price, and the market state is "none up" or "the cheapest tier with a pool up is
t" (so the plan can wait for a cheaper tier while a dearer one is up); a job on spot stays
in its pool's tier until reclaimed, at that tier's reclaim rate. The job's state is (time
left k, work left r, placement, changeover still to pay, market state); because the model
is time-homogeneous, one table over every (k, r) of the shape serves every run of that
shape, live or in shadow, until the next refit, whatever its progress.

Coarse grid: a step is `g` ticks, g a divisor of the changeover (so a launch still pays a
whole number of steps), the smallest one that keeps the table within `MAX_STEPS` steps of
time. Moves follow the simulator's rules at the step's scale (spotrun.decide.policy.replay):
  idle           -> time passes, free;
  on-demand      -> progress, pays g ticks at the on-demand price;
  spot           -> progress, pays g ticks at the spot price, unless reclaimed during the
                    step: the step is lost and unpaid, the job is idle;
  launch         -> pays the changeover (C ticks at the new price) up front, then C / g
                    steps without progress (a spot launch can be reclaimed meanwhile).
The table keeps, per decision state and work left, only the steps of time left at which
the best action changes (a few per row), so it stays small for long jobs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BIG = 1e12               # an infeasible state's cost (finite: 0 x BIG stays 0)
MAX_STEPS = 720          # time steps of one table: the grid coarsens past it
TIE_USD = 1e-6           # the price of a step's wait: breaks exact ties toward progress
WAIT, ON_DEMAND, SPOT = 0, 1, 2
BLOCK_STEPS = 64         # steps whose actions are computed together


def step_ticks(deadline_ticks: int, changeover_ticks: int) -> int:
    """Ticks per planning step: 1, or the smallest divisor of the changeover that fits."""
    if deadline_ticks <= MAX_STEPS or changeover_ticks <= 1:
        return 1
    for g in range(2, changeover_ticks + 1):
        if changeover_ticks % g == 0 and deadline_ticks / g <= MAX_STEPS:
            return g
    return changeover_ticks


@dataclass(frozen=True)
class Chain:
    """The fitted market at the step's scale (probabilities per step, USD).

    Pools fall into T price tiers (cheapest first). Market states m = 0 (none up) and
    m = 1 + t (the cheapest tier with a pool up is t: a launch takes that tier); a job on
    spot is in its pool's tier s and stays there until reclaimed.
    """

    market: np.ndarray          # [T + 1, T + 1] per step, for a job not on spot
    spot: np.ndarray            # [T, T] per step: a spot job's pool stays up (diagonal)
    after_reclaim: np.ndarray   # [T, T + 1] (or [T + 1] for one tier): the market state
    #                             at the step after a reclaim of a tier's pool
    od_usd: float               # one step on on-demand
    spot_usd: np.ndarray | float          # one step on spot, per tier
    od_launch_usd: float        # a changeover on on-demand
    spot_launch_usd: np.ndarray | float   # a changeover on spot, per tier
    tier_of: tuple[int, ...] = ()         # each pool's tier (empty: not fitted on pools)
    outage_ticks: float = 0.0             # mean run of "none up" in the fit, in ticks

    @property
    def tiers(self) -> int:
        """Price tiers T."""
        return len(self.spot)


def decision_state(mode: str, market_state: int, tier: int, tiers: int) -> int:
    """The table row of a decision: idle / on-demand (market state), or on spot (its tier)."""
    if mode == "idle":
        return market_state
    if mode == "on-demand":
        return tiers + 1 + market_state
    return 2 * (tiers + 1) + tier


@dataclass(frozen=True)
class Table:
    """Best actions for one job shape, as change points along time left.

    Entry i: from key (state * (W + 1) + r) * (K + 1) + k on, the action is acts[i].
    """

    g: int                    # ticks per step
    work_steps: int           # W
    time_steps: int           # K
    tiers: int
    tier_of: tuple[int, ...]  # each pool's price tier (empty: not fitted on pools)
    outage_ticks: float       # mean run of "none up" in the fitted model, in ticks
    keys: np.ndarray          # int64, sorted
    acts: np.ndarray          # int8

    def action(self, state: int, time_left_ticks: float, work_left_ticks: float) -> int:
        """The table's action in a decision state for the job's exact work and time left."""
        k = min(int(time_left_ticks // self.g), self.time_steps)
        r = min(int(-(-work_left_ticks // self.g)), self.work_steps)
        if r > k:                 # beyond the plan's reach: only on-demand can still finish
            return ON_DEMAND
        key = (state * (self.work_steps + 1) + r) * (self.time_steps + 1) + k
        return int(self.acts[int(self.keys.searchsorted(key, side="right")) - 1])

    @property
    def nbytes(self) -> int:
        """Memory held."""
        return int(self.keys.nbytes + self.acts.nbytes)


def solve(work_ticks: int, deadline_ticks: int, changeover_ticks: int, chain: Chain,
          g: int) -> Table:
    """Backward induction over time left (steps), vectorised over work left and states."""
    W = -(-work_ticks // g)
    K = deadline_ticks // g
    C = changeover_ticks // g
    Cc = max(C, 1)
    T = chain.tiers
    M = T + 1
    n = W + 1
    pm, um = chain.market, chain.spot
    ar = np.atleast_2d(chain.after_reclaim)                 # [T, M]
    lost = (1.0 - um.sum(axis=1))[:, None]                 # [T, 1] reclaimed during a step
    od = chain.od_usd
    sp = np.broadcast_to(np.asarray(chain.spot_usd, dtype=float), (T,))[:, None]
    sp_launch = np.broadcast_to(np.asarray(chain.spot_launch_usd, dtype=float), (T,))[:, None]
    keep_sp = (1.0 - lost) * sp                             # a step on spot not reclaimed
    # values at the step before (read) and the one being computed (written), swapped
    idle, idle_new = np.full((M, n), BIG), np.empty((M, n))
    odv, odv_new = np.full((Cc, M, n), BIG), np.empty((Cc, M, n))
    spv, spv_new = np.full((Cc, T, n), BIG), np.empty((Cc, T, n))
    for arr in (idle, odv, spv):
        arr[..., 0] = 0.0
    sh_od = np.zeros((M, n))            # on-demand values a step of work further on
    sh_sp = np.zeros((T, n))
    lost_after = np.empty((T, n))
    # the compared values of BLOCK_STEPS steps, turned into actions a block at a time: on
    # arrays this small a numpy call's overhead, not its arithmetic, is what a step costs,
    # and the comparisons are a dozen calls (the values are the same as step by step)
    B = min(BLOCK_STEPS, K)
    wait_b, stay_od_b, land_od_b = (np.empty((B, M, n)) for _ in range(3))
    stay_sp_b, land_sp_b = np.empty((B, T, n)), np.empty((B, T, n))
    hopeless_b = np.empty((B, n), dtype=bool)
    rows = 2 * M + T
    act = np.empty((K + 1, rows, n), dtype=np.int8)      # the best action per step
    act[0] = ON_DEMAND
    for k in range(1, K + 1):
        b = (k - 1) % B
        wait, stay_od, land_od = wait_b[b], stay_od_b[b], land_od_b[b]
        stay_sp, land_sp = stay_sp_b[b], land_sp_b[b]
        np.matmul(pm, idle, out=wait)
        wait += TIE_USD
        np.multiply(lost, ar @ idle, out=lost_after)        # reclaimed: idle after it
        sh_od[:, 1:] = odv[0][:, :-1]
        np.matmul(pm, sh_od, out=stay_od)
        stay_od += od
        sh_sp[:, 1:] = spv[0][:, :-1]
        np.matmul(um, sh_sp, out=stay_sp)
        stay_sp += keep_sp
        stay_sp += lost_after
        if C >= 1:
            np.matmul(pm, odv[C - 1], out=land_od)
            land_od += chain.od_launch_usd
            np.matmul(um, spv[C - 1], out=land_sp)
            land_sp += sp_launch
            land_sp += lost_after
        else:
            np.add(stay_od, chain.od_launch_usd, out=land_od)
            np.add(stay_sp, sp_launch, out=land_sp)
        # market state 1 + t launches tier t; a job on tier s decides in market state 1 + s
        np.minimum(wait, land_od, out=idle_new)
        np.minimum(idle_new[1:], land_sp, out=idle_new[1:])
        np.minimum(wait, stay_od, out=odv_new[0])
        np.minimum(odv_new[0, 1:], land_sp, out=odv_new[0, 1:])
        np.minimum(wait[1:], land_od[1:], out=spv_new[0])
        np.minimum(spv_new[0], stay_sp, out=spv_new[0])
        if Cc > 1:
            np.matmul(pm, odv[:-1], out=odv_new[1:])
            np.matmul(um, spv[:-1], out=spv_new[1:])
            spv_new[1:] += lost_after
        idle, idle_new, odv, odv_new, spv, spv_new = idle_new, idle, odv_new, odv, spv_new, spv
        # no work left costs nothing; no clamp needed: a state beyond reach stays near BIG
        # (BIG plus a few costs), far above any reachable one
        for arr in (idle, odv, spv):
            arr[..., 0] = 0.0
        np.greater_equal(idle[0], BIG, out=hopeless_b[b])
        if b == B - 1 or k == K:
            _actions(act[k - b:k + 1], M, wait_b[:b + 1], stay_od_b[:b + 1],
                     land_od_b[:b + 1], stay_sp_b[:b + 1], land_sp_b[:b + 1],
                     hopeless_b[:b + 1])
    # keep, per (state, work left), only the steps at which the action changes
    changed = np.empty((K + 1, rows, n), dtype=bool)
    changed[0] = True
    np.not_equal(act[1:], act[:-1], out=changed[1:])
    k, s, r = np.nonzero(changed)
    keys = (s * n + r) * (K + 1) + k
    order = np.argsort(keys)
    return Table(g=g, work_steps=W, time_steps=K, tiers=T, tier_of=chain.tier_of,
                 outage_ticks=chain.outage_ticks, keys=keys[order], acts=act[k, s, r][order])


def _actions(out: np.ndarray, M: int, wait: np.ndarray, stay_od: np.ndarray,
             land_od: np.ndarray, stay_sp: np.ndarray, land_sp: np.ndarray,
             hopeless: np.ndarray) -> None:
    """The decision states' actions over a block of steps (argmin, ties to the first: wait,
    on-demand); where even waiting from idle with none up cannot finish, on-demand."""
    out[:, :M] = land_od < wait
    idle_or_od = np.minimum(wait[:, 1:], land_od[:, 1:])
    out[:, 1:M][land_sp < idle_or_od] = SPOT
    out[:, M:2 * M] = stay_od < wait
    out[:, M + 1:2 * M][land_sp < np.minimum(wait[:, 1:], stay_od[:, 1:])] = SPOT
    out[:, 2 * M:] = land_od[:, 1:] < wait[:, 1:]
    out[:, 2 * M:][stay_sp < idle_or_od] = SPOT
    out[np.broadcast_to(hopeless[:, None, :], out.shape)] = ON_DEMAND

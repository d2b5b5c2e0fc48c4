"""The `markov` candidate's planner: backward induction for one job shape on a fitted market.

The market model (markov.fit) is semi-Markov: the market is "none up" or "some pool up",
each state with the age of its run in a few buckets, so a run's chance of ending depends on
how long it has lasted (an outage that has lasted tends to last: heavy tails); a job on
spot follows its own pool's up-run the same way. The job's state is (time left k, work left
r, placement, changeover still to pay, market state); because the model is time-homogeneous,
one table over every (k, r) of the shape serves every run of that shape, live or in shadow,
until the next refit, whatever its progress.

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

    Market states x * B + b: x = 0 none up / 1 some up, b = the age bucket of that run
    (for "some up": the run of the pool a launch would take).
    """

    market: np.ndarray          # [2B, 2B] per step, for a job not on spot
    spot: np.ndarray            # [B, B] per step: a spot job's pool stays up, its age moves
    after_reclaim: np.ndarray   # [2B] the market state at the step after a reclaim
    od_usd: float               # one step on on-demand
    spot_usd: float             # one step on spot
    od_launch_usd: float        # a changeover on on-demand
    spot_launch_usd: float      # a changeover on spot

    @property
    def buckets(self) -> int:
        """Age buckets per run kind."""
        return len(self.spot)


def decision_state(mode: str, some_up: bool, bucket: int, buckets: int) -> int:
    """The table row of a decision: idle / on-demand (market state), or on spot (its age)."""
    x = int(some_up) * buckets + bucket
    if mode == "idle":
        return x
    if mode == "on-demand":
        return 2 * buckets + x
    return 4 * buckets + bucket


@dataclass(frozen=True)
class Table:
    """Best actions for one job shape, as change points along time left.

    Entry i: from key (state * (W + 1) + r) * (K + 1) + k on, the action is acts[i].
    """

    g: int                    # ticks per step
    work_steps: int           # W
    time_steps: int           # K
    buckets: int
    keys: np.ndarray          # int64, sorted
    acts: np.ndarray          # int8

    def action(self, state: int, time_left_ticks: float, work_left_ticks: float) -> int:
        """The table's action in a decision state for the job's exact work and time left."""
        k = min(int(time_left_ticks // self.g), self.time_steps)
        r = min(int(-(-work_left_ticks // self.g)), self.work_steps)
        if r > k:                 # beyond the plan's reach: only on-demand can still finish
            return ON_DEMAND
        key = (state * (self.work_steps + 1) + r) * (self.time_steps + 1) + k
        return int(self.acts[int(np.searchsorted(self.keys, key, side="right")) - 1])

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
    B = chain.buckets
    n = W + 1
    pm, um, ar = chain.market, chain.spot, chain.after_reclaim
    lost = (1.0 - um.sum(axis=1))[:, None]                 # [B, 1] reclaimed during a step
    od, sp = chain.od_usd, chain.spot_usd
    idle = np.full((2 * B, n), BIG)
    odv = np.full((Cc, 2 * B, n), BIG)
    spv = np.full((Cc, B, n), BIG)
    for arr in (idle, odv, spv):
        arr[..., 0] = 0.0
    sh_od = np.empty((2 * B, n))
    sh_sp = np.empty((B, n))
    rows = 5 * B
    prev = np.full((rows, n), ON_DEMAND, dtype=np.int8)
    keys = [((np.arange(rows)[:, None] * n + np.arange(n)[None, :]) * (K + 1)).ravel()]
    acts = [prev.ravel().copy()]
    row = np.empty((rows, n), dtype=np.int8)
    for k in range(1, K + 1):
        wait = pm @ idle + TIE_USD                          # [2B, n]
        after = ar @ idle                                   # [n]
        sh_od[:, 0] = 0.0
        sh_od[:, 1:] = odv[0][:, :-1]
        stay_od = od + pm @ sh_od
        sh_sp[:, 0] = 0.0
        sh_sp[:, 1:] = spv[0][:, :-1]
        stay_sp = (1.0 - lost) * sp + um @ sh_sp + lost * after
        if C >= 1:
            land_od = chain.od_launch_usd + pm @ odv[C - 1]
            land_sp = chain.spot_launch_usd + um @ spv[C - 1] + lost * after
        else:
            land_od = chain.od_launch_usd + stay_od
            land_sp = chain.spot_launch_usd + stay_sp
        new_idle = np.minimum(wait, land_od)
        new_idle[B:] = np.minimum(new_idle[B:], land_sp)
        new_od = np.empty((Cc, 2 * B, n))
        new_od[0] = np.minimum(wait, stay_od)
        new_od[0, B:] = np.minimum(new_od[0, B:], land_sp)
        new_sp = np.empty((Cc, B, n))
        new_sp[0] = np.minimum(np.minimum(wait[B:], land_od[B:]), stay_sp)
        for c in range(1, Cc):
            new_od[c] = pm @ odv[c - 1]
            new_sp[c] = um @ spv[c - 1] + lost * after
        # the actions of the decision states (argmin, ties to the first: wait, on-demand)
        row[:2 * B] = land_od < wait
        row[B:2 * B][land_sp < np.minimum(wait[B:], land_od[B:])] = SPOT
        row[2 * B:4 * B] = stay_od < wait
        row[3 * B:4 * B][land_sp < np.minimum(wait[B:], stay_od[B:])] = SPOT
        row[4 * B:] = land_od[B:] < wait[B:]
        row[4 * B:][stay_sp < np.minimum(wait[B:], land_od[B:])] = SPOT
        idle, odv, spv = new_idle, new_od, new_sp
        for arr in (idle, odv, spv):
            arr[..., 0] = 0.0
            np.minimum(arr, BIG, out=arr)
        # where even waiting from idle with none up cannot finish: on-demand (the net's move)
        row[:, idle[0] >= BIG] = ON_DEMAND
        s, r = np.nonzero(row != prev)
        if len(s):
            keys.append((s * n + r) * (K + 1) + k)
            acts.append(row[s, r])
            prev[s, r] = row[s, r]
    all_keys = np.concatenate(keys)
    order = np.argsort(all_keys, kind="stable")
    return Table(g=g, work_steps=W, time_steps=K, buckets=B, keys=all_keys[order],
                 acts=np.concatenate(acts)[order])

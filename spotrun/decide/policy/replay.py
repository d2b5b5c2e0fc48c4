"""A policy driven tick by tick over a window of a recorded market: the simulator's rules.

`spotrun simulate` (through spotrun.simulate.engine) and the `spotrun` policy's shadow runs
replay candidates this way, so both charge exactly the same.

Per tick: if the job is on a spot pool that is down now, that is a reclaim (the tick
is lost and unpaid; the policy is asked again next tick). Otherwise the policy
decides; a decision other than the current placement is a launch and pays the
changeover (at the new price) before work progresses. Progress survives reclaims.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spotrun.decide.policy.base import IDLE, Decision, JobProgress, Mode, Policy, policy_step
from spotrun.decide.policy.history import MarketHistory


@dataclass
class RunResult:
    """Outcome of one run of one policy."""

    start_row: int
    cost_usd: float
    deadline_met: bool
    ticks_used: int
    reclaims: int = 0
    launches: int = 0
    decisions: list[Decision] = field(default_factory=list)


def replay(h: MarketHistory, policy: Policy, start_row: int, work_ticks: int,
           deadline_ticks: int, changeover_ticks: int, *, record: bool = False) -> RunResult:
    """Drive policy over rows start_row.. of h for a job of this shape (in ticks)."""
    up, price = h.up, h.price
    od = h.od_price_usd_per_hour
    tick_s = h.tick_s
    W, D, C = work_ticks, deadline_ticks, changeover_ticks
    pool_index = {p: j for j, p in enumerate(h.pools)}
    work_total_s, changeover_s = W * tick_s, C * tick_s
    done = tau = reclaims = launches = 0
    mode, pool, j, c_left = Mode.IDLE, None, -1, 0
    cost_hours_usd = 0.0
    decisions: list[Decision] = []
    while tau < D and done < W:
        t = start_row + tau
        if mode is Mode.SPOT and not up[t, j]:
            reclaims += 1
            mode, pool, j, c_left = Mode.IDLE, None, -1, 0
            if record:
                decisions.append(IDLE)
            tau += 1
            continue
        job = JobProgress(work_total_s=work_total_s, work_done_s=done * tick_s,
                          time_left_s=(D - tau) * tick_s, elapsed_s=tau * tick_s,
                          changeover_s=changeover_s, tick_s=tick_s, mode=mode, pool=pool,
                          changeover_left_s=c_left * tick_s)
        d = policy_step(policy, job, h.view(t))   # the daemon's placer takes the same step
        if record:
            decisions.append(d)
        if d.mode is Mode.IDLE:
            mode, pool, j, c_left = Mode.IDLE, None, -1, 0
            tau += 1
            continue
        if d.mode is not mode or d.pool != pool:
            if d.mode is Mode.SPOT:
                j = pool_index[d.pool]  # type: ignore[index]  # available: policy_step checked
            else:
                j = -1
            mode, pool, c_left = d.mode, d.pool, C
            launches += 1
        cost_hours_usd += od if mode is Mode.ON_DEMAND else price[t, j]
        if c_left > 0:
            c_left -= 1
        else:
            done += 1
        tau += 1
    return RunResult(start_row=start_row, cost_usd=cost_hours_usd * (tick_s / 3600.0),
                     deadline_met=done >= W, ticks_used=tau, reclaims=reclaims,
                     launches=launches, decisions=decisions)

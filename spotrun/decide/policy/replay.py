"""A policy driven tick by tick over a window of a recorded market: the simulator's rules.

`spotrun simulate` (through spotrun.simulate.engine) and the `spotrun` policy's shadow runs
replay candidates this way, so both charge exactly the same.

Per tick: if the job is on a spot pool that is down now, that is a reclaim (the tick
is lost and unpaid; the policy is asked again next tick). Otherwise the policy
decides; a decision other than the current placement is a launch and pays the
changeover (at the new price) before work progresses. Progress survives reclaims.
With pools in several clouds (`moves`), a launch that takes the checkpoint to another cloud
also pays its egress and copy time, and on-demand runs in the checkpoint's cloud (moves.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spotrun.decide.policy.base import IDLE, Decision, JobProgress, Mode, Policy, policy_step
from spotrun.decide.policy.history import MarketHistory
from spotrun.decide.policy.moves import NO_CLOUD, CloudMoves


@dataclass
class RunResult:
    """Outcome of one run of one policy."""

    start_row: int
    cost_usd: float
    deadline_met: bool
    ticks_used: int
    reclaims: int = 0
    launches: int = 0
    egress_usd: float = 0.0      # included in cost_usd
    moves: int = 0               # launches that took the checkpoint to another cloud
    decisions: list[Decision] = field(default_factory=list)


def replay(h: MarketHistory, policy: Policy, start_row: int, work_ticks: int,
           deadline_ticks: int, changeover_ticks: int, *, record: bool = False,
           moves: CloudMoves | None = None) -> RunResult:
    """Drive policy over rows start_row.. of h for a job of this shape (in ticks); moves:
    the clouds of h's pools (None: one cloud, moves free)."""
    up, price = h.up, h.price
    od = h.od_price_usd_per_hour
    tick_s = h.tick_s
    W, D, C = work_ticks, deadline_ticks, changeover_ticks
    pool_index = {p: j for j, p in enumerate(h.pools)}
    work_total_s, changeover_s = W * tick_s, C * tick_s
    done = tau = reclaims = launches = 0
    mode, pool, j, c_left = Mode.IDLE, None, -1, 0
    cost_hours_usd = 0.0
    od_now, ckpt, egress_usd, n_moves = od, NO_CLOUD, 0.0, 0
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
        view = h.view(t)
        closed: list[str] = []
        if moves is not None and done > 0:
            closed = moves.closed(view, ckpt, slack_ticks=D - tau - (W - done) - C,
                                  remaining_ticks=W - done, changeover_ticks=C)
        d = policy_step(policy, job, view, closed=closed)   # the daemon's placer's step too
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
            if moves is not None:
                src = ckpt if done > 0 else NO_CLOUD
                ckpt = moves.pool_cloud[j] if mode is Mode.SPOT else moves.od_cloud(src)
                usd, copy_ticks = moves.launch(src, ckpt)
                n_moves += src != NO_CLOUD and ckpt != src
                egress_usd += usd
                c_left += copy_ticks
                od_now = moves.od_usd_per_hour[ckpt]
        cost_hours_usd += od_now if mode is Mode.ON_DEMAND else price[t, j]
        if c_left > 0:
            c_left -= 1
        else:
            done += 1
        tau += 1
    cost_usd = cost_hours_usd * (tick_s / 3600.0)
    if egress_usd:
        cost_usd += egress_usd
    return RunResult(start_row=start_row, cost_usd=cost_usd, deadline_met=done >= W,
                     ticks_used=tau, reclaims=reclaims, launches=launches,
                     egress_usd=egress_usd, moves=n_moves, decisions=decisions)

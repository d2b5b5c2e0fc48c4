"""Shared checks of the deadline policies (tests/test_policy_*.py)."""

from __future__ import annotations

from spotrun.decide.policy import JobProgress, Mode, make_policy
from spotrun.decide.policy.history import MarketHistory
from spotrun.decide.policy.replay import RunResult
from spotrun.simulate.engine import run_policy
from spotrun.simulate.model import SimModel


def assert_restarts_decide_the_same(m: SimModel, name: str, start: int) -> RunResult:
    """Replay the run of policy `name` from `start` on a history grown one row per tick (the
    daemon's way): at each tick a fresh policy (a restarted daemon) and the continuing one
    both give the reference run's decision. Returns the reference run."""
    ref = run_policy(m, make_policy(name), start, record=True)
    h = m.history
    grown = MarketHistory(h.pools, h.up[:start + 1], h.price[:start + 1],
                          h.od_price_usd_per_hour, h.tick_s)
    continuing = make_policy(name)
    W, D, C = m.work_ticks, m.deadline_ticks, m.changeover_ticks
    done, mode, pool, c_left = 0, Mode.IDLE, None, 0
    for tau, d in enumerate(ref.decisions):
        t = start + tau
        if tau > 0:
            grown = grown.extended(h.up[t], h.price[t])
        if mode is Mode.SPOT and not h.up[t, h.pools.index(pool)]:
            mode, pool, c_left = Mode.IDLE, None, 0
            continue
        job = JobProgress(work_total_s=W * h.tick_s, work_done_s=done * h.tick_s,
                          time_left_s=(D - tau) * h.tick_s, elapsed_s=tau * h.tick_s,
                          changeover_s=C * h.tick_s, tick_s=h.tick_s, mode=mode, pool=pool,
                          changeover_left_s=c_left * h.tick_s)
        assert continuing.decide(job, grown.view(t)) == d
        assert make_policy(name).decide(job, grown.view(t)) == d
        if d.mode is Mode.IDLE:
            mode, pool, c_left = Mode.IDLE, None, 0
            continue
        if (d.mode, d.pool) != (mode, pool):
            mode, pool, c_left = d.mode, d.pool, C
        if c_left > 0:
            c_left -= 1
        else:
            done += 1
    return ref

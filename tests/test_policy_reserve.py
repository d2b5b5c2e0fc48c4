"""The `reserve` policy's own decisions (a candidate of `spotrun`), on small hand-made markets."""

from __future__ import annotations

import numpy as np

from spotrun.decide.policy import JobProgress, Mode, make_policy
from spotrun.decide.policy.history import MarketHistory
from spotrun.simulate.engine import run_policy
from spotrun.simulate.model import SimModel

TICK_S = 60.0


def history(cols: list[str], prices: list[float] | None = None,
            od: float = 3.0) -> MarketHistory:
    """One pool per string of '0'/'1' (one char per tick), flat prices."""
    up = np.array([[ch == "1" for ch in col] for col in cols]).T
    price = np.tile(np.asarray(prices or [1.0] * len(cols)), (up.shape[0], 1))
    return MarketHistory([f"p{j}" for j in range(len(cols))], up, price, od, TICK_S)


def job(work: int, slack: int, changeover: int = 2, elapsed: int = 100,
        mode: Mode = Mode.IDLE, pool: str | None = None) -> JobProgress:
    """A job with `work` ticks left and `slack` ticks to spare (in ticks of TICK_S)."""
    return JobProgress(work_total_s=work * TICK_S, work_done_s=0.0,
                       time_left_s=(work + changeover + slack) * TICK_S,
                       elapsed_s=elapsed * TICK_S, changeover_s=changeover * TICK_S,
                       tick_s=TICK_S, mode=mode, pool=pool)


def test_waits_for_spot_with_ample_slack_and_goes_on_demand_before_the_safety_net():
    h = history([("1" * 20 + "0" * 5) * 8 + "1" * 10 + "000"])   # down now, 3 ticks in
    now = len(h) - 1
    assert make_policy("reserve").decide(job(10, slack=60), h.view(now)).mode is Mode.IDLE
    # 3 ticks of slack: the safety net would still let greedy wait; spotrun keeps a reserve
    tight = job(10, slack=3)
    assert make_policy("greedy").decide(tight, h.view(now)).mode is Mode.IDLE
    assert make_policy("reserve").decide(tight, h.view(now)).mode is Mode.ON_DEMAND


def test_reserve_grows_with_the_observed_reclaims():
    # job: 40 ticks of work, 20 of slack, changeover 2, 100 elapsed: deadline 162 ticks
    frequent = history([("1" * 8 + "0") * 12 + "000"])     # a reclaim every 9 ticks
    rare = history(["1" * 100 + "000"])                     # one reclaim (the current outage)
    j = job(40, slack=20)
    p = make_policy("reserve")
    assert p.decide(j, frequent.view(len(frequent) - 1)).mode is Mode.ON_DEMAND
    p = make_policy("reserve")
    assert p.decide(j, rare.view(len(rare) - 1)).mode is Mode.IDLE


def test_reserve_reads_only_the_last_deadline_of_history():
    # frequent reclaims long ago, a steady pool over the last 158 ticks (the job's deadline);
    # read over all of it, the reclaims would ask for more than the 16 ticks of slack
    h = history([("1" * 4 + "0") * 40 + "1" * 200 + "000"])
    p = make_policy("reserve")
    assert p.decide(job(40, slack=16), h.view(len(h) - 1)).mode is Mode.IDLE


def test_leaves_on_demand_only_for_a_stretch_expected_to_pay():
    on_od = job(30, slack=100, mode=Mode.ON_DEMAND)
    flappy = history([("111" + "00") * 20 + "1"])          # stretches of 3, changeover 2
    assert make_policy("reserve").decide(on_od, flappy.view(len(flappy) - 1)).mode \
        is Mode.ON_DEMAND
    steady = history([("1" * 40 + "00") * 3 + "1"])
    d = make_policy("reserve").decide(on_od, steady.view(len(steady) - 1))
    assert d.mode is Mode.SPOT and d.pool == "p0"


def test_prefers_the_cheaper_pool_and_stays_on_spot_while_up():
    cols = [("1" * 30 + "0") * 3 + "1" * 40] * 2
    h = history(cols, prices=[2.0, 1.0])
    now = len(h) - 1
    d = make_policy("reserve").decide(job(20, slack=5), h.view(now))
    assert d.mode is Mode.SPOT and d.pool == "p1"
    on_p0 = job(20, slack=5, mode=Mode.SPOT, pool="p0")
    assert make_policy("reserve").decide(on_p0, h.view(now)).pool == "p0"   # no slack to move


def test_with_several_pools_and_spare_slack_it_waits_for_a_stretch_to_last():
    # long stretches in history; now both pools have just come back (age 1)
    base = ("1" * 50 + "0" * 10) * 5
    h = history([base + "1", base + "1"])
    now = len(h) - 1
    assert make_policy("reserve").decide(job(10, slack=200), h.view(now)).mode is Mode.IDLE
    d = make_policy("reserve").decide(job(10, slack=6), h.view(now))
    assert d.mode is Mode.SPOT                                  # no spare slack: launch now
    # a single pool is never gated: waiting would only lose its first ticks
    one = history([base + "1"])
    assert make_policy("reserve").decide(job(10, slack=200), one.view(now)).mode is Mode.SPOT


def test_a_gated_launch_waits_out_a_reclaim_wave_in_pools_as_cheap():
    # p0 has been up 40 ticks (past any gate); p1 went down `ago` ticks ago
    base = ("1" * 50 + "0" * 10) * 5
    def market(ago: int, prices: list[float] | None = None) -> MarketHistory:
        return history([base + "1" * 40, base + "1" * (40 - ago) + "0" * ago], prices)
    roomy = job(10, slack=200)                  # changeover 2: settle = 3 quiet ticks
    for ago, mode in ((1, Mode.IDLE), (3, Mode.IDLE), (4, Mode.SPOT)):
        h = market(ago)
        assert make_policy("reserve").decide(roomy, h.view(len(h) - 1)).mode is mode, ago
    # a reclaim in a dearer pool says nothing about the chosen one's wave
    h = market(1, prices=[1.0, 2.0])
    assert make_policy("reserve").decide(roomy, h.view(len(h) - 1)).pool == "p0"
    # without spare slack there is no gate and no wait
    h = market(1)
    assert make_policy("reserve").decide(job(10, slack=6), h.view(len(h) - 1)).mode is Mode.SPOT


def random_model(seed: int, pools: int, n: int = 900) -> SimModel:
    """Bursty availability with a long history before the starts."""
    rng = np.random.default_rng(seed)
    up = np.zeros((n, pools), dtype=bool)
    for j in range(pools):
        t, state = 0, bool(rng.integers(2))
        while t < n:
            length = int(rng.pareto(1.2) * (8 if state else 4)) + 1
            up[t:t + length, j] = state
            t, state = t + length, not state
    price = np.repeat(rng.uniform(0.5, 1.5, size=(n // 100, pools)), 100, axis=0)
    h = MarketHistory([f"z{j}" for j in range(pools)], up, price, 3.0, TICK_S)
    return SimModel(history=h, tick_values=np.arange(n), work_ticks=80, deadline_ticks=200,
                    changeover_ticks=3)


def test_decisions_before_t_ignore_the_market_after_t_and_every_deadline_is_met():
    for seed in range(4):
        a = random_model(seed, 3)
        cut = 700
        b = random_model(seed, 3)
        b.history = MarketHistory(a.history.pools,
                                  np.concatenate([a.history.up[:cut], ~a.history.up[cut:]]),
                                  np.concatenate([a.history.price[:cut],
                                                  a.history.price[cut:] * 3]), 3.0, TICK_S)
        for start in (600, 650):
            ra = run_policy(a, make_policy("reserve"), start, record=True)
            rb = run_policy(b, make_policy("reserve"), start, record=True)
            assert ra.deadline_met and rb.deadline_met
            assert ra.decisions[:cut - start] == rb.decisions[:cut - start]


def test_a_history_grown_by_the_daemon_gives_the_same_decisions():
    whole = random_model(5, 2, n=300).history
    grown = MarketHistory(whole.pools, whole.up[:200], whole.price[:200], 3.0, TICK_S)
    p_whole, p_grown = make_policy("reserve"), make_policy("reserve")
    for t in range(199, 300):
        if t > 199:
            grown = grown.extended(whole.up[t], whole.price[t])
        j = job(50, slack=300 - t)
        assert p_whole.decide(j, whole.view(t)) == p_grown.decide(j, grown.view(t))

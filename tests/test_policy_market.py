"""MarketView: causal statistics, and the spotrun policy's use of them."""

from __future__ import annotations

import numpy as np

from spotrun.decide.policy import JobProgress, Mode, make_policy
from spotrun.decide.policy.history import MarketHistory


def history(cols: list[str], prices: list[float] | None = None) -> MarketHistory:
    up = np.array([[c == "1" for c in col] for col in cols]).T
    price = np.tile(np.asarray(prices or [1.0] * len(cols)), (up.shape[0], 1))
    return MarketHistory([f"p{j}" for j in range(len(cols))], up, price, 3.0, 60.0)


def test_stats_at_now_use_only_the_past():
    h = history(["0110011100"])
    v = h.view(4)                       # rows 0..4 = 0 1 1 0 0
    assert list(v.up_history(0)) == [False, True, True, False, False]
    assert v.reclaims(0) == 1 and list(v.up_stretches(0)) == [2]
    assert list(v.down_stretches(0)) == [1]          # the leading 0 ended at row 1
    assert v.age_ticks(0) == 2 and v.uptime_fraction(0) == 2 / 5
    v = h.view(7)                       # ... 1 1 1 still up: not a completed stretch
    assert list(v.up_stretches(0)) == [2] and v.age_ticks(0) == 3
    assert h.view(8).reclaims(0) == 2 and list(h.view(8).up_stretches(0)) == [2, 3]


def test_history_extended_by_the_daemon_matches_a_whole_one():
    whole = history(["0110011100", "1111000011"])
    grown = history(["0", "1"])
    for t in range(1, 10):
        grown = grown.extended(whole.up[t], whole.price[t])
    for t in range(10):
        a, b = whole.view(t), grown.view(t)
        for j in range(2):
            assert a.reclaims(j) == b.reclaims(j) and a.age_ticks(j) == b.age_ticks(j)


def job(**kw) -> JobProgress:
    base = dict(work_total_s=600.0, work_done_s=0.0, time_left_s=6000.0, elapsed_s=0.0,
                changeover_s=120.0, tick_s=60.0)
    base.update(kw)
    return JobProgress(**base)


def test_spotrun_prefers_the_pool_whose_stretches_last():
    # p0 flaps (up 1, down 1), p1 has long stretches; both up now at the same price
    flappy = "10" * 40 + "1"
    steady = ("1" * 30 + "0") * 2 + "1" * 19
    h = history([flappy, steady])
    d = make_policy("reserve").decide(job(time_left_s=900.0), h.view(80))   # no spare slack
    assert d.mode is Mode.SPOT and d.pool == "p1"
    # with spare slack it first waits out p0's reclaim a tick ago (as cheap: same wave)
    assert make_policy("reserve").decide(job(), h.view(80)).mode is Mode.IDLE


def test_spotrun_stays_on_spot_and_waits_with_slack_but_not_without():
    h = history(["1" * 50 + "0" * 50])
    p = make_policy("reserve")
    on = job(mode=Mode.SPOT, pool="p0")
    assert p.decide(on, h.view(10)).pool == "p0"
    assert p.decide(job(), h.view(60)).mode is Mode.IDLE            # plenty of slack: wait
    tight = job(time_left_s=600.0 + 120.0 + 30.0)                   # under a tick to spare
    assert p.decide(tight, h.view(60)).mode is Mode.ON_DEMAND

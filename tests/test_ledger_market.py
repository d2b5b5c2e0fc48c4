"""The spend loop against the real local market process (prices and reclaims from a trace).

The market runs 200x faster than the wall, so a market minute passes in 0.3 s; the
loop books the provider's clock and the provider's launch/end times.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path

import pytest
from conftest import MarketFactory, write_prices, write_trace
from polling import wait_for

from spotrun.daemon.spend import SpendLoop
from spotrun.db import Attempt, session
from spotrun.providers.base import LaunchRequest, Pool
from spotrun.providers.local.provider import LocalProvider
from spotrun.states import AttemptState, EndReason, Market

from test_ledger_support import make_job, new_db, rows_of, total_usd


def _launch(provider: LocalProvider, market: Market, token: str):
    req = LaunchRequest(job_id="job-1", attempt_number=1, client_token=token,
                        candidates=(Pool("p3.2xlarge", "za", market),), user_data="{}")
    return provider.launch(provider.plan_launch(req))


def _attempt(eng, info, number: int) -> Attempt:
    a = Attempt(job_id="job-1", number=number, market=info.market,
                instance_type=info.instance_type, zone=info.zone,
                price_usd_per_hour=info.price_usd_per_hour or 0.0,
                client_token=f"tok-{number}", instance_id=info.instance_id,
                started_at=info.launched_at, state=AttemptState.RUNNING)
    with session(eng) as s:
        s.add(a)
        s.commit()
        s.refresh(a)
    return a


def _ended(provider: LocalProvider, iid: str):
    [i] = provider.describe(instance_ids=[iid])
    return i if i.state.is_terminal() else None


def test_spot_reclaimed_in_first_hour_is_free_and_terminated_one_is_charged(
        market_factory: MarketFactory, tmp_path: Path) -> None:
    # za is up for rows 0-3 (60 s ticks), down from row 4: a reclaim 240 market s in.
    # Prices: $0.50/h from tick 0, $0.80/h from tick 1 (60 market s after the epoch).
    trace = write_trace(tmp_path / "t.csv", {"za": [1, 1, 1, 1, 0, 0, 0, 0]})
    prices = write_prices(tmp_path / "p.csv", [("za", 0, 0.5), ("za", 1, 0.8)])
    client = market_factory(trace=trace, prices=str(prices), time_scale=200.0, notice_s=30.0)
    provider = LocalProvider(client)
    eng = new_db(tmp_path)
    make_job(eng)
    loop = SpendLoop(eng, provider, storage_interval_s=1e9, min_book_s=0.0)

    spot = _launch(provider, Market.SPOT, "s1")
    a1 = _attempt(eng, spot, 1)
    loop.tick()                                     # provisional booking while it runs
    info = wait_for(lambda: _ended(provider, spot.instance_id), what="reclaim")
    loop.tick()
    rows = [r for r in rows_of(eng) if r.attempt_id == a1.id]
    assert info.ended_at is not None and (info.ended_at - info.launched_at).total_seconds() < 3600
    assert rows[-1].kind == "correction" and "no charge" in rows[-1].note
    assert sum(r.usd for r in rows) == pytest.approx(0.0, abs=1e-12)
    assert {round(r.price_usd_per_hour, 2) for r in rows if r.kind == "compute"} <= {0.5, 0.8}

    # The same pool, terminated by us: the seconds used at the trace's prices.
    trace2 = write_trace(tmp_path / "t2.csv", {"za": [1] * 50})
    client2 = market_factory(trace=trace2, prices=str(prices), time_scale=200.0)
    provider2 = LocalProvider(client2)
    epoch = datetime.fromtimestamp(client2.time()["epoch_wall_s"], timezone.utc)
    eng2 = new_db(tmp_path / "second")
    make_job(eng2)
    loop2 = SpendLoop(eng2, provider2, storage_interval_s=1e9, min_book_s=0.0)
    inst = _launch(provider2, Market.SPOT, "s2")
    a2 = _attempt(eng2, inst, 1)
    wait_for(lambda: (provider2.now() - inst.launched_at).total_seconds() > 90, what="90 s")
    loop2.tick()
    provider2.terminate(inst.instance_id)
    info2 = wait_for(lambda: _ended(provider2, inst.instance_id), what="terminated")
    with session(eng2) as s:
        a = s.get(Attempt, a2.id)
        a.ended_at, a.end_reason, a.state = info2.ended_at, EndReason.CANCELLED, AttemptState.ENDED
        s.add(a)
        s.commit()
    loop2.tick()
    # Hand formula from the provider's own times: 0.50/h before epoch+60 s, 0.80/h after,
    # whole seconds, 60 s minimum.
    start, end = info2.launched_at, info2.ended_at
    change = (epoch.timestamp() + 60.0)
    s0, e0 = start.timestamp(), end.timestamp()
    before = max(0.0, min(e0, change) - s0)
    after = max(0.0, e0 - max(s0, change))
    used = e0 - s0
    billed = max(60.0, math.ceil(used - 1e-9))
    last_price = 0.8 if e0 > change else 0.5
    expected = (before * 0.5 + after * 0.8 + (billed - used) * last_price) / 3600.0
    # Times are stored to the microsecond: allow that much (1e-7 USD), not more.
    assert total_usd(eng2) == pytest.approx(expected, abs=1e-7)
    assert sum(r.billed_seconds for r in rows_of(eng2)) == pytest.approx(billed)
    if s0 < change < e0:   # the usual case: split where the trace's price changed
        compute = [r for r in rows_of(eng2) if r.kind == "compute"]
        assert {r.price_usd_per_hour for r in compute} == {0.5, 0.8}
        assert any(abs(r.end.timestamp() - change) < 1e-3 for r in compute)

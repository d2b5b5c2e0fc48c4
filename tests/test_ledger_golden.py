"""Golden ledger cases with numbers worked by hand (issue 6's list).

Every case books through the real SpendLoop on a real SQLite file; the provider
clock is stepped by hand and prices are hand-set change points.
"""

from __future__ import annotations

import pytest

from spotrun.daemon.spend import SpendLoop
from spotrun.providers.billing_rules import PriceSource, SpendKind
from spotrun.providers.aws import AWS_RULES
from spotrun.providers.facts import rules_for
from spotrun.errors import ConfigError
from spotrun.states import EndReason, Market

from test_ledger_support import (P3, ZONE, PriceFeed, at, end_attempt, make_attempt, make_job,
                                 new_db, rows_of, total_usd)


def _loop(engine, feed, **kw):
    kw.setdefault("storage_interval_s", 10 ** 9)   # storage has its own tests
    return SpendLoop(engine, feed, **kw)


def _tick(loop, feed, minutes, seconds=0.0):
    feed.clock = at(minutes, seconds)
    return loop.tick(at(minutes, seconds))


def test_price_change_mid_hour(tmp_path):
    # $0.90/h until minute 30, then $1.20/h; we stop it at minute 60.
    # Hand: 0.5 h x 0.90 + 0.5 h x 1.20 = 0.45 + 0.60 = 1.05 USD, 3600 s billed.
    eng = new_db(tmp_path)
    feed = PriceFeed()
    feed.set_prices(P3, ZONE, [(at(-60), 0.90), (at(30), 1.20)])
    make_job(eng)
    a = make_attempt(eng, "job-1", 1, start=at(0))
    loop = _loop(eng, feed)
    _tick(loop, feed, 20)              # 20 min at 0.90 = 0.30
    assert total_usd(eng) == pytest.approx(0.30)
    _tick(loop, feed, 45)              # + 10 min at 0.90 + 15 min at 1.20 = 0.15 + 0.30
    assert total_usd(eng) == pytest.approx(0.75)
    end_attempt(eng, a.id, at(60), EndReason.COMPLETED)
    res = _tick(loop, feed, 61)        # + 15 min at 1.20 = 0.30; closed
    assert res.attempts_closed == [a.id]
    rows = rows_of(eng)
    assert total_usd(eng) == pytest.approx(1.05)
    assert sum(r.billed_seconds for r in rows) == pytest.approx(3600)
    # One row per price span: the bookings at minutes 20, 45 and 61 lengthened them.
    assert [round(r.price_usd_per_hour, 2) for r in rows] == [0.90, 1.20]
    assert [r.billed_seconds for r in rows] == pytest.approx([1800, 1800])
    assert {r.price_source for r in rows} == {PriceSource.SPOT_HISTORY.value}
    # The split is exactly at the change point.
    assert rows[0].end == at(30) and rows[1].start == at(30)
    _tick(loop, feed, 90)              # closed: nothing more, ever
    assert len(rows_of(eng)) == 2


@pytest.mark.parametrize("reason,expected_usd", [
    (EndReason.RECLAIMED, 0.0),        # AWS interrupted it in its first hour: free
    (EndReason.CANCELLED, 0.885),      # we terminated it: 59 min x 0.90 = 0.885
])
def test_minute_59_reclaimed_free_terminated_charged(tmp_path, reason, expected_usd):
    eng = new_db(tmp_path)
    feed = PriceFeed()
    feed.set_prices(P3, ZONE, [(at(-60), 0.90)])
    make_job(eng)
    a = make_attempt(eng, "job-1", 1, start=at(0))
    loop = _loop(eng, feed)
    _tick(loop, feed, 30)              # provisional: 30 min x 0.90 = 0.45
    assert total_usd(eng) == pytest.approx(0.45)
    end_attempt(eng, a.id, at(59), reason)
    _tick(loop, feed, 60)
    rows = rows_of(eng)
    assert total_usd(eng) == pytest.approx(expected_usd, abs=1e-12)
    kinds = [r.kind for r in rows]
    if reason is EndReason.RECLAIMED:
        # The provisional row stays; one correction reverses it.
        assert kinds == ["compute", "correction"]
        assert rows[-1].usd == pytest.approx(-0.885)
        assert rows[-1].billed_seconds == pytest.approx(-3540)
        assert "no charge" in rows[-1].note
    else:
        assert kinds == ["compute"]   # one price, one row, lengthened at the end
        assert sum(r.billed_seconds for r in rows) == pytest.approx(3540)


def test_reclaim_after_first_hour_is_charged(tmp_path):
    # 61 min, reclaimed by AWS: past the first hour, the seconds used: 61/60 x 0.90 = 0.915.
    eng = new_db(tmp_path)
    feed = PriceFeed()
    feed.set_prices(P3, ZONE, [(at(-60), 0.90)])
    make_job(eng)
    make_attempt(eng, "job-1", 1, start=at(0), end=at(61), reason=EndReason.RECLAIMED)
    _tick(_loop(eng, feed), feed, 62)
    assert total_usd(eng) == pytest.approx(0.915)


@pytest.mark.parametrize("reason,expected_usd,kinds", [
    # 30 s run we ended: 60 s minimum -> 60/3600 x 0.90 = 0.015 (30 s booked + 30 s top-up).
    (EndReason.COMPLETED, 0.015, ["compute", "adjustment"]),
    # reclaimed by AWS after 30 s: free, the minimum does not apply.
    (EndReason.RECLAIMED, 0.0, ["compute", "correction"]),
])
def test_thirty_second_run(tmp_path, reason, expected_usd, kinds):
    eng = new_db(tmp_path)
    feed = PriceFeed()
    feed.set_prices(P3, ZONE, [(at(-60), 0.90)])
    make_job(eng)
    make_attempt(eng, "job-1", 1, start=at(0), end=at(0, 30), reason=reason)
    _tick(_loop(eng, feed), feed, 5)
    rows = rows_of(eng)
    assert [r.kind for r in rows] == kinds
    assert total_usd(eng) == pytest.approx(expected_usd, abs=1e-12)
    if reason is EndReason.COMPLETED:
        assert rows[1].billed_seconds == pytest.approx(30)
        assert "60 s minimum" in rows[1].note


def test_fractional_second_rounds_up(tmp_path):
    # 100.4 s used -> 101 s billed (per-second billing): 101/3600 x 3.60 = 0.101.
    eng = new_db(tmp_path)
    feed = PriceFeed()
    feed.set_prices(P3, ZONE, [(at(-60), 3.60)])
    make_job(eng)
    make_attempt(eng, "job-1", 1, start=at(0), end=at(0, 100.4), reason=EndReason.COMPLETED)
    _tick(_loop(eng, feed), feed, 5)
    assert sum(r.billed_seconds for r in rows_of(eng)) == pytest.approx(101)
    assert total_usd(eng) == pytest.approx(0.101)


def test_on_demand_fallback(tmp_path):
    # Spot reclaimed at 2 h (charged: 2 x 0.90 = 1.80), then on-demand for 1.5 h at the
    # catalog's 3.06 = 4.59. Total 6.39; the on-demand row's price source is the catalog.
    eng = new_db(tmp_path)
    feed = PriceFeed()
    feed.set_prices(P3, ZONE, [(at(-60), 0.90)])
    make_job(eng)
    make_attempt(eng, "job-1", 1, start=at(0), end=at(120), reason=EndReason.RECLAIMED)
    make_attempt(eng, "job-1", 2, start=at(130), end=at(220), reason=EndReason.COMPLETED,
                 market=Market.ON_DEMAND, price=3.06)
    _tick(_loop(eng, feed), feed, 221)
    rows = rows_of(eng)
    spot = sum(r.usd for r in rows if r.market == "spot")
    od = [r for r in rows if r.market == "on-demand"]
    assert spot == pytest.approx(1.80)
    assert sum(r.usd for r in od) == pytest.approx(4.59)
    assert {r.price_source for r in od} == {PriceSource.ON_DEMAND.value}
    assert total_usd(eng) == pytest.approx(6.39)


def test_volume_line(tmp_path):
    # A 200 GB gp3 root volume for 1 h: 200 x (1/730) x 0.08 = 0.0219178... USD,
    # booked as its own line; the instance line is 1 h x 0.90.
    eng = new_db(tmp_path)
    feed = PriceFeed(name="aws")
    feed.set_prices(P3, ZONE, [(at(-60), 0.90)])
    make_job(eng)
    make_attempt(eng, "job-1", 1, start=at(0), end=at(60), reason=EndReason.COMPLETED)
    _tick(_loop(eng, feed, volume_gb=200), feed, 61)
    vol = [r for r in rows_of(eng) if r.kind == SpendKind.VOLUME.value]
    assert sum(r.usd for r in vol) == pytest.approx(200 / 730 * 0.08)
    assert total_usd(eng) == pytest.approx(0.90 + 200 / 730 * 0.08)


def test_rules_are_data_per_provider():
    from spotrun.providers.facts import FACTS
    assert all(f.billing_rules() is not None for f in FACTS.values())
    assert rules_for("local").minimum_s == AWS_RULES.minimum_s == 60
    with pytest.raises(ConfigError) as ei:
        rules_for("nowhere")
    assert ei.value.field == "provider"
    r = AWS_RULES
    assert r.billed_seconds(3599, market=Market.SPOT, reclaimed_by_provider=True) == 0
    assert r.billed_seconds(3600, market=Market.SPOT, reclaimed_by_provider=True) == 3600
    # The free first hour is a spot rule only.
    assert r.billed_seconds(30, market=Market.ON_DEMAND, reclaimed_by_provider=True) == 60

"""The spend loop's safety: idempotent, crash-safe, single-booking, and storage lines."""

from __future__ import annotations

from datetime import datetime

import pytest

from spotrun.daemon.spend import SpendLoop
from spotrun.db import Attempt, LedgerMark, session
from spotrun.ledger.booking import BookingConflict, book_attempt, instance_times
from spotrun.ledger.intervals import split_at_prices
from spotrun.providers.billing_rules import SpendKind
from spotrun.providers.aws import AWS_RULES
from spotrun.errors import BadInputError
from spotrun.providers.base import InstanceInfo
from spotrun.states import EndReason, InstanceState, JobState, Market, TerminationCause
from spotrun.store.file import FileStore

from test_ledger_support import (P3, ZONE, PriceFeed, at, end_attempt, make_attempt, make_job,
                                 new_db, rows_of, total_usd)


def _setup(tmp_path, price=0.90):
    eng = new_db(tmp_path)
    feed = PriceFeed()
    feed.set_prices(P3, ZONE, [(at(-60), price)])
    make_job(eng)
    return eng, feed


def _tick(loop, feed, minutes):
    feed.clock = at(minutes)
    return loop.tick(at(minutes))


def test_repeated_ticks_never_double_book(tmp_path):
    eng, feed = _setup(tmp_path)
    a = make_attempt(eng, "job-1", 1, start=at(0))
    loop = SpendLoop(eng, feed, storage_interval_s=1e9)
    for _ in range(3):
        _tick(loop, feed, 10)
    assert len(rows_of(eng)) == 1 and total_usd(eng) == pytest.approx(0.15)
    # Below the minimum step (60 s) a running attempt is left for the next tick.
    feed.clock = at(10, 30)
    loop.tick(at(10))
    assert len(rows_of(eng)) == 1
    end_attempt(eng, a.id, at(20), EndReason.COMPLETED)
    for m in (21, 22, 23):
        _tick(loop, feed, m)
    assert total_usd(eng) == pytest.approx(0.30)
    assert sum(r.billed_seconds for r in rows_of(eng)) == pytest.approx(1200)


def test_crash_before_commit_loses_nothing(tmp_path):
    # A pass that dies before its commit leaves neither rows nor watermark; the next books all.
    eng, feed = _setup(tmp_path)
    a = make_attempt(eng, "job-1", 1, start=at(0), end=at(40), reason=EndReason.COMPLETED)
    with session(eng) as s:
        att = s.get(Attempt, a.id)
        rows = book_attempt(s, att, instance_times(att, None), feed, AWS_RULES, upto=at(41),
                            booked_at=at(41))
        assert rows
        s.rollback()   # the crash
    assert rows_of(eng) == []
    SpendLoop(eng, feed, storage_interval_s=1e9).tick(at(41))
    assert total_usd(eng) == pytest.approx(0.60)


def test_two_bookers_cannot_book_the_same_seconds(tmp_path):
    eng, feed = _setup(tmp_path)
    a = make_attempt(eng, "job-1", 1, start=at(0))
    loop = SpendLoop(eng, feed, storage_interval_s=1e9)
    _tick(loop, feed, 10)                       # mark exists (version 1)
    s1, s2 = session(eng), session(eng)
    try:
        att1, att2 = s1.get(Attempt, a.id), s2.get(Attempt, a.id)
        stale = s2.get(LedgerMark, f"attempt:{a.id}")  # booker 2 holds the old watermark
        assert stale.version == 1
        book_attempt(s1, att1, instance_times(att1, None), feed, AWS_RULES, upto=at(20),
                     booked_at=at(20))
        s1.commit()
        with pytest.raises(BookingConflict):
            book_attempt(s2, att2, instance_times(att2, None), feed, AWS_RULES, upto=at(20),
                         booked_at=at(20))
        s2.rollback()
    finally:
        s1.close()
        s2.close()
    assert total_usd(eng) == pytest.approx(0.30)   # 20 min, once


def test_seconds_booked_past_a_late_seen_end_are_reversed(tmp_path):
    # The loop books to minute 50; the instance had really ended (we stopped it) at 45.
    eng, feed = _setup(tmp_path)
    a = make_attempt(eng, "job-1", 1, start=at(0))
    loop = SpendLoop(eng, feed, storage_interval_s=1e9)
    _tick(loop, feed, 50)
    end_attempt(eng, a.id, at(45), EndReason.CANCELLED)
    _tick(loop, feed, 51)
    rows = rows_of(eng)
    assert [r.kind for r in rows] == ["compute", "correction"]
    assert rows[1].billed_seconds == pytest.approx(-300)
    assert total_usd(eng) == pytest.approx(0.675)   # 45 min x 0.90


def test_provider_view_wins_reclaim_seen_by_describe(tmp_path):
    # The attempt row still says running; describe reports a spot reclaim at minute 40.
    eng, feed = _setup(tmp_path)
    a = make_attempt(eng, "job-1", 1, start=at(0))
    loop = SpendLoop(eng, feed, storage_interval_s=1e9)
    _tick(loop, feed, 30)
    feed.instances[a.instance_id] = InstanceInfo(
        instance_id=a.instance_id, instance_type=P3, zone=ZONE, market=Market.SPOT,
        state=InstanceState.TERMINATED, launched_at=at(0), ended_at=at(40),
        cause=TerminationCause.SPOT_RECLAIM)
    res = _tick(loop, feed, 41)
    assert res.attempts_closed == [a.id]
    assert total_usd(eng) == pytest.approx(0.0, abs=1e-12)


def test_attempt_that_never_started_is_closed_without_rows(tmp_path):
    eng, feed = _setup(tmp_path)
    a = make_attempt(eng, "job-1", 1, start=None, end=at(1), reason=EndReason.LAUNCH_FAILED)
    res = _tick(SpendLoop(eng, feed, storage_interval_s=1e9), feed, 2)
    assert rows_of(eng) == [] and res.attempts_closed == [a.id]


def test_split_at_prices_pure():
    spans = split_at_prices(at(0), at(60), [(at(-5), 1.0), (at(20), 1.0), (at(40), 2.0)],
                            source="h", fallback_usd_per_hour=9.0, fallback_source="f")
    # An unchanged price at minute 20 does not split.
    assert [(s.start, s.end, s.price_usd_per_hour) for s in spans] == [
        (at(0), at(40), 1.0), (at(40), at(60), 2.0)]
    assert sum(s.usd for s in spans) == pytest.approx(40 / 60 * 1.0 + 20 / 60 * 2.0)
    fb = split_at_prices(at(0), at(10), [(at(5), 3.0)], source="h", fallback_usd_per_hour=1.5,
                         fallback_source="f")
    assert [(s.price_usd_per_hour, s.source) for s in fb] == [(1.5, "f"), (3.0, "h")]
    with pytest.raises(BadInputError):
        split_at_prices(at(10), at(0), [], source="h", fallback_usd_per_hour=1,
                        fallback_source="f")


def test_storage_lines_gb_month_and_requests(tmp_path):
    # 1 MiB held for 730 h (one month) at $0.023/GB-month: 0.023/1024 = 2.24609375e-05 USD,
    # plus 3 new objects x $0.005/1000 = 1.5e-05. Then a 4th object (1 MiB more) for 365 h:
    # trapezoid (1 + 2)/2 MiB x 0.5 month = 0.023 x 0.75/1024 = 1.6845703125e-05, + 5e-06.
    eng = new_db(tmp_path)
    feed = PriceFeed()
    feed.set_prices(P3, ZONE, [(at(-60), 0.90)])
    store = FileStore(tmp_path / "store")
    make_job(eng, store_uri=store.uri)
    mib = 1024 * 1024
    store.put_bytes("jobs/job-1/checkpoints/ckpt-000000000100/model.pt", b"x" * (mib - 100))
    store.put_bytes("jobs/job-1/checkpoints/ckpt-000000000100/MANIFEST.json", b"m" * 60)
    store.put_bytes("jobs/job-1/bundle.tar.gz", b"b" * 40)
    store.put_bytes("jobs/other/bundle.tar.gz", b"z" * 999)       # another job's: not ours
    make_attempt(eng, "job-1", 1, start=at(0))
    loop = SpendLoop(eng, feed, storage_interval_s=3600, min_book_s=1e12)
    _tick(loop, feed, 30)                 # under the storage interval: no listing yet
    assert [r for r in rows_of(eng) if r.kind == "storage"] == []
    _tick(loop, feed, 730 * 60)
    store.put_bytes("jobs/job-1/checkpoints/ckpt-000000000200/model.pt", b"y" * mib)
    _tick(loop, feed, 730 * 60 + 365 * 60)
    st = [r for r in rows_of(eng) if r.kind == SpendKind.STORAGE.value]
    rq = [r for r in rows_of(eng) if r.kind == SpendKind.REQUESTS.value]
    assert [r.usd for r in st] == pytest.approx([0.023 / 1024, 0.023 * 0.75 / 1024])
    assert [r.usd for r in rq] == pytest.approx([3 * 0.005 / 1000, 1 * 0.005 / 1000])
    assert st[0].start == at(0) and st[1].start == st[0].end   # contiguous, no overlap


def test_storage_closes_when_the_job_ends(tmp_path):
    eng = new_db(tmp_path)
    feed = PriceFeed()
    feed.set_prices(P3, ZONE, [(at(-60), 0.90)])
    store = FileStore(tmp_path / "store")
    ck = FileStore(tmp_path / "elsewhere")            # checkpoints outside the job prefix
    make_job(eng, store_uri=store.uri, checkpoint_uri=ck.uri, state=JobState.SUCCEEDED)
    store.put_bytes("jobs/job-1/bundle.tar.gz", b"b" * 1024)
    ck.put_bytes("ckpt-000000000001/model.pt", b"c" * 3072)
    make_attempt(eng, "job-1", 1, start=at(0), end=at(60), reason=EndReason.COMPLETED)
    loop = SpendLoop(eng, feed, storage_interval_s=1e9)
    _tick(loop, feed, 600)
    _tick(loop, feed, 900)
    st = [r for r in rows_of(eng) if r.kind == "storage"]
    # Booked up to the job's end only, once: 4 KiB for 1 h.
    assert len(st) == 1 and st[0].end == at(60)
    assert st[0].usd == pytest.approx(4096 / 1024 ** 3 / 730 * 0.023)
    with session(eng) as s:
        assert s.get(LedgerMark, "storage:job-1").closed


def test_rerunning_ticks_changes_nothing_and_only_the_open_row_grows(tmp_path):
    # Re-running every tick of a run leaves the exact same ledger (ids and values). At one
    # price the attempt has one row, lengthened by each booking in the watermark's
    # transaction; its end lengthens it once more and a correction reverses it (free reclaim).
    eng, feed = _setup(tmp_path)
    a = make_attempt(eng, "job-1", 1, start=at(0))
    loop = SpendLoop(eng, feed, storage_interval_s=1e9)
    for m in (5, 15, 25):
        _tick(loop, feed, m)
    before = [(r.id, r.start, r.end, r.usd) for r in rows_of(eng)]
    assert len(before) == 1 and before[0][1:3] == (at(0), at(25))
    for m in (5, 15, 25):
        feed.clock = at(m)
        loop.tick(datetime.now().astimezone())
    assert [(r.id, r.start, r.end, r.usd) for r in rows_of(eng)] == before
    end_attempt(eng, a.id, at(26), EndReason.RECLAIMED)
    _tick(loop, feed, 27)
    rows = rows_of(eng)
    assert [r.kind for r in rows] == ["compute", "correction"]
    assert (rows[0].id, rows[0].start, rows[0].end) == (before[0][0], at(0), at(26))
    assert rows[1].usd == pytest.approx(-rows[0].usd)   # earlier rows untouched

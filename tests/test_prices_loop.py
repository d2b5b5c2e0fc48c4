"""PriceLoop: price change points of active jobs' pools recorded once, from the real local market."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

from sqlmodel import select

from spotrun.daemon.price_loop import PriceLoop
from spotrun.db import Attempt, Job, PricePoint, open_db, session, utcnow
from spotrun.providers.local.market.clock import ManualClock
from spotrun.providers.local.provider import LocalProvider
from spotrun.states import AttemptState, JobState, Market

from conftest import write_prices, write_trace

P3 = "p3.2xlarge"


def _db(tmp_path: Path, state: JobState = JobState.RUNNING):
    eng = open_db(f"sqlite:///{tmp_path / 'spotrun.db'}")
    with session(eng) as s:
        s.add(Job(id="j", name="j", state=state, spec_json=json.dumps({"name": "j"}),
                  store_uri="file:///x", checkpoint_uri="file:///x/c"))
        s.flush()
        s.add(Attempt(job_id="j", number=1, market=Market.ON_DEMAND, instance_type="g5.xlarge",
                      zone="za", price_usd_per_hour=1.0, client_token="t",
                      state=AttemptState.LAUNCHING,
                      candidates=json.dumps([f"{P3}/za/spot", "g5.xlarge/za/on-demand"])))
        s.commit()
    return eng


def _rows(eng, epoch: float) -> list[tuple[str, float, float]]:
    """(zone, market seconds since the epoch, price); datetimes keep microseconds only."""
    with session(eng) as s:
        return [(p.zone, round(p.ts.timestamp() - epoch, 3), p.price_usd_per_hour)
                for p in s.exec(select(PricePoint).order_by(PricePoint.ts, PricePoint.zone))]


def test_records_change_points_once_from_the_local_market(market_factory, tmp_path):
    trace = write_trace(tmp_path / "t.csv", {"za": [1] * 8, "zb": [1] * 8})
    prices = write_prices(tmp_path / "p.csv", [("za", 0, 0.5), ("za", 2, 0.8), ("za", 4, 0.6),
                                               ("zb", 0, 0.7)])
    client = market_factory(trace=trace, prices=str(prices), time_scale=100.0)
    epoch = client.time()["epoch_wall_s"]
    wall = ManualClock(epoch + 300 / 100.0)          # market time: epoch + 300 s (row 5)
    provider = LocalProvider(client, wall=wall)
    eng = _db(tmp_path)
    loop = PriceLoop(eng, provider, lookback_s=300.0)
    assert loop.watched_types() == [P3]              # the spot candidate, not the on-demand type
    first = loop.tick(utcnow())
    assert first.errors == [] and first.points_added == 4
    assert _rows(eng, epoch) == [("za", 0.0, 0.5), ("zb", 0.0, 0.7), ("za", 120.0, 0.8),
                                 ("za", 240.0, 0.6)]
    assert loop.tick(utcnow()).points_added == 0     # nothing new: nothing written
    # A new loop (a restarted daemon) starts from what is recorded; the trace wraps after
    # row 7: rows 8 and 10 repeat rows 0 and 2 (za 0.5, then 0.8), the only new points.
    wall.advance(300 / 100.0)
    again = PriceLoop(eng, provider, lookback_s=3600.0).tick(utcnow())
    assert again.points_added == 2
    assert _rows(eng, epoch)[4:] == [("za", 480.0, 0.5), ("za", 600.0, 0.8)]
    with session(eng) as s:
        assert {p.source for p in s.exec(select(PricePoint))} == {"local"}


def test_finished_jobs_stop_being_watched(tmp_path):
    eng = _db(tmp_path, state=JobState.SUCCEEDED)
    loop = PriceLoop(eng, provider=None, recent_job_s=60.0)   # type: ignore[arg-type]
    with session(eng) as s:
        job = s.get(Job, "j")
        job.updated_at = utcnow() - timedelta(seconds=120)
        s.add(job)
        s.commit()
    assert loop.watched_types(utcnow()) == []
    assert loop.tick(utcnow()).points_added == 0
    assert loop.watched_types(utcnow() - timedelta(seconds=100)) == [P3]   # within the grace

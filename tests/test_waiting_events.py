"""A waiting job writes a `waiting` event when the kind of its reason changes, not at every price
move; `status` still shows the live reason with today's prices (issue 24).

Real parts: the local market in-process on a hand-moved clock (its HTTP server on 127.0.0.1),
the SQLite state database, the daemon's scheduler loop, the `spotrun status` command.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import pytest
from click.testing import CliRunner
from conftest import kill_leftovers, write_prices, write_trace
from sqlmodel import select

from spotrun.cli import cli
from spotrun.config import load_settings
from spotrun.daemon.app import build_context
from spotrun.daemon.lease import Lease
from spotrun.daemon.scheduler import SchedulerLoop
from spotrun.db import Event, session
from spotrun.decide.waitkind import (NO_CAPACITY, NO_PRICE, NO_PROGRESS_KIND, PRICE_CAP,
                                     reason_kind)
from spotrun.jobs import submit, validate_submission
from spotrun.providers.local.market.client import MarketClient
from spotrun.providers.local.market.clock import ManualClock
from spotrun.providers.local.market.core import Market
from spotrun.providers.local.market.options import MarketOptions
from spotrun.providers.local.market.server import MarketHTTPServer, _Flags
from spotrun.providers.local.provider import LocalProvider

TICK_S = 60.0
TYPE = "p3.2xlarge"
CAP = 2.0
# Three stretches of five passes: spot above the cap, then under it with no capacity, then
# above it again. The price moves at every pass, in both zones.
UP, DOWN = [1] * 5, [0] * 5
POOLS = {"za": UP + DOWN + UP, "zb": UP + DOWN + UP}
PRICE = [3.0 + 0.1 * k for k in range(5)] + [1.0 + 0.1 * k for k in range(5)] \
    + [3.5 + 0.1 * k for k in range(5)]
PASSES = len(PRICE)


class _Clock:
    """The daemon's clock on the market's hand-moved wall clock."""

    def __init__(self, wall: ManualClock) -> None:
        self.wall = wall

    def now(self) -> datetime:
        """The manual time as an aware UTC datetime."""
        return datetime.fromtimestamp(self.wall.time(), tz=timezone.utc)


@pytest.fixture
def rig(tmp_home: Path, tmp_path: Path, instance_command: str) -> Iterator[tuple]:
    trace = write_trace(tmp_path / "trace.csv", POOLS, TICK_S)
    points = [(z, k, round(p + (0.05 if z == "zb" else 0.0), 2))
              for k, p in enumerate(PRICE) for z in POOLS]
    prices = write_prices(tmp_path / "prices.csv", points)
    wall = ManualClock(start_s=float(int(time.time())))
    opts = MarketOptions(trace=str(trace), prices=str(prices), instance_type=TYPE,
                         time_scale=1.0, notice_s=0.0, instance_command=instance_command,
                         grace_s=5.0)
    market = Market(tmp_path / "market", opts, wall=wall)
    server = MarketHTTPServer(market, _Flags())
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    (tmp_home / "spotrun.toml").write_text(
        f'[local]\ntrace = "{trace}"\nprices = "{prices}"\ntime_scale = 1.0\n')
    settings = load_settings(str(tmp_home))
    provider = LocalProvider(MarketClient(f"http://127.0.0.1:{server.port}"), wall=wall)
    ctx = build_context(settings, provider=provider, clock=_Clock(wall))
    spec = tmp_path / "capped.yaml"
    spec.write_text(f"name: capped\ncommand: 'true'\n"
                    f"resources: {{instance_types: [{TYPE}]}}\n"
                    f"work: {{reference_hours: 0.1, reference_instance: {TYPE}}}\n"
                    f"policy: {{market: spot, max_price_usd_per_hour: {CAP}}}\n")
    job = submit(validate_submission(spec, settings), ctx.engine)
    lease = Lease(ctx.engine, ttl_s=600.0)   # as the daemon holds it (status reads the job's own)
    assert lease.try_acquire()
    try:
        yield ctx, market, wall, job.id
    finally:
        lease.release()
        server.shutdown()
        server.server_close()
        market.close()
        ctx.engine.dispose()
        kill_leftovers(tmp_path / "market")


def _status_reason(home: Path, job_id: str) -> str:
    res = CliRunner().invoke(cli, ["status", job_id, "--json"], env={"SPOTRUN_HOME": str(home)})
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)["reason"]


def test_a_waiting_job_writes_events_on_a_change_of_kind_not_of_price(rig, tmp_home: Path):
    ctx, market, wall, job_id = rig
    scheduler = SchedulerLoop(ctx)
    epoch = market.clock.epoch_wall_s
    seen: list[str] = []
    for k in range(PASSES):
        wall.now_s = epoch + k * TICK_S
        market.step()
        scheduler.tick(_Clock(wall).now())   # a minute apart: past the no-capacity backoff
        seen.append(_status_reason(tmp_home, job_id))

    # status shows the live reason, with this pass's price.
    for k in (*range(5), *range(10, 15)):
        assert seen[k].startswith(f"price cap ${CAP:g}/h is below every spot price now"), seen[k]
        assert f"${PRICE[k]:.2f}/h" in seen[k], (k, seen[k])
    for k in range(5, 10):
        assert seen[k].startswith("no spot capacity now in any of 2 pool(s)"), seen[k]
    assert len(set(seen[:5])) == 5 and len(set(seen[10:])) == 5   # the text moved every pass

    with session(ctx.engine) as s:
        events = [e.detail for e in s.exec(select(Event).where(
            Event.job_id == job_id, Event.kind == "waiting").order_by(Event.id))]
    # One event per stretch (a change of kind), each with the text of its first pass.
    assert events == [seen[0], seen[5], seen[10]]


def test_a_daemon_restart_writes_no_event_for_a_reason_of_the_same_kind(rig, tmp_home: Path):
    ctx, market, wall, job_id = rig
    epoch = market.clock.epoch_wall_s
    for k in range(3):
        wall.now_s = epoch + k * TICK_S
        market.step()
        SchedulerLoop(ctx).tick(_Clock(wall).now())   # a new loop each pass: a restarted daemon
    with session(ctx.engine) as s:
        events = list(s.exec(select(Event).where(Event.job_id == job_id,
                                                 Event.kind == "waiting")))
    assert len(events) == 1 and f"${PRICE[2]:.2f}/h" in _status_reason(tmp_home, job_id)


def test_reason_kinds_ignore_figures_and_pools():
    a = "price cap $2/h is below every spot price now; lowest $3.10/h (p3.2xlarge in za)"
    b = "price cap $2/h is below every spot price now; lowest $3.40/h (g5.xlarge in zb)"
    assert reason_kind(a) == reason_kind(b) == PRICE_CAP
    assert reason_kind("no spot capacity now in any of 4 pool(s); waiting for capacity") \
        == reason_kind("no capacity in 3 pool(s)") == NO_CAPACITY
    mixed = ("spot price $3.100/h in za is above policy.max_price_usd_per_hour $2/h; "
             "no spot capacity in zb now; no spot price in zc")
    assert reason_kind(mixed) == "+".join(sorted([PRICE_CAP, NO_CAPACITY, NO_PRICE]))
    assert reason_kind(mixed.replace("3.100", "3.900").replace(" za ", " zd ")) \
        == reason_kind(mixed)
    stuck = "za reclaims every 0.40 h, each losing 1.20 h (x): no progress expected"
    assert reason_kind(stuck) == NO_PROGRESS_KIND
    # A text of no known shape is its own kind: every change of it is still recorded.
    assert reason_kind("something new 1") != reason_kind("something new 2")
    assert reason_kind(None) is None

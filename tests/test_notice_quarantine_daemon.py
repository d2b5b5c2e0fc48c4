"""Issue 40 in the daemon: no job is launched into the pool where an attempt just got its notice.

Real parts: the local market in-process on a hand-moved clock (its HTTP server on 127.0.0.1,
real instance processes), the SQLite state database, the product's submit path, and the
daemon's scheduler, heartbeat and reconcile loops. The one stand-in is the agent: the test
writes the notice report an agent writes into the store when IMDS shows the notice (the
market's own notice, from `interrupt`, is there too).

Two pools, za at $1/h and zb at $2/h, both with capacity throughout: every decision puts za
first unless a notice closes it.
"""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator

from conftest import kill_leftovers, write_prices, write_trace
from polling import wait_for

from spotrun import layout
from spotrun.config import load_settings
from spotrun.daemon.app import build_context
from spotrun.daemon.heartbeats import HeartbeatLoop
from spotrun.daemon.reconcile import ReconcileLoop
from spotrun.daemon.scheduler import SchedulerLoop
from spotrun.db import Attempt, Job, attempts_of, session
from spotrun.jobs import submit, validate_submission
from spotrun.providers.facts import facts_for
from spotrun.providers.local.market import server as market_server
from spotrun.providers.local.market.client import MarketClient
from spotrun.providers.local.market.clock import ManualClock
from spotrun.providers.local.market.core import Market
from spotrun.providers.local.market.options import MarketOptions
from spotrun.providers.local.provider import LocalProvider
from spotrun.reports import Notice, dump
from spotrun.states import AttemptState, EndReason

TICK_S = 60.0
TYPE = "p3.2xlarge"
NOTICE_S = 120.0


class _Clock:
    """The daemon's clock on the market's hand-moved wall clock."""

    def __init__(self, wall: ManualClock) -> None:
        self.wall = wall

    def now(self) -> datetime:
        """The manual time as an aware UTC datetime."""
        return datetime.fromtimestamp(self.wall.time(), tz=timezone.utc)


class Rig:
    """A home on a two-pool market at x1 on a manual clock, and the daemon's loops on it."""

    def __init__(self, root: Path, instance_command: str) -> None:
        home = root / "home"
        home.mkdir(parents=True)
        rows = 40   # 40 market minutes: past the 720 s quarantine
        trace = write_trace(root / "trace.csv", {"za": [1] * rows, "zb": [1] * rows}, TICK_S)
        prices = write_prices(root / "prices.csv", [("za", 0, 1.0), ("zb", 0, 2.0)])
        self.wall = ManualClock(start_s=float(int(time.time())))
        opts = MarketOptions(trace=str(trace), prices=str(prices), instance_type=TYPE,
                             time_scale=1.0, notice_s=NOTICE_S,
                             instance_command=instance_command, grace_s=5.0)
        self.market = Market(root / "market", opts, wall=self.wall)
        self.server = market_server.MarketHTTPServer(self.market, market_server._Flags())
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        (home / "spotrun.toml").write_text(
            f'[local]\ntrace = "{trace}"\nprices = "{prices}"\ntime_scale = 1.0\n'
            f"notice_s = {NOTICE_S}\n")
        self.root, self.home = root, home
        self.settings = load_settings(str(home))
        provider = LocalProvider(MarketClient(f"http://127.0.0.1:{self.server.port}"),
                                 wall=self.wall)
        self.ctx = build_context(self.settings, provider=provider, clock=_Clock(self.wall))
        self.loops = [ReconcileLoop(self.ctx), HeartbeatLoop(self.ctx), SchedulerLoop(self.ctx)]
        self.epoch = self.market.clock.epoch_wall_s
        self.spec = root / "job.yaml"
        self.spec.write_text(f"name: q\ncommand: 'true'\nresources: {{instance_types: [{TYPE}]}}\n"
                             f"work: {{reference_hours: 5.0, reference_instance: {TYPE}}}\n"
                             "policy: {market: spot}\n")

    def at(self, market_s: float) -> datetime:
        """Move the clock to market_s after the market's start; every loop ticks once."""
        self.wall.now_s = self.epoch + market_s
        self.market.step()
        now = _Clock(self.wall).now()
        for loop in self.loops:
            loop.tick(now)
        return now

    def submit(self) -> str:
        """A spot job through `spotrun submit`'s path; its id."""
        return submit(validate_submission(self.spec, self.settings), self.ctx.engine).id

    def attempts(self, job_id: str) -> list[Attempt]:
        """The job's attempts, oldest first."""
        with session(self.ctx.engine) as s:
            return attempts_of(s, job_id)

    def launched(self, job_id: str, number: int) -> Attempt:
        """Attempt `number` of the job once its instance is known."""
        return wait_for(lambda: next((a for a in self.attempts(job_id) if a.number == number
                                      and a.instance_id is not None), None), 10,
                        f"attempt {number} of {job_id} to launch")

    def close(self) -> None:
        """Stop the market and its instances."""
        self.server.shutdown()
        self.server.server_close()
        self.market.close()
        self.ctx.engine.dispose()
        kill_leftovers(self.root / "market")


@contextmanager
def rig(root: Path, instance_command: str, monkeypatch) -> Iterator[Rig]:
    """A Rig, closed afterwards."""
    monkeypatch.setenv("SPOTRUN_HOME", str(root / "home"))
    monkeypatch.delenv("SPOTRUN_DB_URL", raising=False)
    r = Rig(root, instance_command)
    try:
        yield r
    finally:
        r.close()


def test_no_launch_goes_into_the_pool_of_a_fresh_notice_until_its_window_ends(
        tmp_path, instance_command, monkeypatch):
    with rig(tmp_path / "q", instance_command, monkeypatch) as r:
        first = r.submit()
        r.at(3.0)
        a1 = r.launched(first, 1)
        assert a1.zone == "za"                                 # the cheaper pool
        r.at(6.0)                                              # reconcile: running

        # The market posts the notice now, the reclaim NOTICE_S later; the agent, polling
        # IMDS, reports it; the heartbeat loop records it.
        r.market.interrupt(a1.instance_id, NOTICE_S, notice=True)
        with session(r.ctx.engine) as s:
            store = r.ctx.store_for(s.get(Job, first).store_uri)
        seen = r.at(8.0)
        store.put_bytes(layout.notice_key(first, 1), json.dumps(dump(Notice(
            ts=seen.isoformat(), action="terminate",
            time=(seen + timedelta(seconds=NOTICE_S - 2.0)).isoformat()))).encode())
        r.at(9.0)
        [a1] = r.attempts(first)
        assert a1.notice_at is not None and a1.state is AttemptState.RUNNING
        noticed_s = a1.notice_at.timestamp() - r.epoch

        # A second job, 42 s after the notice: not into za.
        second = r.submit()
        r.at(noticed_s + 42.0)
        assert r.launched(second, 1).zone == "zb"

        # The noticed instance is reclaimed; the job resumes, and not into za either.
        r.at(6.0 + NOTICE_S + 1.0)
        assert r.attempts(first)[0].end_reason is EndReason.RECLAIMED
        assert r.launched(first, 2).zone == "zb"

        # One second after the window, za is a candidate again: a third job goes there.
        third = r.submit()
        r.at(noticed_s + facts_for(r.settings).notice_quarantine_s + 1.0)
        assert r.launched(third, 1).zone == "za"

"""A scheduler pass costs what changed (issue 24, "Work per pass").

Per pass, at 10 and at 200 queued jobs (and two jobs on running instances): the SQL
statements are as many, the market is read once, and a job is decided again only when an
input of its decision changed: none on a pass where nothing did, every job after the market's
prices moved, every job once after a daemon restart. The spend loop runs as many statements
whatever the number of queued jobs.

Real parts: the local market in-process on a hand-moved clock (its HTTP server on 127.0.0.1,
real instance processes for the running jobs), the SQLite state database, the product's
submit path, the scheduler and spend loops. Statements are counted with SQLAlchemy's
`before_cursor_execute`, market requests at the market's HTTP handler, decisions at the
daemon's one call of `decide`.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

import pytest
from conftest import kill_leftovers, write_prices, write_trace
from polling import wait_for
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlmodel import select

from spotrun.config import load_settings
from spotrun.costmodel import DbHistory
from spotrun.daemon import live_decision as decision
from spotrun.daemon.app import build_context
from spotrun.daemon.scheduler import SchedulerLoop
from spotrun.daemon.spend import SpendLoop
from spotrun.db import Attempt, Event, Job, add_event, new_job_id, open_db, session
from spotrun.jobs import submit, validate_submission
from spotrun.providers.local.market import server as market_server
from spotrun.providers.local.market.client import MarketClient
from spotrun.providers.local.market.clock import ManualClock
from spotrun.providers.local.market.core import Market
from spotrun.providers.local.market.options import MarketOptions
from spotrun.providers.local.provider import LocalProvider
from spotrun.spec import job_spec
from spotrun.states import AttemptState, EndReason, JobState, Market as MarketKind

TICK_S = 60.0
TYPE = "p3.2xlarge"
ZONES = ("za", "zb", "zc")
RUNNING = 2          # jobs on a live instance, at every size
SMALL, LARGE = 10, 200


class _Clock:
    """The daemon's clock on the market's hand-moved wall clock."""

    def __init__(self, wall: ManualClock) -> None:
        self.wall = wall

    def now(self) -> datetime:
        """The manual time as an aware UTC datetime."""
        return datetime.fromtimestamp(self.wall.time(), tz=timezone.utc)


@contextmanager
def counting() -> Iterator[Counter]:
    """SQL statements on any engine, decide() calls and market requests inside the block."""
    seen: Counter = Counter()

    def statement(conn: Any, cursor: Any, text: str, *args: Any) -> None:
        seen["sql"] += 1

    real_decide, real_dispatch = decision.decide, market_server._Handler._dispatch

    def counted_decide(*args: Any, **kw: Any) -> Any:
        seen["decide"] += 1
        return real_decide(*args, **kw)

    def counted_dispatch(handler: Any, method: str) -> None:
        seen[f"{method} {handler.path.split('?')[0]}"] += 1
        real_dispatch(handler, method)

    event.listen(Engine, "before_cursor_execute", statement)
    decision.decide = counted_decide
    market_server._Handler._dispatch = counted_dispatch
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", statement)
        decision.decide = real_decide
        market_server._Handler._dispatch = real_dispatch


class Rig:
    """A home with a market on a manual clock, RUNNING jobs launched, then n queued jobs."""

    def __init__(self, root: Path, n: int, instance_command: str, *, alike: bool) -> None:
        root.mkdir()
        home = root / "home"
        home.mkdir()
        steps = 6
        trace = write_trace(root / "trace.csv", {z: [1] * steps for z in ZONES}, TICK_S)
        # Spot at $3 and up, moving by a cent per trace row in every zone.
        prices = write_prices(root / "prices.csv", [
            (z, k, round(3.0 + 0.01 * k + 0.1 * i, 2)) for k in range(steps)
            for i, z in enumerate(ZONES)])
        self.wall = ManualClock(start_s=float(int(time.time())))
        opts = MarketOptions(trace=str(trace), prices=str(prices), instance_type=TYPE,
                             time_scale=1.0, notice_s=0.0, instance_command=instance_command,
                             grace_s=5.0)
        self.market = Market(root / "market", opts, wall=self.wall)
        self.server = market_server.MarketHTTPServer(self.market, market_server._Flags())
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        (home / "spotrun.toml").write_text(
            f'[local]\ntrace = "{trace}"\nprices = "{prices}"\ntime_scale = 1.0\n')
        self.home, self.root = home, root
        self.settings = load_settings(str(home))
        provider = LocalProvider(MarketClient(f"http://127.0.0.1:{self.server.port}"),
                                 wall=self.wall)
        self.ctx = build_context(self.settings, provider=provider, clock=_Clock(self.wall))
        self.scheduler = SchedulerLoop(self.ctx)
        self.epoch = self.market.clock.epoch_wall_s
        self.at_s = 0.0
        self._submit(root / "runs.yaml", "policy: {market: spot, budget_usd: 500}", RUNNING)
        self.tick()   # they launch: two live instances from here on
        wait_for(lambda: len(self.ctx.provider.describe()) == RUNNING, what="two instances")
        # Queued jobs that wait: a price cap under every spot price, a budget each. Each has
        # its own estimate (decisions differ), unless they are alike (one spec for all).
        self.queued = self._submit(
            root / "waits.yaml",
            "policy: {market: spot, max_price_usd_per_hour: 0.5, budget_usd: 100}", n,
            vary=not alike)

    def _submit(self, path: Path, policy: str, n: int, vary: bool = False) -> list[str]:
        path.write_text(f"name: {path.stem}\ncommand: 'true'\n"
                        f"work: {{reference_hours: 1.0, reference_instance: {TYPE}}}\n"
                        f"{policy}\n")
        sub = validate_submission(path, self.settings)
        ids = []
        for k in range(n):
            job_id = new_job_id(f"{path.stem}{k}")   # ids are random: apart by number
            spec = sub.spec if not vary else replace(
                sub.spec, work=replace(sub.spec.work, reference_hours=1.0 + k / 1000.0))
            submit(replace(sub, spec=spec, job_id=job_id,
                           checkpoint_uri=sub.checkpoint_uri.replace(sub.job_id, job_id)),
                   self.ctx.engine)
            ids.append(job_id)
        return ids

    def tick(self, loop: SchedulerLoop | None = None) -> None:
        """One scheduler pass, 3 s after the last (past a waiting job's retry delay)."""
        self.at_s += 3.0
        self.wall.now_s = self.epoch + self.at_s
        (loop or self.scheduler).tick(_Clock(self.wall).now())

    def move_market(self) -> None:
        """The market's next trace row: every spot price moves by a cent."""
        self.at_s += TICK_S
        self.wall.now_s = self.epoch + self.at_s
        self.market.step()

    def close(self) -> None:
        """Stop the market and its instances."""
        self.server.shutdown()
        self.server.server_close()
        self.market.close()
        self.ctx.engine.dispose()
        kill_leftovers(self.root / "market")


@contextmanager
def rig(root: Path, n: int, instance_command: str, monkeypatch: pytest.MonkeyPatch, *,
        alike: bool = False) -> Iterator[Rig]:
    """A Rig, closed afterwards."""
    monkeypatch.setenv("SPOTRUN_HOME", str(root / "home"))
    monkeypatch.delenv("SPOTRUN_DB_URL", raising=False)
    r = Rig(root, n, instance_command, alike=alike)
    try:
        yield r
    finally:
        r.close()


def passes(r: Rig) -> dict[str, Counter]:
    """What each pass cost: the first, an unchanged one, one after a price move, and the
    first two of a restarted daemon."""
    out: dict[str, Counter] = {}
    for name in ("first", "unchanged", "moved", "restarted", "restarted again"):
        if name == "moved":
            r.move_market()
        if name == "restarted":
            r.scheduler = SchedulerLoop(r.ctx)
        with counting() as seen:
            r.tick()
        out[name] = seen
    return out


def spend_statements(r: Rig) -> list[int]:
    """Statements of two spend passes."""
    loop = SpendLoop(r.ctx.engine, r.ctx.provider)
    out = []
    for _ in range(2):
        with counting() as seen:
            loop.tick(_Clock(r.wall).now())
        out.append(seen["sql"])
    return out


def test_a_pass_costs_what_changed_not_how_many_jobs_wait(tmp_path, instance_command,
                                                         monkeypatch):
    cost: dict[int, dict[str, Counter]] = {}
    spend: dict[int, list[int]] = {}
    for n in (SMALL, LARGE):
        with rig(tmp_path / f"n{n}", n, instance_command, monkeypatch) as r:
            cost[n] = passes(r)
            spend[n] = spend_statements(r)
            with session(r.ctx.engine) as s:
                jobs = {j.id: j for j in s.exec(select(Job))}
            # The standing decisions are the ones made now: status shows a fresh reason.
            for job_id in (r.queued[0], r.queued[-1]):
                job = jobs[job_id]
                fresh = decision.placement_for(r.ctx, job, job_spec(job))
                assert job.state is JobState.QUEUED and fresh.candidates == []
                assert job.reason == fresh.wait_reason
            assert sum(j.state is JobState.STARTING for j in jobs.values()) == RUNNING

    for n in (SMALL, LARGE):
        decided = {name: seen["decide"] for name, seen in cost[n].items()}
        assert decided == {"first": n, "unchanged": 0, "moved": n, "restarted": n,
                           "restarted again": 0}, (n, decided)
        for name, seen in cost[n].items():
            # One market read per pass (it names its zones and every type), nothing per job.
            reads = {k: v for k, v in seen.items() if k.startswith(("GET", "POST"))}
            assert reads == {"GET /pools": 1}, (n, name, reads)
    sql = {n: {name: seen["sql"] for name, seen in cost[n].items()} for n in cost}
    assert all(v > 0 for v in sql[SMALL].values()), sql
    assert sql[LARGE] == sql[SMALL], f"statements per pass grew with the queue: {sql}"
    assert spend[LARGE] == spend[SMALL] and min(spend[SMALL]) > 0, spend


def test_alike_jobs_share_one_decision_and_keep_their_waiting_history(tmp_path,
                                                                      instance_command,
                                                                      monkeypatch):
    with rig(tmp_path / "alike", 20, instance_command, monkeypatch, alike=True) as r:
        cost = passes(r)
        with session(r.ctx.engine) as s:
            jobs = [s.get(Job, j) for j in r.queued]
            events = Counter(e.job_id for e in s.exec(select(Event).where(
                Event.kind == "waiting")))
        fresh = decision.placement_for(r.ctx, jobs[-1], job_spec(jobs[-1]))
    assert {k: v["decide"] for k, v in cost.items()} == {
        "first": 1, "unchanged": 0, "moved": 1, "restarted": 1, "restarted again": 0}
    assert {j.reason for j in jobs} == {fresh.wait_reason}
    # One `waiting` event each: the price moved, what they wait for did not.
    assert events == {j: 1 for j in r.queued}


def test_the_pass_history_reads_a_job_as_the_database_history_does(tmp_path):
    engine = open_db(f"sqlite:///{tmp_path / 'state.db'}")
    t0 = datetime(2030, 1, 1, tzinfo=timezone.utc)
    with session(engine) as s:
        s.add(Job(id="j1", name="j1", spec_json="{}", store_uri="file:///x",
                  checkpoint_uri="file:///x/c", last_step=700, state=JobState.RECOVERING))
        s.flush()   # the job row before its attempts (a foreign key)
        for n, (reason, sps, save_s, notice) in enumerate([
                (EndReason.RECLAIMED, 2.0, 1.5, True), (EndReason.RECLAIMED, None, None, False),
                (EndReason.ERROR, 3.0, 0.5, False)], start=1):
            s.add(Attempt(job_id="j1", number=n, state=AttemptState.ENDED,
                          market=MarketKind.SPOT, instance_type=TYPE if n < 3 else "g5.xlarge",
                          zone="za", price_usd_per_hour=1.0, client_token=f"t{n}",
                          started_at=t0 + timedelta(hours=n), ended_at=t0 + timedelta(hours=n,
                                                                                       minutes=30),
                          end_reason=reason, steps_per_s=sps, checkpoint_save_s=save_s,
                          start_step=100 * n, last_step=100 * n + 50,
                          notice_at=t0 + timedelta(hours=n, minutes=29) if notice else None))
        add_event(s, "j1", "submitted")
        s.commit()
        job = s.get(Job, "j1")
        rows = list(s.exec(select(Attempt).order_by(Attempt.number.desc())))
    history = decision.PassHistory(engine, {"j1": rows}, {"j1": job})
    assert history.job_stats("j1") == DbHistory(engine).job_stats("j1")
    assert history.job_stats("j1").reclaims and history.job_stats("j1").steps_per_s
    engine.dispose()


class _KeepAlive(http.server.BaseHTTPRequestHandler):
    """A JSON server on HTTP/1.1 that counts the connections it opens and closes."""

    protocol_version = "HTTP/1.1"
    opened: list[int] = []
    closed: list[int] = []
    drop_next = False     # close the connection after the next answer, without saying so

    def setup(self) -> None:
        super().setup()
        self.opened.append(1)

    def finish(self) -> None:
        super().finish()
        self.closed.append(1)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""

    def do_GET(self) -> None:
        data = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        if _KeepAlive.drop_next:
            _KeepAlive.drop_next = False
            self.close_connection = True   # as a server dropping an idle connection does


def test_the_market_client_keeps_one_connection_and_reopens_a_dropped_one():
    _KeepAlive.opened, _KeepAlive.closed = [], []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _KeepAlive)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    client = MarketClient(f"http://127.0.0.1:{server.server_address[1]}")
    try:
        answers = [client.request("GET", "/pools", query={"n": k}) for k in range(20)]
        assert [a["path"] for a in answers] == [f"/pools?n={k}" for k in range(20)]
        assert len(_KeepAlive.opened) == 1
        _KeepAlive.drop_next = True
        assert client.request("GET", "/time")["path"] == "/time"
        wait_for(lambda: _KeepAlive.closed, what="the server to drop the connection")
        # The client still holds the dropped connection: its next call goes out on a new one.
        assert client.request("GET", "/health")["path"] == "/health"
        assert len(_KeepAlive.opened) == 2
    finally:
        client.close()
        server.shutdown()
        server.server_close()


class _SteppingClock(_Clock):
    """Each look at the monotonic clock finds it a second on: a pass's time budget runs out
    after a fixed number of jobs, whatever the load on the box."""

    def __init__(self, wall: ManualClock) -> None:
        super().__init__(wall)
        self.t = 0.0

    def monotonic(self) -> float:
        """One second later than the last look."""
        self.t += 1.0
        return self.t


def test_a_bounded_pass_stops_at_its_budget_and_the_next_resumes_after_it(
        tmp_path, instance_command, monkeypatch):
    # The service's scheduler cuts a pass at its budget: a thousand queued jobs make many
    # short passes, not one long one, and every job is still decided once, in turn.
    n = 10
    with rig(tmp_path / "bounded", n, instance_command, monkeypatch) as r:
        r.ctx.clock = _SteppingClock(r.wall)
        loop = SchedulerLoop(r.ctx, pass_budget_s=2.5)   # 3 jobs a pass on this clock
        decided = []
        for _ in range(8):
            with counting() as seen:
                r.tick(loop)
            decided.append(seen["decide"])
        with session(r.ctx.engine) as s:
            events = Counter(e.job_id for e in s.exec(select(Event).where(
                Event.kind == "waiting")))
            jobs = [s.get(Job, j) for j in r.queued]
    assert max(decided) <= 3 and sum(decided) == n, decided
    assert decided.index(0) >= n // 3, decided   # it took several passes, then none
    assert all(d == 0 for d in decided[decided.index(0):]), decided
    assert all(events[j] == 1 for j in r.queued), events
    assert all(j.state is JobState.QUEUED and j.reason for j in jobs)

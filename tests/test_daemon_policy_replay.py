"""The daemon and `spotrun simulate` share the policy code: a trace replayed through the daemon
gets exactly the simulator's per-tick decisions.

Real parts: the local market (in-process, with a hand-moved clock, its HTTP server on
127.0.0.1), real instance processes, the SQLite state database, the daemon's scheduler and
reconcile loops, the `spotrun simulate` command. The instances run a workload that just
stays alive, so progress is the daemon's provider-clock estimate (time on an instance after
the changeover): the simulator's own model.
"""

from __future__ import annotations

import csv
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator

import pytest
from click.testing import CliRunner
from conftest import kill_leftovers, write_prices, write_trace
from polling import wait_for

from spotrun.catalog import load_catalog
from spotrun.cli.simulate import simulate
from spotrun.config import load_settings
from spotrun.daemon.app import build_context
from spotrun.daemon.reconcile import ReconcileLoop
from spotrun.daemon.scheduler import SchedulerLoop
from spotrun.daemon.deadline_policy import clock_progress_s
from spotrun.db import Attempt, Job, attempts_of, session
from spotrun.decide.policy import Mode
from spotrun.errors import ConfigError
from spotrun.jobs import submit, validate_submission
from spotrun.providers.local.market.client import MarketClient
from spotrun.providers.local.market.clock import ManualClock
from spotrun.providers.local.market.core import Market
from spotrun.providers.local.market.options import MarketOptions
from spotrun.providers.local.market.server import MarketHTTPServer, _Flags
from spotrun.providers.local.provider import LocalProvider
from spotrun.states import AttemptState, EndReason, InstanceState, JobState, \
    Market as MarketKind

# Ten-minute rows: a pool back two rows after a reclaim is past the notice quarantine
# (720 s: the row after a reclaim is still closed), so both sides make the moves below with
# the quarantine on (tests/test_notice_quarantine_simulate.py has one where it binds).
TICK_S = 600.0
TYPE = "p3.2xlarge"          # the type the trace "measured": spot prices are the file's
WORK_HOURS = 15 * TICK_S / 3600.0   # 15 ticks
CHANGEOVER_TICKS = 2
# Reclaims in every pool; za's price jumps at 13 (reserve moves to zb at 21).
POOLS = {
    "za": [1] * 6 + [0] * 3 + [1] * 14 + [0] * 17,
    "zb": [0] * 2 + [1] * 3 + [0] * 5 + [1] * 4 + [0] * 4 + [1] * 22,
    "zc": [1] * 3 + [0] * 4 + [1] * 2 + [0] * 9 + [1] * 4 + [0] * 18,
}
PRICES = [("za", 0, 0.95), ("zb", 0, 1.10), ("zc", 0, 0.90), ("za", 13, 2.60),
          ("zb", 12, 0.80), ("zc", 25, 0.85)]


class DaemonClock:
    """The daemon's clock on the same hand-moved wall clock as the market."""

    def __init__(self, wall: ManualClock) -> None:
        self.wall = wall

    def now(self) -> datetime:
        """The manual time as an aware UTC datetime."""
        return datetime.fromtimestamp(self.wall.time(), tz=timezone.utc)


class Replay:
    """A market on the hand-made trace, a daemon context on it, and the trace files."""

    def __init__(self, market: Market, url: str, clock: ManualClock, trace: Path, prices: Path,
                 home: Path, tmp: Path) -> None:
        self.market, self.url, self.clock = market, url, clock
        self.trace, self.prices, self.home, self.tmp = trace, prices, home, tmp
        self.epoch = market.clock.epoch_wall_s

    def at_tick(self, k: int) -> datetime:
        """Move the clock to trace row k and let the market act (reclaims due now)."""
        self.clock.now_s = self.epoch + k * TICK_S
        self.market.step()
        return DaemonClock(self.clock).now()

    def settle(self) -> None:
        """Wait until instances the daemon terminated are gone, before the clock moves on."""
        def done() -> bool:
            self.market.step()
            return all(r.state is not InstanceState.SHUTTING_DOWN
                       for r in self.market.state.all(live_only=True))
        wait_for(done, timeout_s=10, what="terminated instances to exit")


@pytest.fixture
def replay(tmp_home: Path, tmp_path: Path, instance_command: str) -> Iterator[Replay]:
    trace = write_trace(tmp_path / "trace.csv", POOLS, TICK_S)
    prices = write_prices(tmp_path / "prices.csv", PRICES)
    # Whole seconds at x1: every market time is an exact float, as the simulator's ticks.
    clock = ManualClock(start_s=float(int(time.time())))
    opts = MarketOptions(trace=str(trace), prices=str(prices), instance_type=TYPE,
                         time_scale=1.0, notice_s=0.0, instance_command=instance_command,
                         grace_s=5.0)
    market = Market(tmp_path / "market", opts, wall=clock)
    server = MarketHTTPServer(market, _Flags())
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.port}"
    try:
        yield Replay(market, url, clock, trace, prices, tmp_home, tmp_path)
    finally:
        server.shutdown()
        server.server_close()
        market.close()
        kill_leftovers(tmp_path / "market")


def simulator_decisions(r: Replay, policy: str, deadline_ticks: int) -> list[tuple[int, str, str]]:
    """`spotrun simulate --decisions` for the job's start (tick 0): (tick, mode, pool) rows."""
    out = r.tmp / f"decisions-{policy}.csv"
    od = load_catalog().get(TYPE).on_demand_price("us-east-1")
    res = CliRunner().invoke(simulate, [
        "--trace", str(r.trace), "--prices", str(r.prices), "--od-price", repr(od),
        "--work-hours", repr(WORK_HOURS),
        "--deadline-hours", repr(deadline_ticks * TICK_S / 3600.0),
        "--changeover-hours", repr(CHANGEOVER_TICKS * TICK_S / 3600.0), "--t0", "0",
        "--policy", policy, "--decisions", str(out), "--json"])
    assert res.exit_code == 0, res.output
    with out.open() as fh:
        return [(int(row["tick"]), row["mode"], row["pool"]) for row in csv.DictReader(fh)]


def submit_deadline_job(r: Replay, policy: str, deadline_ticks: int):
    """Settings naming the policy, and a deadline job submitted through `spotrun submit`'s path."""
    (r.home / "spotrun.toml").write_text(
        f'[local]\ntrace = "{r.trace}"\nprices = "{r.prices}"\ntime_scale = 1.0\n'
        f'[daemon]\npolicy = "{policy}"\n'
        f"policy_changeover_s = {CHANGEOVER_TICKS * TICK_S}\n")
    settings = load_settings(str(r.home))
    provider = LocalProvider(MarketClient(r.url), wall=r.clock)
    ctx = build_context(settings, provider=provider, clock=DaemonClock(r.clock))
    deadline = datetime.fromtimestamp(r.epoch + deadline_ticks * TICK_S, tz=timezone.utc)
    spec = r.tmp / "job.yaml"
    spec.write_text(
        "name: replay\ncommand: 'true'\n"
        f"resources: {{instance_types: [{TYPE}]}}\n"
        f"work: {{reference_hours: {WORK_HOURS}, reference_instance: {TYPE}}}\n"
        f"policy: {{market: auto, deadline: '{deadline.isoformat()}'}}\n")
    job = submit(validate_submission(spec, settings), ctx.engine)
    return ctx, job.id


def launches(rows: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    """Where a decision sequence launches: (tick, mode, pool) at each change of placement."""
    out, here = [], ("idle", "")
    for tick, mode, pool in rows:
        if mode == "idle":
            here = ("idle", "")
        elif (mode, pool) != here:
            out.append((tick, mode, pool))
            here = (mode, pool)
    return out


@pytest.mark.parametrize("policy,deadline_ticks,expect", [
    ("reserve", 36, "move"),              # spot reclaims, then a spot-to-spot move
    ("spotrun", 36, "reclaim"),           # the plan, refit on the market the daemon recorded
    ("uniform-progress", 30, "on-demand"),  # the safety net takes it to on-demand
])
def test_daemon_replay_gets_the_simulators_decisions(replay: Replay, policy: str,
                                                     deadline_ticks: int, expect: str) -> None:
    r = replay
    expected = simulator_decisions(r, policy, deadline_ticks)
    ctx, job_id = submit_deadline_job(r, policy, deadline_ticks)
    scheduler, reconcile = SchedulerLoop(ctx), ReconcileLoop(ctx)
    for k in range(len(expected)):
        now = r.at_tick(k)
        reconcile.tick(now)
        scheduler.tick(now)
        r.settle()
    r.at_tick(len(expected))
    reconcile.tick(DaemonClock(r.clock).now())

    got = [(round((at.timestamp() - r.epoch) / TICK_S), d.mode.value,
            d.pool if d.mode is Mode.SPOT else "")
           for at, d in scheduler.placer.decisions(job_id)]
    assert got == expected

    # The decisions were carried out: one attempt per launch, where and when the simulator
    # launched; each ended by a reclaim (the trace) or a policy move.
    with session(ctx.engine) as s:
        attempts = attempts_of(s, job_id)
        job = s.get(Job, job_id)
    placed = [(round((a.started_at.timestamp() - r.epoch) / TICK_S), a.market.value,
               a.zone if a.market is MarketKind.SPOT else "") for a in attempts]
    assert placed == launches(expected)
    ended = {a.end_reason for a in attempts[:-1]}
    assert ended <= {EndReason.RECLAIMED, EndReason.MOVED} and EndReason.RECLAIMED in ended
    assert attempts[-1].end_reason is None and job.state is JobState.RUNNING
    if expect == "move":
        assert EndReason.MOVED in ended
    elif expect == "on-demand":
        assert attempts[-1].market is MarketKind.ON_DEMAND


def test_clock_progress_counts_time_after_each_changeover_once() -> None:
    t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)

    def att(n: int, start_s: float | None, end_s: float | None, state: AttemptState) -> Attempt:
        return Attempt(job_id="j", number=n, state=state, market=MarketKind.SPOT,
                       instance_type=TYPE, zone="za", price_usd_per_hour=1.0,
                       client_token=f"t{n}",
                       started_at=None if start_s is None else t0 + timedelta(seconds=start_s),
                       ended_at=None if end_s is None else t0 + timedelta(seconds=end_s))
    now = t0 + timedelta(seconds=1000)
    attempts = [att(1, 0, 300, AttemptState.ENDED),          # 300 - 120 = 180
                att(2, 400, 450, AttemptState.ENDED),        # reclaimed in its changeover: 0
                att(3, None, None, AttemptState.ENDED),      # never launched
                att(4, 500, 800, AttemptState.ENDED),        # moved away at 700, gone at 800
                att(5, 540, None, AttemptState.RUNNING)]     # 660..1000, overlaps 4's shutdown
    # 180 + (620..800 merged with 660..1000 = 620..1000) = 180 + 380
    assert clock_progress_s(attempts, 120.0, now) == 560.0
    assert clock_progress_s(attempts, 0.0, t0 + timedelta(seconds=100)) == 100.0


@pytest.mark.parametrize("name", ["optimal", "spotrun-plan"])   # hindsight; a name gone
def test_unknown_placement_policy_is_a_config_error(tmp_home: Path, name: str) -> None:
    (tmp_home / "spotrun.toml").write_text(f'[daemon]\npolicy = "{name}"\n')
    ctx = build_context(load_settings(str(tmp_home)))
    with pytest.raises(ConfigError) as err:
        SchedulerLoop(ctx)
    assert err.value.field == "daemon.policy"
    assert "allowed: on-demand, greedy, uniform-progress, reserve, markov-tiers, spotrun" \
        in str(err.value)

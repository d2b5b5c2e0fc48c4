"""One daemon per database: the lease (compare-and-set row in Meta, renewed, with expiry)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from spotrun.daemon.lease import Lease, LeaseGuard, LeaseKeeper
from spotrun.db import open_db

from conftest import kill_leftovers, write_trace
from daemon_helpers import DaemonProc, write_home
from polling import wait_for


class ManualClock:
    """A wall clock the test moves."""

    def __init__(self) -> None:
        self.t = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def now(self) -> datetime:
        """The current test time."""
        return self.t

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        self.t += timedelta(seconds=seconds)


@pytest.fixture
def engine(tmp_path: Path):
    """A fresh SQLite database."""
    e = open_db(f"sqlite:///{tmp_path / 'db.sqlite'}")
    yield e
    e.dispose()


def test_second_lease_waits_until_expiry(engine):
    clock = ManualClock()
    a = Lease(engine, ttl_s=10, clock=clock, owner="a")
    b = Lease(engine, ttl_s=10, clock=clock, owner="b")
    assert a.try_acquire() and a.held()
    assert not b.try_acquire() and not b.held()
    clock.advance(5)
    assert a.renew()                      # renewed: expiry is now t+15
    clock.advance(9)
    assert not b.try_acquire()
    assert b.holder().owner == "a"
    clock.advance(2)                      # a silent past its expiry
    assert b.try_acquire() and b.holder().owner == "b"
    assert not a.renew() and not a.held()   # the old holder learns it lost, and stops acting


def test_keeper_reports_a_lost_lease_once(engine):
    clock = ManualClock()
    a = Lease(engine, ttl_s=10, clock=clock, owner="a")
    b = Lease(engine, ttl_s=10, clock=clock, owner="b")
    assert a.try_acquire()
    clock.advance(11)                     # a was silent past its expiry: b takes it
    assert b.try_acquire()
    calls = []
    keeper = LeaseKeeper(a, interval_s=0.01, on_lost=lambda: calls.append(1)).start()
    wait_for(keeper.lost.is_set, 10, "the keeper to notice")
    keeper.stop()
    assert calls == [1] and not a.held()


def test_release_hands_over_at_once(engine):
    clock = ManualClock()
    a = Lease(engine, ttl_s=60, clock=clock, owner="a")
    b = Lease(engine, ttl_s=60, clock=clock, owner="b")
    assert a.try_acquire()
    a.release()
    assert b.try_acquire() and b.holder().owner == "b"
    a.release()                           # releasing a lease we no longer hold changes nothing
    assert b.holder().owner == "b"


def test_dead_local_holder_is_replaced_without_waiting(engine):
    clock = ManualClock()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    a = Lease(engine, ttl_s=3600, clock=clock, owner="crashed", pid=dead.pid)
    assert a.try_acquire()
    b = Lease(engine, ttl_s=3600, clock=clock, owner="b")
    assert b.try_acquire(), "a SIGKILLed daemon on this host should not block for the TTL"
    live = Lease(engine, ttl_s=3600, clock=clock, owner="c")   # our own pid: alive
    assert not live.try_acquire()


def test_guard_skips_ticks_without_the_lease(engine):
    ticks = []

    class Loop:
        name = "probe"

        def tick(self, now):
            ticks.append(now)

    clock = ManualClock()
    lease = Lease(engine, ttl_s=10, clock=clock, owner="a")
    guard = LeaseGuard(Loop(), lease)
    guard.tick(1)
    assert ticks == []
    lease.try_acquire()
    guard.tick(2)
    assert ticks == [2]


def _count(log: Path, word: str) -> int:
    try:
        return log.read_text(errors="replace").count(f'"{word}"')
    except OSError:
        return 0


def test_two_daemon_processes_one_waits_then_takes_over(tmp_home: Path, tmp_path: Path):
    trace = write_trace(tmp_path / "trace.csv", {"za": [1] * 20}, tick_s=600.0)
    write_home(tmp_home, trace, lease_ttl=2.0)
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    a = DaemonProc(tmp_home, log_a)
    b = None
    try:
        wait_for(lambda: _count(log_a, "lease_acquired"), 30, "daemon A to hold the lease")
        b = DaemonProc(tmp_home, log_b)
        wait_for(lambda: _count(log_b, "lease_waiting"), 30, "daemon B to wait")
        assert _count(log_b, "lease_acquired") == 0
        # A dies without releasing: B takes over. (A holder frozen with SIGSTOP while it
        # holds SQLite's write lock: tests/test_faults_db.py.)
        a.kill()
        wait_for(lambda: _count(log_b, "lease_acquired"), 30, "daemon B to take over")
        assert b.proc.poll() is None
        assert b.terminate() == 0
    finally:
        for d in (a, b):
            if d is not None and d.proc.poll() is None:
                os.kill(d.proc.pid, signal.SIGCONT)
                d.kill()
        kill_leftovers(tmp_home / "market")

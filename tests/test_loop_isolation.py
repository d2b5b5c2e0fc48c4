"""Daemon loops that cannot starve each other (issue 24).

Every loop runs on its own thread, on its own interval grid, and the loops' transactions take
turns at the database (spotrun.daemon.dbturns). Checked with the daemon's real loops over a
real SQLite database, through the engine `build_context` gives the daemon; the one injected
part is a scheduling pass that blocks on a threading.Event for as long as a test holds it.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from spotrun.clock import ManualClock
from spotrun.config import load_settings
from spotrun.daemon.app import build_context
from spotrun.daemon.dbturns import TurnLock, turn_lock
from spotrun.daemon.heartbeats import HeartbeatLoop, LivenessLoop
from spotrun.daemon.prices import PriceLoop
from spotrun.daemon.reconcile import ReconcileLoop
from spotrun.daemon.runner import Runner, Scheduled
from spotrun.daemon.scheduler import SchedulerLoop
from spotrun.db import Meta, session
from spotrun.errors import DatabaseError

from conftest import kill_leftovers, write_trace
from daemon_helpers import write_home
from polling import wait_for


class HeldPass:
    """A loop whose first tick (or every tick, with every=True) waits until released."""

    def __init__(self, loop, every: bool = False) -> None:
        self.loop, self.name, self.every = loop, loop.name, every
        self.entered = threading.Event()
        self.release = threading.Event()
        self.ticks = 0

    def tick(self, now) -> None:
        """Wait for release (a pass busy for as long as the test says), then the real pass."""
        self.ticks += 1
        if self.every or self.ticks == 1:
            self.entered.set()
            if not self.release.wait(120):
                raise RuntimeError("never released")
        self.loop.tick(now)


@pytest.fixture
def ctx(tmp_home: Path, tmp_path: Path):
    trace = write_trace(tmp_path / "trace.csv", {"za": [1] * 20}, tick_s=600.0)
    write_home(tmp_home, trace)
    toml = tmp_home / "spotrun.toml"
    toml.write_text("db_busy_timeout_s = 5.0\n" + toml.read_text())   # top level: before tables
    c = build_context(load_settings(str(tmp_home)))
    try:
        yield c
    finally:
        c.engine.dispose()
        kill_leftovers(tmp_home / "market")


def _count(runner: Runner, name: str) -> int:
    return runner.health.snapshot().get(name, {}).get("histogram", {}).get("count", 0)


def test_heartbeats_and_reconcile_keep_their_interval_while_a_scheduling_pass_blocks(ctx):
    held = HeldPass(SchedulerLoop(ctx), every=True)
    interval_s = 0.1
    runner = Runner([Scheduled(held, interval_s), Scheduled(HeartbeatLoop(ctx), interval_s),
                     Scheduled(ReconcileLoop(ctx), interval_s),
                     Scheduled(LivenessLoop(ctx), interval_s)])
    runner.start()
    try:
        wait_for(held.entered.is_set, 30, "the scheduling pass to start")
        base = {n: _count(runner, n) for n in ("heartbeats", "reconcile", "liveness")}
        # 30 passes of each while the one scheduling pass is still held.
        wait_for(lambda: all(_count(runner, n) >= base[n] + 30 for n in base), 60,
                 "heartbeats, reconcile and liveness to tick while the scheduler is busy")
        snap = runner.health.snapshot()
        assert snap["schedule"]["running_s"] is not None, "the scheduling pass was held"
        assert snap["schedule"]["histogram"]["count"] == 0
        held_for_s = snap["schedule"]["running_s"]
        for name in base:
            # Never held up for the scheduling pass: each tick started near its own slot.
            assert snap[name]["lag_max_s"] < max(1.0, held_for_s / 2), (name, snap[name])
            assert snap[name]["errors"] == 0
    finally:
        held.release.set()
        runner.stop(wait=True)
    assert runner.errors == 0


def test_the_first_pass_of_every_loop_runs_when_the_daemon_starts_busy(ctx):
    # apscheduler's misfire_grace_time=1 dropped a first pass queued > 1 s behind a busy
    # worker: a 300 s loop then went 5 minutes without one.
    held = HeldPass(SchedulerLoop(ctx))
    runner = Runner([Scheduled(held, 0.2), Scheduled(ReconcileLoop(ctx), 0.2),
                     Scheduled(HeartbeatLoop(ctx), 0.2),
                     Scheduled(PriceLoop(ctx.engine, ctx.provider), 300.0),
                     Scheduled(LivenessLoop(ctx), 300.0)])
    runner.start()
    try:
        wait_for(held.entered.is_set, 30, "the first scheduling pass to start")
        wait_for(lambda: (runner.health.snapshot()["schedule"]["running_s"] or 0) > 1.5, 30,
                 "the first scheduling pass to be busy for 1.5 s")
        held.release.set()
        names = ["schedule", "reconcile", "heartbeats", "prices", "liveness"]
        wait_for(lambda: all(_count(runner, n) >= 1 for n in names), 30,
                 "every loop's first pass")
        snap = runner.health.snapshot()
        # One pass each for the 300 s loops: a missed slot is one pass, never a burst.
        assert snap["prices"]["histogram"]["count"] == 1
        assert snap["liveness"]["histogram"]["count"] == 1
    finally:
        held.release.set()
        runner.stop(wait=True)
    assert runner.errors == 0


class Increments:
    """A loop adding 1 to one shared counter row, n times, in its own transactions
    (read the row, write it back: the pattern of every state change in the loops)."""

    def __init__(self, name: str, engine, start: threading.Barrier, n: int) -> None:
        self.name, self.engine, self.start, self.n = name, engine, start, n
        self.done = threading.Event()

    def tick(self, now) -> None:
        """The first tick writes n times, side by side with the other loop; later ones idle."""
        if self.done.is_set():
            return
        self.start.wait(20)   # both loops' passes run at the same time
        for _ in range(self.n):
            with session(self.engine) as s:
                row = s.get(Meta, "counter")
                row.value = str(int(row.value) + 1)
                s.add(row)
                s.commit()
        self.done.set()


def test_two_loops_writing_the_same_row_at_once_lose_nothing_and_never_see_locked(ctx):
    with session(ctx.engine) as s:
        s.add(Meta(key="counter", value="0"))
        s.commit()
    n = 300
    start = threading.Barrier(2)
    left = Increments("left", ctx.engine, start, n)
    right = Increments("right", ctx.engine, start, n)
    runner = Runner([Scheduled(left, 0.05), Scheduled(right, 0.05)])
    runner.start()
    try:
        wait_for(lambda: (left.done.is_set() and right.done.is_set()) or runner.errors, 120,
                 "both loops' writes")
    finally:
        runner.stop(wait=True)
    assert runner.errors == 0, "a write failed (database is locked?)"
    with session(ctx.engine) as s:
        assert s.get(Meta, "counter").value == str(2 * n)   # no update lost
    lock = turn_lock(ctx.engine)
    assert lock is not None and lock.waits > 0   # they did reach for the database at once


def test_a_missed_slot_is_one_pass_not_a_burst():
    clock = ManualClock(start_s=1000.0)
    t0 = clock.now_s
    starts: list[float] = []
    hold = threading.Event()

    class Slow:
        name = "slow"

        def tick(self, now) -> None:
            starts.append(clock.now_s)
            if len(starts) == 2:
                hold.wait(60)    # the test moves the clock while this tick runs

    runner = Runner([Scheduled(Slow(), 1.0)], clock=clock)
    runner.start()
    try:
        wait_for(lambda: _count(runner, "slow") == 1, 30, "the first pass")
        clock.now_s = t0 + 1.0
        runner.wake()
        wait_for(lambda: len(starts) == 2, 30, "the second pass")
        clock.now_s = t0 + 4.5          # the pass outlasts slots 2, 3 and 4
        hold.set()
        wait_for(lambda: _count(runner, "slow") == 2, 30, "the long pass to end")
        clock.now_s = t0 + 5.0
        runner.wake()
        wait_for(lambda: len(starts) == 3, 30, "the pass at slot 5")
    finally:
        hold.set()
        runner.stop(wait=True)
    assert starts == [t0, t0 + 1.0, t0 + 5.0]
    snap = runner.health.snapshot()["slow"]
    assert snap["lag_s"] == 0.0 and snap["lag_max_s"] == 0.0


# ---------------------------------------------------------------- the turns themselves

def test_turns_go_in_arrival_order_and_nest_on_one_thread():
    lock = TurnLock()
    assert lock.acquire(1) and lock.acquire(1)     # re-entrant: a nested session
    order: list[str] = []

    def take(name: str) -> None:
        assert lock.acquire(30)
        order.append(name)
        lock.release()

    threads = []
    for name in ("first", "second", "third"):
        t = threading.Thread(target=take, args=(name,), name=name)
        t.start()
        threads.append(t)
        wait_for(lambda k=len(threads): lock.waits == k, 30, f"{name} to queue")
    lock.release()
    assert order == []                              # still held once (the outer session)
    lock.release()
    for t in threads:
        t.join(30)
    assert order == ["first", "second", "third"] and lock.holder() is None


def test_a_turn_held_too_long_is_one_clear_error_naming_the_holder(ctx):
    lock = turn_lock(ctx.engine)
    assert lock is not None
    got = threading.Event()
    done = threading.Event()

    def hold() -> None:
        with session(ctx.engine) as s:
            s.get(Meta, "anything")
            got.set()
            done.wait(60)

    t = threading.Thread(target=hold, name="spotrun-loop-stuck")
    t.start()
    try:
        wait_for(got.is_set, 30, "the holder's transaction")
        with pytest.raises(DatabaseError) as err:
            with session(ctx.engine) as s:
                s.get(Meta, "anything")
    finally:
        done.set()
        t.join(30)
    text = str(err.value)
    assert "spotrun-loop-stuck" in text and "db_busy_timeout_s" in text and "5 s" in text
    with session(ctx.engine) as s:                  # the turn came back
        assert s.get(Meta, "anything") is None

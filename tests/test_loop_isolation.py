"""Daemon loops that cannot starve each other (issue 24), on APScheduler (issue 41).

The runner's scheduler has a worker for every loop, runs each loop on its own interval grid
(one instance at a time, missed slots coalesced, a late tick never dropped), and the loops'
transactions take turns at the database (spotrun.daemon.dbturns). Checked with the daemon's
real loops over a real SQLite database, through the engine `build_context` gives the daemon,
and the real scheduler on short real intervals; the one injected part is a pass that blocks
on a threading.Event for as long as a test holds it.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from apscheduler.events import EVENT_JOB_EXECUTED

from spotrun.config import load_settings
from spotrun.daemon.app import build_context
from spotrun.daemon.dbturns import TurnLock, turn_lock
from spotrun.daemon.heartbeats import HeartbeatLoop, LivenessLoop
from spotrun.daemon.price_loop import PriceLoop
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


class Slots:
    """The run time the scheduler ran each tick of one loop for, and when it started."""

    def __init__(self, runner: Runner, name: str) -> None:
        self.ran: list[tuple[datetime, datetime]] = []   # (scheduled, started)
        runner.scheduler.add_listener(self._on_executed, EVENT_JOB_EXECUTED)
        self.name = name

    def _on_executed(self, event) -> None:
        if event.job_id == self.name and event.retval is not None:
            self.ran.append((event.scheduled_run_time, event.retval))


class Slow:
    """A loop whose second tick waits until released."""

    name = "slow"

    def __init__(self) -> None:
        self.ticks = 0
        self.release = threading.Event()

    def tick(self, now) -> None:
        """Hold the second pass."""
        self.ticks += 1
        if self.ticks == 2 and not self.release.wait(60):
            raise RuntimeError("never released")


def _grid_index(slot: datetime, first: datetime, interval_s: float) -> float:
    return (slot - first).total_seconds() / interval_s


def test_a_tick_that_outlasts_its_interval_skips_the_slots_it_missed():
    slow = Slow()
    interval_s = 0.2
    runner = Runner([Scheduled(slow, interval_s)])
    slots = Slots(runner, "slow")
    runner.start()
    try:
        wait_for(lambda: slow.ticks == 2, 30, "the second pass")
        wait_for(lambda: (runner.health.snapshot()["slow"]["running_s"] or 0) > 5 * interval_s,
                 30, "the second pass to outlast five slots")
        slow.release.set()
        wait_for(lambda: len(slots.ran) >= 3, 30, "the pass after the long one")
    finally:
        slow.release.set()
        runner.stop(wait=True)
    first, second, third = (scheduled for scheduled, _ in slots.ran[:3])
    assert _grid_index(second, first, interval_s) == pytest.approx(1.0, abs=1e-3)
    # The slots the long pass outlasted never ran (not queued, not run side by side): the
    # next pass is on the grid, at least five slots on.
    k = _grid_index(third, first, interval_s)
    assert k == pytest.approx(round(k), abs=1e-3) and round(k) >= 1 + 5
    assert runner.errors == 0


def test_a_late_tick_runs_once_for_the_slots_it_missed_and_its_lateness_is_the_lag():
    # The scheduler held back (paused) past two slots: the last of them runs on resuming, more
    # than the old misfire_grace_time (1 s) late, never dropped and never followed by the other.
    slow = Slow()
    slow.ticks = 2    # no held pass: every tick is quick
    interval_s = 2.0
    runner = Runner([Scheduled(slow, interval_s)])
    slots = Slots(runner, "slow")
    runner.start()
    try:
        wait_for(lambda: len(slots.ran) >= 1, 30, "the first pass")
        runner.scheduler.pause()
        # Overdue against slot 1: slots 1 and 2 missed, slot 2 by more than a second.
        wait_for(lambda: runner.health.snapshot()["slow"]["overdue_s"] > interval_s + 1.2, 30,
                 "the loop to miss two slots")
        resumed = datetime.now(timezone.utc)
        runner.scheduler.resume()
        wait_for(lambda: sum(started >= resumed for _, started in slots.ran) >= 2, 30,
                 "two passes after the resume")
    finally:
        runner.stop(wait=True)
    first = slots.ran[0][0]
    after = [(scheduled, started) for scheduled, started in slots.ran if started >= resumed]
    assert len(slots.ran) == 1 + len(after)    # nothing ran while held
    (late_slot, late_start), (next_slot, _) = after[:2]
    # One pass for the slots missed while held: the last of them, late by over a second ...
    assert _grid_index(late_slot, first, interval_s) == pytest.approx(2.0, abs=1e-3)
    lag_s = (late_start - late_slot).total_seconds()
    assert lag_s > 1.0
    assert runner.health.snapshot()["slow"]["lag_max_s"] == pytest.approx(lag_s, abs=1e-3)
    # ... then the next slot of the grid, not the other missed one.
    assert _grid_index(next_slot, first, interval_s) == pytest.approx(3.0, abs=1e-3)
    assert runner.errors == 0


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

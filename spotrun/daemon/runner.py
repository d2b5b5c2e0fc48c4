"""The runner owns the loops: each loop's tick(now) runs on its own thread, on its interval.

One thread per loop, so a long pass of one loop (a scheduling pass over a thousand queued
jobs, a slow provider call) never holds another loop's pass back: heartbeats, reconcile and
the notices keep their intervals whatever the scheduler does. The loops share the database by
taking turns, one transaction at a time (spotrun.daemon.dbturns, installed on the daemon's
engine by app.build_context), so a transaction that re-reads a row and writes it is atomic
against the other loops. A loop that raises is logged and runs again at its next slot. Each
loop's slots are its own interval grid, anchored at start: the first pass runs at once, a
tick that outlasts its interval skips the slots it missed (one pass, never a burst), and a
due tick always runs, however late (never dropped). Every tick's duration and lag go into
`health` (spotrun.daemon.health), on the injected clock.
"""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from spotrun.daemon.context import Clock, SystemClock
from spotrun.daemon.dbturns import waited_s
from spotrun.daemon.health import LoopHealth

# A waiting loop looks at its clock at least this often (a test's ManualClock moves by hand).
MAX_WAIT_S = 1.0


class Loop(Protocol):
    """A daemon loop: one idempotent pass per tick."""

    name: str

    def tick(self, now: Any) -> None:
        """Do one pass; safe to crash in and to repeat."""


@dataclass
class Scheduled:
    """A loop and how often it runs."""

    loop: Loop
    interval_s: float


class Runner:
    """Runs loops until stopped; `run_once` runs each loop one time (tests, --once)."""

    def __init__(self, loops: list[Scheduled], clock: Clock | None = None,
                 health: LoopHealth | None = None) -> None:
        self.loops = loops
        self.clock = clock or SystemClock()
        self.health = health or LoopHealth(self.clock)
        self.log = structlog.get_logger("spotrun.daemon.runner")
        self._stop = threading.Event()
        self._wake = threading.Condition()
        self._threads: list[threading.Thread] = []
        self.reload_requested = threading.Event()
        self.errors = 0
        self._errors_lock = threading.Lock()

    def run_tick(self, item: Scheduled, *, after_stop: bool = False) -> None:
        """One tick of item's loop, timed; an exception is logged and counted, not raised.
        A stopped runner's threads tick no more; `run_once` still does (`after_stop`)."""
        if self._stop.is_set() and not after_stop:
            return
        loop = item.loop
        started = self.health.begin(loop.name)
        waited = waited_s()
        failed = False
        try:
            loop.tick(self.clock.now())
        except Exception as exc:  # the runner catches and logs; the next slot runs again
            failed = True
            with self._errors_lock:
                self.errors += 1
            self.log.exception("loop_failed", loop=loop.name, error=str(exc))
        finally:
            took = self.health.end(loop.name, started, failed=failed)
            if took > item.interval_s:
                # What an operator needs to tell a slow pass from one kept waiting.
                self.log.warning("loop_slow", loop=loop.name, took_s=round(took, 3),
                                 interval_s=item.interval_s,
                                 db_wait_s=round(waited_s() - waited, 3))

    def anchor(self) -> None:
        """Start every loop's slot grid now (lag is measured against it)."""
        self.health.anchor({item.loop.name: item.interval_s for item in self.loops})

    def run_once(self) -> None:
        """Run every loop once, in order, on the calling thread (also after stop: a last
        pass that books the final seconds)."""
        for item in self.loops:
            self.run_tick(item, after_stop=True)

    def start(self) -> None:
        """Start the loops in the background: one thread each, first pass at once."""
        if self._threads:
            return
        self.anchor()
        for item in self.loops:
            thread = threading.Thread(target=self._work, args=(item,), daemon=True,
                                      name=f"spotrun-loop-{item.loop.name}")
            self._threads.append(thread)
        for thread in self._threads:
            thread.start()
        self.log.info("daemon_started", loops=[i.loop.name for i in self.loops])

    def _work(self, item: Scheduled) -> None:
        """One loop's thread: tick at each due slot until stopped."""
        name = item.loop.name
        while True:
            with self._wake:
                if self._stop.is_set():
                    return
                due = self.health.due(name)
                if due is None:   # a health swapped in after start: this loop's grid starts now
                    self.health.anchor({name: item.interval_s})
                    continue
                wait_s = due - self.clock.monotonic()
                if wait_s > 0:
                    self._wake.wait(min(wait_s, MAX_WAIT_S))
                    continue
            self.run_tick(item)

    def wake(self) -> None:
        """Make waiting loops look at the clock now (after a test moved its clock)."""
        with self._wake:
            self._wake.notify_all()

    def stop(self, wait: bool = True) -> None:
        """Stop scheduling; ticks in progress finish first when wait is True."""
        self._stop.set()
        self.wake()
        threads, self._threads = self._threads, []
        if wait:
            for thread in threads:
                thread.join()
        if threads:
            self.log.info("daemon_stopped")

    def serve_forever(self) -> None:
        """Start, then block until SIGTERM/SIGINT; SIGHUP sets reload_requested."""
        stop_flag = threading.Event()

        def on_stop(signum: int, frame: Any) -> None:
            stop_flag.set()

        def on_hup(signum: int, frame: Any) -> None:
            self.reload_requested.set()

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGHUP, on_hup)
        self.start()
        try:
            while not stop_flag.wait(0.5):
                if self.reload_requested.is_set():
                    self.reload_requested.clear()
                    self.log.info("reload_requested")
        finally:
            self.stop(wait=True)

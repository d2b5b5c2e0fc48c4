"""The runner owns the loops: apscheduler calls each loop's tick(now) on its interval.

One worker thread, so loops never race each other on the database; a loop that
raises is logged and runs again next slot; missed slots are skipped, not burst.
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from spotrun.daemon.context import Clock, SystemClock


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

    def __init__(self, loops: list[Scheduled], clock: Clock | None = None) -> None:
        self.loops = loops
        self.clock = clock or SystemClock()
        self.log = structlog.get_logger("spotrun.daemon.runner")
        self._stop = threading.Event()
        self.reload_requested = threading.Event()
        self._scheduler: BackgroundScheduler | None = None
        self.errors = 0

    def _call(self, loop: Loop) -> None:
        if self._stop.is_set():
            return
        try:
            loop.tick(self.clock.now())
        except Exception as exc:  # the runner catches and logs; the next slot runs again
            self.errors += 1
            self.log.exception("loop_failed", loop=loop.name, error=str(exc))

    def run_once(self) -> None:
        """Run every loop once, in order."""
        for item in self.loops:
            self._call(item.loop)

    def start(self) -> None:
        """Start the loops in the background."""
        # A slot skipped because the previous tick still runs is by design (scheduler: errors
        # only); a missed run time is worth a line, as JSON in the daemon's log.
        logging.getLogger("apscheduler.scheduler").setLevel(logging.ERROR)
        logging.getLogger("apscheduler.executors.default").setLevel(logging.WARNING)
        sched = BackgroundScheduler(executors={"default": ThreadPoolExecutor(max_workers=1)},
                                    job_defaults={"coalesce": True, "max_instances": 1,
                                                  "misfire_grace_time": 1})
        for item in self.loops:
            sched.add_job(self._call, IntervalTrigger(seconds=item.interval_s), args=[item.loop],
                          id=item.loop.name, name=item.loop.name, next_run_time=None)
        sched.start()
        self._scheduler = sched
        # First pass at once, then on the intervals.
        for item in self.loops:
            sched.modify_job(item.loop.name, next_run_time=_now_local())
        self.log.info("daemon_started", loops=[i.loop.name for i in self.loops])

    def stop(self, wait: bool = True) -> None:
        """Stop scheduling; a tick in progress finishes first when wait is True."""
        self._stop.set()
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=wait)
            self._scheduler = None
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


def _now_local():
    from datetime import datetime
    return datetime.now().astimezone()

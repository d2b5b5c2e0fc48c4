"""The runner owns the loops: APScheduler calls each loop's tick(now) on its interval.

One BackgroundScheduler, a thread pool with one worker per loop, and one job per loop on an
IntervalTrigger anchored at start (the first pass runs at once). Its job defaults give the
runner's guarantees:

- max_instances=1 and a worker for every loop: a long pass of one loop (a scheduling pass over
  a thousand queued jobs, a slow provider call) never holds another loop's pass back;
- coalesce=True: a tick that outlasts its interval skips the slots it missed (one pass follows,
  never a burst);
- misfire_grace_time=None: a due tick always runs, however late (never dropped).

The loops share the database by taking turns, one transaction at a time
(spotrun.daemon.dbturns, installed on the daemon's engine by app.build_context), so a
transaction that re-reads a row and writes it is atomic against the other loops. A loop that
raises is logged and runs again at its next slot. Every tick's duration goes into `health`
(spotrun.daemon.health) on the injected clock; its lag is the scheduler's, from the job event
that carries the run time the tick was scheduled for. No loop needs a cron trigger; one could
be added to `scheduler` the same way.
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

import structlog
from apscheduler.events import (EVENT_JOB_EXECUTED, EVENT_JOB_MAX_INSTANCES, EVENT_JOB_SUBMITTED,
                                JobExecutionEvent, JobSubmissionEvent)
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from spotrun.daemon.context import Clock, SystemClock
from spotrun.daemon.dbturns import waited_s
from spotrun.daemon.health import LoopHealth


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
        # Made here, started by start(): its listeners (and a test's) see the first tick.
        self.scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(max_workers=max(1, len(loops)))},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
            timezone=timezone.utc)
        self.scheduler.add_listener(self._on_executed, EVENT_JOB_EXECUTED)
        self.scheduler.add_listener(self._on_scheduled,
                                    EVENT_JOB_SUBMITTED | EVENT_JOB_MAX_INSTANCES)
        self._stop = threading.Event()
        self.reload_requested = threading.Event()
        self.errors = 0
        self._errors_lock = threading.Lock()

    def run_tick(self, item: Scheduled, *, after_stop: bool = False) -> bool:
        """One tick of item's loop, timed; an exception is logged and counted, not raised.
        A stopped runner's scheduler ticks no more; `run_once` still does (`after_stop`).
        Whether it ran."""
        if self._stop.is_set() and not after_stop:
            return False
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
        return True

    def run_once(self) -> None:
        """Run every loop once, in order, on the calling thread (also after stop: a last
        pass that books the final seconds)."""
        for item in self.loops:
            self.run_tick(item, after_stop=True)

    def start(self) -> None:
        """Start the loops in the background: first pass at once, then on their intervals."""
        if self.scheduler.running or self._stop.is_set():
            return
        # A slot skipped while the loop's previous tick still runs is by design, and each tick
        # is in the health figures: the scheduler's own lines would only repeat them.
        logging.getLogger("apscheduler.scheduler").setLevel(logging.ERROR)
        logging.getLogger("apscheduler.executors").setLevel(logging.WARNING)
        self.health.track({item.loop.name: item.interval_s for item in self.loops})
        anchor = datetime.now(timezone.utc)   # every loop's slot grid starts here
        for item in self.loops:
            self.scheduler.add_job(
                self._fire, IntervalTrigger(seconds=item.interval_s, start_date=anchor,
                                            timezone=timezone.utc),
                args=[item], id=item.loop.name, name=item.loop.name, next_run_time=anchor)
        self.scheduler.start()
        self.log.info("daemon_started", loops=[i.loop.name for i in self.loops])

    def _fire(self, item: Scheduled) -> datetime | None:
        """The scheduler's job for item: one tick; when it started (for its lag), None if the
        runner was stopped."""
        # The pool's threads serve any loop: named for the loop of the tick they run, so a
        # database turn held too long names it (spotrun.daemon.dbturns).
        threading.current_thread().name = f"spotrun-loop-{item.loop.name}"
        started_at = datetime.now(timezone.utc)
        return started_at if self.run_tick(item) else None

    def _on_executed(self, event: JobExecutionEvent) -> None:
        """A tick ended: how late it started against the run time it was scheduled for."""
        if event.retval is not None:
            self.health.lag(event.job_id,
                            (event.retval - event.scheduled_run_time).total_seconds())

    def _on_scheduled(self, event: JobSubmissionEvent) -> None:
        """The scheduler moved a loop's next run time on (a tick submitted, or a slot skipped
        while the loop's tick still runs): health shows a loop overdue past it."""
        job = self.scheduler.get_job(event.job_id)
        if job is not None and job.next_run_time is not None:
            self.health.next_slot(event.job_id, (job.next_run_time
                                                 - datetime.now(timezone.utc)).total_seconds())

    def stop(self, wait: bool = True) -> None:
        """Stop scheduling; ticks in progress finish first when wait is True."""
        self._stop.set()
        if self.scheduler.running:
            self.scheduler.shutdown(wait=wait)
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

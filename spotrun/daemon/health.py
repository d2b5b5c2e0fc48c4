"""The daemon's own health: per-loop tick durations and lag, as the runner observes them.

Each tick's duration goes into a one-minute window (p50/p99, nearest rank) and into a
prometheus_client Histogram (`spotrun_daemon_loop_seconds`, cumulative since the start). The
slots are the scheduler's (APScheduler, spotrun.daemon.runner), not this module's: a tick's lag is
how late it started against the run time the scheduler ran it for, and a loop is overdue when
the scheduler's next run time for it has passed without a start. Health only records what the
runner tells it.

The daemon writes a snapshot into the `meta` table (key `daemon_health`) from its own thread at
most every PUBLISH_INTERVAL_S, where `spotrun daemon --check` and `/metrics` read it.
"""

from __future__ import annotations

import json
import math
import threading
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

from prometheus_client import CollectorRegistry, Histogram

from spotrun.clock import Clock, SystemClock
from spotrun.daemon.lease import live_holder
from spotrun.db import Meta, session

WINDOW_S = 60.0
# Upper bounds (seconds) of the histogram's buckets; +Inf is implied.
BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
HEALTH_KEY = "daemon_health"
PUBLISH_INTERVAL_S = 5.0
FIRST_PUBLISH_S = 1.0          # the first snapshot soon after start, so --check has figures


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank q-quantile (0 < q <= 1) of values; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass
class _Loop:
    interval_s: float
    durations: deque = field(default_factory=deque)  # (end, duration_s)
    lags: deque = field(default_factory=deque)       # (at, lag_s)
    errors: int = 0
    lag_s: float | None = None
    running_since: float | None = None
    next_due: float | None = None                    # the scheduler's next run time


class LoopHealth:
    """Tick durations and lag per loop (thread-safe: the workers record, a publisher reads)."""

    def __init__(self, clock: Clock | None = None, window_s: float = WINDOW_S) -> None:
        self.clock = clock or SystemClock()
        self.window_s = window_s
        self._loops: dict[str, _Loop] = {}
        self._lock = threading.Lock()
        # A registry of its own: the daemon's figures, never the process's default collectors.
        self._seconds = Histogram("spotrun_daemon_loop_seconds", "Duration of loop ticks (s).",
                                  ["loop"], buckets=BUCKETS_S, registry=CollectorRegistry())

    def track(self, intervals: dict[str, float]) -> None:
        """The loops the runner schedules, with their intervals; figures so far are kept."""
        with self._lock:
            for name, interval_s in intervals.items():
                self._loop(name).interval_s = interval_s

    def _loop(self, name: str) -> _Loop:
        st = self._loops.get(name)
        if st is None:
            st = self._loops[name] = _Loop(0.0)
            self._seconds.labels(loop=name)   # a loop's histogram shows before its first tick
        return st

    def begin(self, name: str) -> float:
        """A tick of name starts: its start time (monotonic)."""
        now = self.clock.monotonic()
        with self._lock:
            self._loop(name).running_since = now
        return now

    def end(self, name: str, started: float, *, failed: bool = False) -> float:
        """The tick of name that began at started has ended: its duration (seconds)."""
        now = self.clock.monotonic()
        took = max(0.0, now - started)
        self._seconds.labels(loop=name).observe(took)
        with self._lock:
            st = self._loop(name)
            st.durations.append((now, took))
            st.errors += int(failed)
            st.running_since = None
            self._trim(st, now)
        return took

    def lag(self, name: str, lag_s: float) -> None:
        """A tick of name started lag_s after the slot the scheduler ran it for."""
        now = self.clock.monotonic()
        with self._lock:
            st = self._loop(name)
            st.lag_s = max(0.0, lag_s)
            st.lags.append((now, st.lag_s))
            self._trim(st, now)

    def next_slot(self, name: str, in_s: float) -> None:
        """The scheduler's next run of name is in_s seconds from now."""
        with self._lock:
            self._loop(name).next_due = self.clock.monotonic() + in_s

    def _trim(self, st: _Loop, now: float) -> None:
        for window in (st.durations, st.lags):
            while window and window[0][0] < now - self.window_s:
                window.popleft()

    def _histograms(self) -> dict[str, dict[str, Any]]:
        """Per loop: the histogram's cumulative bucket counts, sum and count."""
        out: dict[str, dict[str, Any]] = {}
        for metric in self._seconds.collect():
            for sample in metric.samples:
                h = out.setdefault(sample.labels["loop"], {"le": list(BUCKETS_S),
                                                           "cumulative": [], "sum_s": 0.0,
                                                           "count": 0})
                if sample.name.endswith("_bucket"):
                    h["cumulative"].append(int(sample.value))
                elif sample.name.endswith("_sum"):
                    h["sum_s"] = _r(sample.value)
                elif sample.name.endswith("_count"):
                    h["count"] = int(sample.value)
        return out

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Per loop: interval, ticks and p50/p99/max over the window, lag, histogram."""
        now = self.clock.monotonic()
        out: dict[str, dict[str, Any]] = {}
        with self._lock:
            histograms = self._histograms()
            for name, st in self._loops.items():
                self._trim(st, now)
                took = [d for _, d in st.durations]
                lags = [lag for _, lag in st.lags]
                overdue = 0.0 if st.running_since is not None or st.next_due is None \
                    else max(0.0, now - st.next_due)
                out[name] = {
                    "interval_s": st.interval_s, "ticks": len(took),
                    "p50_s": _r(percentile(took, 0.50)), "p99_s": _r(percentile(took, 0.99)),
                    "max_s": _r(max(took) if took else None),
                    "lag_s": _r(st.lag_s), "lag_max_s": _r(max(lags) if lags else None),
                    "overdue_s": _r(overdue),
                    "running_s": _r(None if st.running_since is None
                                    else now - st.running_since),
                    "errors": st.errors, "histogram": histograms[name]}
        return out


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 6)


# ---------------------------------------------------------------- the record in `meta`

def health_record(health: LoopHealth, owner: str | None) -> dict[str, Any]:
    """What the daemon writes: who, when (UTC), the window, and every loop's figures."""
    return {"owner": owner, "written_at": datetime.now(timezone.utc).isoformat(),
            "window_s": health.window_s, "loops": health.snapshot()}


def write_health(engine: Any, record: dict[str, Any]) -> None:
    """Upsert the health record in `meta` (one row; the daemon is its one writer)."""
    with session(engine) as s:
        row = s.get(Meta, HEALTH_KEY)
        if row is None:
            row = Meta(key=HEALTH_KEY, value="")
        row.value = json.dumps(record)
        s.add(row)
        s.commit()


def clear_health(engine: Any, owner: str | None) -> None:
    """Remove the record at a clean stop (only this daemon's own)."""
    with session(engine) as s:
        row = s.get(Meta, HEALTH_KEY)
        if row is not None and _parse(row.value).get("owner") == owner:
            s.delete(row)
            s.commit()


def read_health(engine: Any) -> dict[str, Any] | None:
    """The last record a daemon wrote, or None."""
    with session(engine) as s:
        row = s.get(Meta, HEALTH_KEY)
        return _parse(row.value) if row is not None else None


def live_loop_health(engine: Any, now: datetime | None = None) -> dict[str, Any] | None:
    """The loops of the daemon holding the lease now (None: no live daemon or no record).

    A record left by a daemon that stopped or died is not today's health; `/metrics` reads this.
    """
    rec = read_health(engine)
    holder = live_holder(engine, now)
    if rec is None or holder is None or holder.owner != rec.get("owner"):
        return None
    return rec.get("loops") or None


def _parse(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class HealthPublisher:
    """Writes the runner's health into `meta` every interval_s from its own thread."""

    def __init__(self, engine: Any, health: Callable[[], LoopHealth], owner: str | None,
                 log: Any, interval_s: float = PUBLISH_INTERVAL_S,
                 first_s: float = FIRST_PUBLISH_S) -> None:
        self.engine, self.health, self.owner, self.log = engine, health, owner, log
        self.interval_s, self.first_s = interval_s, first_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "HealthPublisher":
        """Start publishing."""
        self._thread = threading.Thread(target=self._run, name="spotrun-health", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        wait = self.first_s
        while not self._stop.wait(wait):
            self.publish()
            wait = self.interval_s

    def publish(self) -> None:
        """One write; a failure is logged and the next interval tries again."""
        try:
            write_health(self.engine, health_record(self.health(), self.owner))
        except Exception as exc:  # a locked or unreachable database must not stop the daemon
            self.log.warning("health_write_failed", error=str(exc))

    def stop(self, clear: bool = True) -> None:
        """Stop publishing; with clear, remove the record (a clean stop)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if clear:
            try:
                clear_health(self.engine, self.owner)
            except Exception as exc:  # the lease's release still matters more
                self.log.warning("health_clear_failed", error=str(exc))

"""The daemon's own health: per-loop tick durations and lag, kept by the runner.

Each tick's duration goes into a one-minute window (p50/p99, nearest rank) and into a
cumulative histogram (Prometheus `spotrun_daemon_loop_seconds`). A tick's lag is how late it
started against its slot. The slot is `due()`: the first time of the loop's interval grid
(anchored at the runner's start) that is at or after the end of the loop's previous tick and
after the slot that tick served; the runner starts each loop's next tick then (one thread per
loop), so lag is what held a thread back (its turn at the database, the CPU). A loop whose own
tick outlasts its interval skips the slots it missed (by design) and shows no lag for them.

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

from spotrun.clock import Clock, SystemClock

WINDOW_S = 60.0
# Upper bounds (seconds) of the histogram's buckets; +Inf is implied.
BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
HEALTH_KEY = "daemon_health"
PUBLISH_INTERVAL_S = 5.0
FIRST_PUBLISH_S = 1.0          # the first snapshot soon after start, so --check has figures
_GRID_EPS_S = 1e-6


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank q-quantile (0 < q <= 1) of values; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass
class _Loop:
    interval_s: float
    anchor: float | None = None                 # monotonic time of slot 0
    window: deque = field(default_factory=deque)  # (end, duration_s, lag_s | None)
    buckets: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS_S) + 1))
    sum_s: float = 0.0
    count: int = 0
    errors: int = 0
    lag_s: float | None = None
    running_since: float | None = None
    last_start: float | None = None
    last_end: float | None = None

    def due(self) -> float | None:
        """The slot of the next tick: the first grid time at or after the last tick's end,
        and past the slot that tick started in (a zero-length tick does not run twice)."""
        if self.anchor is None:
            return None
        if self.last_end is None or self.interval_s <= 0:
            return self.anchor if self.last_end is None else self.last_end
        k = math.ceil((self.last_end - self.anchor) / self.interval_s - _GRID_EPS_S)
        if self.last_start is not None:
            served = math.floor((self.last_start - self.anchor) / self.interval_s + _GRID_EPS_S)
            k = max(k, served + 1)
        return self.anchor + max(k, 0) * self.interval_s


class LoopHealth:
    """Tick durations and lag per loop (thread-safe: the worker records, a publisher reads)."""

    def __init__(self, clock: Clock | None = None, window_s: float = WINDOW_S) -> None:
        self.clock = clock or SystemClock()
        self.window_s = window_s
        self._loops: dict[str, _Loop] = {}
        self._lock = threading.Lock()

    def anchor(self, intervals: dict[str, float], at: float | None = None) -> None:
        """Start each loop's slot grid now (the runner's start); figures so far are kept."""
        at = self.clock.monotonic() if at is None else at
        with self._lock:
            for name, interval_s in intervals.items():
                st = self._loops.setdefault(name, _Loop(interval_s))
                st.interval_s, st.anchor = interval_s, at
                st.last_start = st.last_end = None

    def due(self, name: str) -> float | None:
        """When name's next tick is due (monotonic; None before the grid is anchored)."""
        with self._lock:
            st = self._loops.get(name)
            return None if st is None else st.due()

    def begin(self, name: str) -> float:
        """A tick of name starts: its start time (monotonic), its lag recorded."""
        now = self.clock.monotonic()
        with self._lock:
            st = self._loops.setdefault(name, _Loop(0.0))
            due = st.due()
            st.lag_s = None if due is None else max(0.0, now - due)
            st.running_since = now
            st.last_start = now
        return now

    def end(self, name: str, started: float, *, failed: bool = False) -> float:
        """The tick of name that began at started has ended: its duration (seconds)."""
        now = self.clock.monotonic()
        took = max(0.0, now - started)
        with self._lock:
            st = self._loops[name]
            st.window.append((now, took, st.lag_s))
            st.buckets[_bucket(took)] += 1
            st.sum_s += took
            st.count += 1
            st.errors += int(failed)
            st.running_since = None
            st.last_end = now
            self._trim(st, now)
        return took

    def _trim(self, st: _Loop, now: float) -> None:
        while st.window and st.window[0][0] < now - self.window_s:
            st.window.popleft()

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Per loop: interval, ticks and p50/p99/max over the window, lag, histogram."""
        now = self.clock.monotonic()
        out: dict[str, dict[str, Any]] = {}
        with self._lock:
            for name, st in self._loops.items():
                self._trim(st, now)
                took = [d for _, d, _ in st.window]
                lags = [lag for _, _, lag in st.window if lag is not None]
                due = st.due()
                overdue = 0.0 if st.running_since is not None or due is None \
                    else max(0.0, now - due)
                cumulative, n = [], 0
                for c in st.buckets:
                    n += c
                    cumulative.append(n)
                out[name] = {
                    "interval_s": st.interval_s, "ticks": len(took),
                    "p50_s": _r(percentile(took, 0.50)), "p99_s": _r(percentile(took, 0.99)),
                    "max_s": _r(max(took) if took else None),
                    "lag_s": _r(st.lag_s), "lag_max_s": _r(max(lags) if lags else None),
                    "overdue_s": _r(overdue),
                    "running_s": _r(None if st.running_since is None
                                    else now - st.running_since),
                    "errors": st.errors,
                    "histogram": {"le": list(BUCKETS_S), "cumulative": cumulative,
                                  "sum_s": _r(st.sum_s), "count": st.count}}
        return out


def _bucket(seconds: float) -> int:
    for i, le in enumerate(BUCKETS_S):
        if seconds <= le:
            return i
    return len(BUCKETS_S)


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 6)


# ---------------------------------------------------------------- the record in `meta`

def health_record(health: LoopHealth, owner: str | None) -> dict[str, Any]:
    """What the daemon writes: who, when (UTC), the window, and every loop's figures."""
    return {"owner": owner, "written_at": datetime.now(timezone.utc).isoformat(),
            "window_s": health.window_s, "loops": health.snapshot()}


def write_health(engine: Any, record: dict[str, Any]) -> None:
    """Upsert the health record in `meta` (one row; the daemon is its one writer)."""
    from spotrun.db import Meta, session
    with session(engine) as s:
        row = s.get(Meta, HEALTH_KEY)
        if row is None:
            row = Meta(key=HEALTH_KEY, value="")
        row.value = json.dumps(record)
        s.add(row)
        s.commit()


def clear_health(engine: Any, owner: str | None) -> None:
    """Remove the record at a clean stop (only this daemon's own)."""
    from spotrun.db import Meta, session
    with session(engine) as s:
        row = s.get(Meta, HEALTH_KEY)
        if row is not None and _parse(row.value).get("owner") == owner:
            s.delete(row)
            s.commit()


def read_health(engine: Any) -> dict[str, Any] | None:
    """The last record a daemon wrote, or None."""
    from spotrun.db import Meta, session
    with session(engine) as s:
        row = s.get(Meta, HEALTH_KEY)
        return _parse(row.value) if row is not None else None


def live_loop_health(engine: Any, now: datetime | None = None) -> dict[str, Any] | None:
    """The loops of the daemon holding the lease now (None: no live daemon or no record).

    A record left by a daemon that stopped or died is not today's health; `/metrics` reads this.
    """
    from spotrun.daemon.lease import live_holder
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

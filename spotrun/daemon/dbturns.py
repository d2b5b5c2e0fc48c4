"""The daemon's database transactions take turns, first come first served.

The loops run side by side, each on a worker of the runner's scheduler
(spotrun.daemon.runner), so two loops may reach for the database at once. A connection checked
out of the daemon's engine is held for one transaction (a session's work up to its commit,
rollback or close), and only one thread holds one at a time; the others queue in arrival
order. Two things follow:

- a transaction that re-reads a row and then writes it (every state change in the loops does:
  `s.get`, the transition table, commit) is atomic against the other loops, on SQLite and on
  PostgreSQL alike, so loops that share a fact never lose each other's updates;
- a loop writing in a tight run of short transactions cannot starve another one: SQLite's own
  busy handler retries after sleeping and can lose every race for the write lock until its
  busy timeout ("database is locked"); here the waiter is next in line.

Only the daemon's engine takes turns (app.build_context). The CLI and the dashboard are other
processes or engines, as before: SQLite's busy timeout and the loops' conditional updates
cover them. A thread that waits longer than the busy timeout gets one DatabaseError naming
the thread that held the database, and its loop runs again at its next slot.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

from spotrun.errors import DatabaseError

_HELD = "spotrun_turn"   # set on a pooled connection's record while it holds the turn
_WAITED = threading.local()   # per thread: seconds spent queued for the turn, in total
_LOCKS: "weakref.WeakKeyDictionary[Engine, TurnLock]" = weakref.WeakKeyDictionary()


class TurnLock:
    """A FIFO lock, re-entrant per thread (a nested session on the same thread goes on)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._owner: int | None = None
        self._owner_name = ""
        self._depth = 0
        self._since = 0.0
        self._waiters: deque[tuple[int, str, threading.Event]] = deque()
        self.waits = 0   # how many acquisitions had to queue (for tests and figures)

    def acquire(self, timeout_s: float | None = None) -> bool:
        """Take the turn (waiting behind earlier arrivals); False after timeout_s."""
        me, name = threading.get_ident(), threading.current_thread().name
        with self._mutex:
            if self._owner == me:
                self._depth += 1
                return True
            if self._owner is None and not self._waiters:
                self._take(me, name)
                return True
            ready = threading.Event()
            entry = (me, name, ready)
            self._waiters.append(entry)
            self.waits += 1
        queued = time.monotonic()
        try:
            if ready.wait(timeout_s):
                return True
            with self._mutex:
                if self._owner == me:          # handed over as the wait ran out
                    return True
                self._waiters.remove(entry)
                return False
        finally:
            _WAITED.s = waited_s() + time.monotonic() - queued

    def release(self) -> None:
        """Give the turn back; the longest waiter gets it next."""
        with self._mutex:
            if self._owner is None:
                return
            self._depth -= 1
            if self._depth > 0:
                return
            if self._waiters:
                me, name, ready = self._waiters.popleft()
                self._take(me, name)
                ready.set()
            else:
                self._owner = None

    def _take(self, me: int, name: str) -> None:
        self._owner, self._owner_name, self._depth = me, name, 1
        self._since = time.monotonic()

    def holder(self) -> tuple[str, float] | None:
        """The holding thread's name and how long it has held the turn (seconds), or None."""
        with self._mutex:
            if self._owner is None:
                return None
            return self._owner_name, time.monotonic() - self._since


def waited_s() -> float:
    """Seconds the calling thread has spent queued for a turn, in total (slow-tick logs)."""
    return getattr(_WAITED, "s", 0.0)


def take_turns(engine: Engine, timeout_s: float) -> TurnLock:
    """Make every connection checkout on engine wait its turn; the lock (one per engine)."""
    existing = _LOCKS.get(engine)
    if existing is not None:
        return existing
    lock = _LOCKS[engine] = TurnLock()

    def on_checkout(dbapi_conn: Any, record: Any, proxy: Any) -> None:
        if not lock.acquire(timeout_s):
            held = lock.holder()
            by = f" by thread {held[0]} for {held[1]:.1f} s" if held else ""
            raise DatabaseError(f"the daemon's database was held{by}; gave up waiting after "
                                f"{timeout_s:g} s", field="db_busy_timeout_s", value=timeout_s,
                                hint="a loop holds one transaction too long; see its log")
        record.info[_HELD] = True

    def on_checkin(dbapi_conn: Any, record: Any) -> None:
        if record is not None and record.info.pop(_HELD, False):
            lock.release()

    event.listen(engine, "checkout", on_checkout)
    event.listen(engine, "checkin", on_checkin)
    return lock


def turn_lock(engine: Engine) -> TurnLock | None:
    """The engine's TurnLock, if it takes turns."""
    return _LOCKS.get(engine)

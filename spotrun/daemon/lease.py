"""One daemon per database: a lease row in Meta, renewed by its holder, free once expired.

Every change is a compare-and-set on the row's whole value, so two daemons can never
both believe they hold it. A second daemon waits; it takes the lease when the holder
stops renewing (expiry), or at once when the holder is a dead process on this same
machine (a SIGKILLed daemon restarted by systemd need not wait out the TTL).
Lease times are wall-clock UTC; daemons on different hosts need synchronised clocks.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any, Callable

import structlog
from sqlalchemy import delete, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, IntegrityError

from spotrun.daemon.context import Clock, SystemClock
from spotrun.db import Meta, session
from spotrun import pids

LEASE_KEY = "daemon_lease"
NO_DAEMON = "no daemon is running"   # how a waiting job's reason starts while none holds it


def boot_id() -> str:
    """This machine's boot id (a pid means nothing on another boot or host)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class LeaseInfo:
    """Who holds the lease and until when (wall clock, ISO-8601 UTC)."""

    owner: str
    host: str
    boot_id: str
    pid: int
    pid_start_ticks: int | None
    acquired_at: str
    expires_at: str

    def to_json(self) -> str:
        """The row's value."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str) -> "LeaseInfo | None":
        """Parse a row's value (None if it is not a lease written by spotrun)."""
        try:
            return cls(**json.loads(raw))
        except (ValueError, TypeError):
            return None

    def expired(self, now: datetime) -> bool:
        """True once the holder has not renewed in time."""
        return datetime.fromisoformat(self.expires_at) <= now

    def holder_frozen_here(self) -> bool:
        """True when the holder is a process on this boot of this host that is stopped
        (SIGSTOP, a debugger): alive, the same process (start ticks), but not running."""
        return (self.host == socket.gethostname() and self.boot_id == boot_id()
                and bool(self.boot_id) and pids.is_alive(self.pid, self.pid_start_ticks)
                and _stopped(self.pid))

    def holder_dead_here(self) -> bool:
        """True when the holder was a process on this boot of this host that no longer runs."""
        return (self.host == socket.gethostname() and self.boot_id == boot_id()
                and bool(self.boot_id) and not pids.is_alive(self.pid, self.pid_start_ticks))


def live_holder(engine: Engine, now: datetime | None = None, *, s: Any = None
                ) -> LeaseInfo | None:
    """The daemon that holds the lease now; None when no row, an expired one, or a dead holder.

    What the CLI asks before telling a user that nothing will pick their job up. A caller
    inside a session passes it (s): a second connection while holding one deadlocks once
    as many threads as the pool has connections do the same (the team server's readers).
    """
    from datetime import timezone
    if s is not None:
        row = s.get(Meta, LEASE_KEY)
    else:
        with session(engine) as own:
            row = own.get(Meta, LEASE_KEY)
    info = LeaseInfo.from_json(row.value) if row is not None else None
    if info is None or info.expired(now or datetime.now(timezone.utc)) \
            or info.holder_dead_here():
        return None
    return info


def no_daemon_reason(home: Any) -> str:
    """Why a queued job does not move while no daemon holds the lease, and how to start one."""
    return (f"{NO_DAEMON} for SPOTRUN_HOME={home}: start one with `spotrun daemon` "
            "(or the systemd unit systemd/spotrun-daemon.service)")


def _stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("T", "t")


class Lease:
    """This process's claim on the database's daemon lease."""

    def __init__(self, engine: Engine, *, ttl_s: float, clock: Clock | None = None,
                 owner: str | None = None, pid: int | None = None) -> None:
        self.engine = engine
        self.ttl_s = ttl_s
        self.clock = clock or SystemClock()
        self.pid = pid if pid is not None else os.getpid()
        self.owner = owner or f"{socket.gethostname()}:{self.pid}:{secrets.token_hex(4)}"
        self._value: str | None = None        # the row value we last wrote
        self._ok_mono: float | None = None    # monotonic time of our last successful write

    def _info(self, acquired_at: str | None = None) -> LeaseInfo:
        now = self.clock.now()
        return LeaseInfo(owner=self.owner, host=socket.gethostname(), boot_id=boot_id(),
                         pid=self.pid, pid_start_ticks=pids.start_ticks(self.pid),
                         acquired_at=acquired_at or now.isoformat(),
                         expires_at=(now + timedelta(seconds=self.ttl_s)).isoformat())

    def holder(self) -> LeaseInfo | None:
        """The current holder as stored (expired or not)."""
        with session(self.engine) as s:
            row = s.get(Meta, LEASE_KEY)
        return LeaseInfo.from_json(row.value) if row is not None else None

    def try_acquire(self) -> bool:
        """Take the lease if it is free, expired, ours, or held by a dead local process."""
        with session(self.engine) as s:
            row = s.get(Meta, LEASE_KEY)
        mono = time.monotonic()
        if row is None:
            info = self._info()
            try:
                with session(self.engine) as s:
                    s.add(Meta(key=LEASE_KEY, value=info.to_json()))
                    s.commit()
            except IntegrityError:
                return False   # another daemon inserted it first
            return self._won(info.to_json(), mono)
        current = LeaseInfo.from_json(row.value)
        if current is not None and current.owner == self.owner:
            return self.renew()
        if current is not None and not current.expired(self.clock.now()) \
                and not current.holder_dead_here():
            return False
        return self._swap(row.value, self._info().to_json(), mono)

    def renew(self) -> bool:
        """Push our expiry forward; False if the lease is no longer ours."""
        if self._value is None:
            return False
        current = LeaseInfo.from_json(self._value)
        mono = time.monotonic()
        new = self._info(acquired_at=current.acquired_at if current else None).to_json()
        if self._swap(self._value, new, mono):
            return True
        self._value = None
        self._ok_mono = None
        return False

    def release(self) -> None:
        """Give the lease up (clean stop), so a waiting daemon takes over at once."""
        if self._value is None:
            return
        with self.engine.begin() as conn:
            conn.execute(delete(Meta).where(Meta.key == LEASE_KEY, Meta.value == self._value))
        self._value = None
        self._ok_mono = None

    def held(self) -> bool:
        """True while our last successful write is younger than the TTL (act only then)."""
        return self._ok_mono is not None and time.monotonic() - self._ok_mono < self.ttl_s

    def _swap(self, old: str, new: str, mono: float) -> bool:
        with self.engine.begin() as conn:
            res = conn.execute(update(Meta).where(Meta.key == LEASE_KEY, Meta.value == old)
                               .values(value=new).execution_options(synchronize_session=False))
        return self._won(new, mono) if res.rowcount == 1 else False

    def _won(self, value: str, mono: float) -> bool:
        self._value = value
        self._ok_mono = mono
        return True


def wait_for_lease(lease: Lease, *, poll_s: float, stop: threading.Event,
                   log: Any = None) -> bool:
    """Block until the lease is ours (True) or stop is set (False); logs who holds it."""
    log = log or structlog.get_logger("spotrun.daemon.lease")
    told = False
    while not stop.is_set():
        try:
            if lease.try_acquire():
                log.info("lease_acquired", owner=lease.owner)
                return True
        except DBAPIError as exc:   # database busy or away: try again
            log.warning("lease_check_failed", error=str(exc).splitlines()[0])
            _break_frozen_holder(lease, log)
        if not told:
            h = lease.holder()
            log.info("lease_waiting", holder=h.owner if h else None,
                     expires_at=h.expires_at if h else None)
            told = True
        stop.wait(poll_s)
    return False


def _break_frozen_holder(lease: Lease, log: Any) -> bool:
    """Kill an expired lease holder frozen on this host (it may hold SQLite's write lock).

    A stopped process keeps its locks, so nobody could ever write again; its lease has
    expired, so it must not act any more anyway (woken, it would find the lease lost and
    exit 1). SIGKILL frees the lock; the killed daemon's instances are reconciled as after
    any crash. Only the exact process named by the lease (pid and start time) is touched.
    """
    try:
        h = lease.holder()
    except DBAPIError:
        return False
    if h is None or h.owner == lease.owner or not h.expired(lease.clock.now()) \
            or not h.holder_frozen_here():
        return False
    try:
        os.kill(h.pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    log.warning("lease_holder_killed", holder=h.owner, pid=h.pid, expires_at=h.expires_at,
                reason="expired lease holder is frozen (stopped) and blocks the database")
    return True


class LeaseKeeper:
    """A thread that renews the lease; calls on_lost once if another daemon took it."""

    def __init__(self, lease: Lease, *, interval_s: float,
                 on_lost: Callable[[], None], log: Any = None) -> None:
        self.lease = lease
        self.interval_s = interval_s
        self.on_lost = on_lost
        self.log = log or structlog.get_logger("spotrun.daemon.lease")
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)

    def start(self) -> "LeaseKeeper":
        """Renew in the background."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop renewing (the caller releases the lease)."""
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                ok = self.lease.renew()
            except DBAPIError as exc:
                # The database is away: keep trying; held() turns False after the TTL.
                self.log.warning("lease_renew_failed", error=str(exc))
                continue
            if not ok:
                self.log.error("lease_lost", owner=self.lease.owner)
                self.lost.set()
                self.on_lost()
                return


class LeaseGuard:
    """Wraps a loop so it ticks only while the lease is held (a stale daemon stops acting)."""

    def __init__(self, loop: Any, lease: Lease) -> None:
        self.loop = loop
        self.lease = lease
        self.name = loop.name

    def tick(self, now: Any) -> Any:
        """The loop's tick, or nothing when the lease is not ours."""
        if not self.lease.held():
            return None
        return self.loop.tick(now)

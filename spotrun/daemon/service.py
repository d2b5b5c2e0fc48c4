"""`spotrun daemon` as a service: wait for the lease, run the loops, reload on SIGHUP, stop on SIGTERM.

Signal handlers only set flags; the main thread acts on them. Exit 0 after a clean
stop (lease released, so a waiting daemon takes over at once), 1 if the lease was lost.
"""

from __future__ import annotations

import signal
import threading
from dataclasses import asdict, replace
from datetime import datetime, timezone
from typing import Any

import structlog

from spotrun.config import Settings, load_settings
from spotrun.daemon.app import build_context, build_runner
from spotrun.daemon.context import DaemonContext
from spotrun.daemon.health import HealthPublisher, read_health
from spotrun.daemon.lease import Lease, LeaseKeeper, wait_for_lease
from spotrun.db.engine import make_engine
from spotrun.db.faults import database_error
from spotrun.db.migrations import LATEST
from spotrun.db.probe import probe
from spotrun.errors import SpotrunError
from spotrun.heap import settle_startup_heap

# Read by the loops on every tick (or at a runner restart): safe to change while running.
RELOADABLE = ("daemon", "agent", "budgets")


class Flags:
    """Set by signal handlers, read by the main loop."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.reload = threading.Event()


def _install(flags: Flags) -> None:
    def on_stop(signum: int, frame: Any) -> None:
        flags.stop.set()

    def on_hup(signum: int, frame: Any) -> None:
        flags.reload.set()

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGHUP, on_hup)


def reload_settings(ctx: DaemonContext) -> tuple[list[str], list[str]]:
    """Re-read spotrun.toml into ctx; returns (changed keys applied, changed keys ignored)."""
    new = load_settings(ctx.settings.home)
    old_d, new_d = asdict(ctx.settings), asdict(new)
    applied, ignored = [], []
    for top in new_d:
        if new_d[top] == old_d[top]:
            continue
        keys = [f"{top}.{k}" for k in new_d[top] if new_d[top][k] != old_d[top][k]] \
            if isinstance(new_d[top], dict) else [top]
        (applied if top in RELOADABLE else ignored).extend(keys)
    ctx.settings = replace(ctx.settings, **{k: getattr(new, k) for k in RELOADABLE})
    return applied, ignored


def serve(settings: Settings) -> int:
    """Run until SIGTERM/SIGINT; the exit status for the process."""
    flags = Flags()
    _install(flags)
    log = structlog.get_logger("spotrun.daemon")
    ctx = build_context(settings)
    settle_startup_heap()   # imports and the context: kept for the process's life
    # The lease and the health record have an engine of their own, outside the loops' turns
    # at the database (dbturns): a loop's long transaction never delays a renewal.
    own = make_engine(settings.database_url, busy_timeout_s=settings.db_busy_timeout_s,
                      check_file=False)
    try:
        return _serve(settings, ctx, own, flags, log)
    finally:
        own.dispose()


def _serve(settings: Settings, ctx: DaemonContext, own: Any, flags: Flags,
           log: Any) -> int:
    """serve() once the engines are open: lease, loops, reloads, a clean stop."""
    d = settings.daemon
    lease = Lease(own, ttl_s=d.lease_ttl_s, clock=ctx.clock)
    if not wait_for_lease(lease, poll_s=lease_poll_s(settings), stop=flags.stop, log=log):
        log.info("daemon_stopped", reason="stopped while waiting for the lease")
        return 0
    if lead(ctx, lease, own, flags, log):
        log.error("daemon_exit", reason="lease lost to another daemon")
        return 1
    log.info("daemon_exit", reason="stopped")
    return 0


def lease_poll_s(settings: Settings) -> float:
    """How often a waiting daemon asks for the lease (at most 1 s, so takeover is prompt)."""
    return max(min(settings.daemon.lease_renew_interval_s, 1.0), 0.05)


def lead(ctx: DaemonContext, lease: Lease, own: Any, flags: Flags, log: Any) -> bool:
    """Run the loops while lease (just acquired) is ours, until flags.stop or the lease is
    lost; True when lost. A clean stop releases the lease so a waiting daemon takes over."""
    d = ctx.settings.daemon
    keeper = LeaseKeeper(lease, interval_s=d.lease_renew_interval_s, on_lost=lambda: None,
                         log=log).start()
    runner = build_runner(ctx, lease=lease, bounded=True)
    runner.start()
    # Its own thread and engine, so no loop's long pass holds the figures back.
    publisher = HealthPublisher(own, lambda: runner.health, lease.owner, log).start()
    try:
        while not flags.stop.wait(0.2) and not keeper.lost.is_set():
            if flags.reload.is_set():
                flags.reload.clear()
                runner = _reload(ctx, runner, lease, keeper, log)
    finally:
        runner.stop(wait=True)
        keeper.stop()
        publisher.stop(clear=not keeper.lost.is_set())
        if not keeper.lost.is_set():
            lease.release()
    return keeper.lost.is_set()


def _reload(ctx: DaemonContext, runner: Any, lease: Lease, keeper: LeaseKeeper,
            log: Any) -> Any:
    try:
        applied, ignored = reload_settings(ctx)
    except SpotrunError as exc:
        log.error("reload_failed", error=str(exc), field=exc.field)
        return runner
    d = ctx.settings.daemon
    lease.ttl_s = d.lease_ttl_s
    keeper.interval_s = d.lease_renew_interval_s
    # Loops keep nothing that matters across a restart, so new intervals apply by restarting.
    runner.stop(wait=True)
    health = runner.health
    runner = build_runner(ctx, lease=lease, bounded=True)
    runner.health = health   # the histogram counts on across a reload; the slots start anew
    runner.start()
    log.info("reloaded", applied=applied, ignored_need_restart=ignored,
             heartbeat_timeout_s=d.heartbeat_timeout_s)
    return runner


def health(settings: Settings) -> tuple[bool, str, dict[str, Any]]:
    """`spotrun daemon --check`: is a daemon holding this database's lease right now?

    Writes nothing: a broken, locked or newer database is named from a read-only look.
    """
    url = settings.database_url
    look = probe(url, timeout_s=settings.db_busy_timeout_s, latest=LATEST)
    if look.kind == "missing":
        return False, f"no database at {url}", {}
    detail: dict[str, Any] = {"database": url.split("@")[-1],
                              "schema_version": look.schema_version}
    if not look.ok:
        return False, look.message, detail
    try:
        engine = make_engine(url, busy_timeout_s=settings.db_busy_timeout_s)
        try:
            holder = Lease(engine, ttl_s=settings.daemon.lease_ttl_s).holder()
            record = read_health(engine)
        finally:
            engine.dispose()
    except Exception as exc:  # any failure to reach the database is the answer itself
        err = database_error(exc)
        return False, (f"database {err.message}" if err else
                       f"database unreachable: {type(exc).__name__}: {exc}"), detail
    if holder is None:
        return False, "no daemon holds the lease", detail
    detail["lease"] = asdict(holder)
    if holder.expired(datetime.now(timezone.utc)):
        return False, f"lease expired at {holder.expires_at} (daemon {holder.owner} is silent)", \
            detail
    detail.update(_loops_detail(record, holder.owner))
    return True, f"daemon {holder.owner} holds the lease until {holder.expires_at}", detail


def _loops_detail(record: dict[str, Any] | None, owner: str) -> dict[str, Any]:
    """The lease holder's loop figures for --check (none from another, earlier daemon)."""
    if record is None or record.get("owner") != owner:
        return {}
    written = datetime.fromisoformat(record["written_at"])
    loops = {name: {k: v for k, v in figures.items() if k != "histogram"}
             for name, figures in (record.get("loops") or {}).items()}
    return {"loops_written_at": record["written_at"],
            "loops_age_s": round((datetime.now(timezone.utc) - written).total_seconds(), 3),
            "loops_window_s": record.get("window_s"), "loops": loops}

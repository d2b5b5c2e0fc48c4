"""The daemon inside another process (`spotrun server --with-daemon`): a thread that waits
for the lease, runs the loops while it holds it, and waits again if it loses it.

A standalone `spotrun daemon` exits 1 on a lost lease (systemd restarts it). Inside a
server the process must keep serving the API, so a lost lease sends this thread back to
waiting instead: the loops are rebuilt from nothing when it leads again, as after a restart
(loops keep nothing that matters in memory). Several servers on one database therefore
all answer the API while exactly one of them acts on the clouds.
"""

from __future__ import annotations

import threading
from typing import Any

import structlog

from spotrun.config import Settings
from spotrun.daemon.app import build_context
from spotrun.daemon.lease import Lease, wait_for_lease
from spotrun.daemon.service import Flags, lead, lease_poll_s
from spotrun.db.engine import make_engine


class StandbyDaemon:
    """The daemon's loops on a thread of their own, acting only while this process leads."""

    def __init__(self, settings: Settings, log: Any = None) -> None:
        self.settings = settings
        self.log = log or structlog.get_logger("spotrun.daemon")
        self.flags = Flags()
        self.leading = threading.Event()   # set while this process holds the lease
        self.terms = 0                     # how many times it took the lease
        self._thread = threading.Thread(target=self._run, name="standby-daemon", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> "StandbyDaemon":
        """Begin waiting for the lease in the background."""
        self._thread.start()
        return self

    def reload(self) -> None:
        """Re-read the reloadable settings at the next check (what SIGHUP does)."""
        self.flags.reload.set()

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop the loops after the pass in progress and release the lease (if held)."""
        self.flags.stop.set()
        if self._thread.ident is not None:   # started
            self._thread.join(timeout=timeout_s)

    def alive(self) -> bool:
        """True while the thread runs (it ends only on stop() or an unexpected error)."""
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:   # logged, and the API keeps serving: never silent
            self.error = exc
            self.log.exception("daemon_thread_failed", error=type(exc).__name__)

    def _serve(self) -> None:
        settings = self.settings
        ctx = build_context(settings)
        # As in `spotrun daemon`: the lease has an engine of its own, outside the loops' turns.
        own = make_engine(settings.database_url, busy_timeout_s=settings.db_busy_timeout_s,
                          check_file=False)
        try:
            while not self.flags.stop.is_set():
                lease = Lease(own, ttl_s=ctx.settings.daemon.lease_ttl_s, clock=ctx.clock)
                if not wait_for_lease(lease, poll_s=lease_poll_s(ctx.settings),
                                      stop=self.flags.stop, log=self.log):
                    break
                self.terms += 1
                self.leading.set()
                try:
                    lost = lead(ctx, lease, own, self.flags, self.log)
                finally:
                    self.leading.clear()
                if lost:
                    self.log.error("daemon_standby", reason="lease lost to another daemon; "
                                   "waiting to take it again")
        finally:
            self.log.info("daemon_exit", reason="stopped")
            own.dispose()
            ctx.engine.dispose()

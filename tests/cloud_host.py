"""The loop both cloud harnesses share (tests/aws/harness.py, tests/gcp/harness.py): a thread
that polls the fake cloud every poll_s and plays its machines, each an agent process with its
own metadata server; errors in the thread are kept in `errors` for the test to check."""

from __future__ import annotations

import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

from spotrun.config import AgentSettings, DaemonSettings
from spotrun.providers.local.market import procs

# The cloud end-to-end tests' loops: fast enough that a test takes a minute, not an hour.
FAST_DAEMON = DaemonSettings(schedule_interval_s=0.2, reconcile_interval_s=0.2,
                             heartbeat_interval_s=0.2, spend_interval_s=1.0,
                             liveness_interval_s=1.0, heartbeat_timeout_s=120.0)
FAST_AGENT = AgentSettings(heartbeat_interval_s=0.2, notice_poll_interval_s=0.2,
                           log_flush_interval_s=0.5)


class CloudHost:
    """Machines by instance name, the polling thread, and the kill every cloud does alike.

    A subclass polls its cloud in `_tick` and stops a machine's metadata server in `_close`.
    """

    thread_name = "cloud-host"

    def __init__(self, root: Path, env: dict[str, str] | None = None,
                 poll_s: float = 0.1) -> None:
        self.root = root
        self.env = dict(env or {})
        self.poll_s = poll_s
        self.machines: dict[str, Any] = {}
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)

    def machine(self, name: str) -> Any | None:
        """The machine playing an instance, once booted."""
        with self._lock:
            return self.machines.get(name)

    def stop(self) -> None:
        """Stop watching; kill every machine's processes; stop the metadata servers."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        with self._lock:
            names = list(self.machines)
        for name in names:
            self._kill(name)
            self._close(self.machines[name])

    def _close(self, machine: Any) -> None:
        raise NotImplementedError

    def _tick(self) -> None:
        raise NotImplementedError

    def _kill(self, name: str) -> None:
        m = self.machine(name)
        if m is None or m.gone:
            return
        m.gone = True
        procs.signal_instance(name, m.proc.pid, m.ticks, signal.SIGKILL)
        try:
            m.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.errors.append(f"agent of {name} survived SIGKILL")

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception as exc:  # noqa: BLE001 - reported to the test, loop goes on
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(self.poll_s)

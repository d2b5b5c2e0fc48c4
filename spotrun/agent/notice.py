"""Watch the instance for the interruption notice (and the earlier rebalance hint).

Runs on its own thread so a slow store write never delays the notice: with a
fast local market, two market minutes can be a couple of wall seconds. The instance
side (spotrun.agent.imds.InstanceMetadata) is polled: IMDSv2 every interval, or a
metadata server that blocks until the value changes (GCE's wait_for_change) back to back.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import structlog

from spotrun.agent.config import AgentConfig
from spotrun.agent.imds import InstanceMetadata
from spotrun.errors import SpotrunError

log = structlog.get_logger("spotrun.agent")

MAX_POLL_MARKET_S = 12.0     # a 120 s notice then always sees >= 10 polls
MIN_POLL_WALL_S = 0.01


def notice_poll_interval_wall_s(config: AgentConfig) -> float:
    """Wall seconds between polls: the configured market interval, capped at 12 market s."""
    market_s = min(config.notice_poll_interval_s, MAX_POLL_MARKET_S)
    return max(MIN_POLL_WALL_S, market_s / max(config.time_scale, 1e-9))


class NoticeWatcher:
    """Background poller; calls on_notice once for the first instance-action."""

    def __init__(self, imds: InstanceMetadata, interval_s: float,
                 on_notice: Callable[[dict[str, Any]], None],
                 on_rebalance: Callable[[dict[str, Any]], None]) -> None:
        self.imds = imds
        self.interval_s = interval_s
        self.on_notice = on_notice
        self.on_rebalance = on_rebalance
        self.polls = 0
        self.errors = 0
        self.noticed = False
        self.rebalance_seen = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="notice", daemon=True)

    def start(self) -> None:
        """Start polling."""
        self._thread.start()

    def stop(self) -> None:
        """Stop polling and wait for the thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def poll_once(self) -> bool:
        """One poll of both paths; True once the interruption notice has been seen."""
        self.polls += 1
        try:
            action = self.imds.interruption()
            if action is not None:
                self.noticed = True
                self.on_notice(action)
                return True
            if not self.rebalance_seen:
                rebalance = self.imds.rebalance()
                if rebalance is not None:
                    self.rebalance_seen = True
                    self.on_rebalance(rebalance)
        except SpotrunError as exc:
            self.errors += 1
            # Log the first failure and then every 50th, so a dead IMDS does not flood stderr.
            if self.errors == 1 or self.errors % 50 == 0:
                log.warning("imds_poll_failed", error=str(exc), failures=self.errors)
        return False

    def _run(self) -> None:
        while not self._stop.is_set():
            errors = self.errors
            if self.poll_once():
                return
            # A long poll returns on a change or its own timeout: poll again at once, unless
            # it failed (then wait, so a dead metadata server is not hammered).
            if not self.imds.blocks_until_change or self.errors != errors:
                self._stop.wait(self.interval_s)

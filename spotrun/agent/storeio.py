"""The agent's store access: writes retried with back-off, failures logged, never raised.

An agent that crashes on a flaky store write would lose the training run it
guards; a missed heartbeat costs nothing, so writes give up quietly.
"""

from __future__ import annotations

import json
from typing import Any

import structlog
from tenacity import Retrying, stop_after_attempt, wait_exponential

from spotrun.errors import ObjectNotFound
from spotrun.store.base import ObjectStore

log = structlog.get_logger("spotrun.agent")


class Reporter:
    """Retrying writes and tolerant reads against the daemon store."""

    def __init__(self, store: ObjectStore, *, attempts: int = 4, wait_max_s: float = 1.0) -> None:
        self.store = store
        self.attempts = attempts
        self.wait_max_s = wait_max_s
        self.failed_writes = 0

    def put_bytes(self, key: str, data: bytes) -> bool:
        """Write key; True on success, False (logged) after the retries ran out."""
        retry = Retrying(stop=stop_after_attempt(self.attempts), reraise=True,
                         wait=wait_exponential(multiplier=0.05, max=self.wait_max_s))
        try:
            retry(self.store.put_bytes, key, data)
            return True
        except Exception as exc:   # any backend error: log and carry on
            self.failed_writes += 1
            log.error("store_write_failed", key=key, error=str(exc)[:300])
            return False

    def put_json(self, key: str, obj: dict[str, Any]) -> bool:
        """Write obj as JSON at key (see put_bytes)."""
        return self.put_bytes(key, json.dumps(obj, sort_keys=True).encode())

    def read_json(self, key: str) -> dict[str, Any] | None:
        """The JSON object at key; None when missing or not a JSON object. Other errors raise."""
        try:
            raw = self.store.get_bytes(key)
        except ObjectNotFound:
            return None
        try:
            obj = json.loads(raw)
        except ValueError:
            log.warning("store_object_not_json", key=key)
            return None
        return obj if isinstance(obj, dict) else None

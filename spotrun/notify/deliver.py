"""Delivering outbox rows: a worker thread POSTs each with retries, off the daemon's loop thread.

`Deliverer.submit(ids)` only queues; the worker POSTs `{"text": ...}` (Slack's incoming
webhook format, which Mattermost, Rocket.Chat and most chat tools accept too) with
tenacity retries, then marks the row delivered, or schedules its next round.
"""

from __future__ import annotations

import json
import queue
import threading
import urllib.error
import urllib.request
from datetime import timedelta
from typing import Any, Callable

import structlog
from sqlalchemy.engine import Engine
from tenacity import RetryError, retry, stop_after_attempt, wait_exponential

from spotrun.db import session, utcnow
from spotrun.db.outbox import NotifyOutbox

log = structlog.get_logger("spotrun.notify")
Post = Callable[[str, bytes, dict[str, str], float], int]


def http_post(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> int:
    """POST body to url; the HTTP status (an error status raises)."""
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=timeout_s) as r:   # noqa: S310 (http(s) checked)
        return r.status


class Deliverer:
    """One worker thread sending queued outbox rows; never blocks the caller."""

    def __init__(self, engine: Engine, webhooks: dict[str, str], settings: Any,
                 post: Post | None = None) -> None:
        self.engine = engine
        self.webhooks = webhooks
        self.cfg = settings.notify
        self.post = post or http_post
        self._queue: "queue.Queue[int | None]" = queue.Queue()
        self._in_flight: set[int] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, ids: list[int]) -> int:
        """Queue rows not already queued; how many were added."""
        added = 0
        with self._lock:
            for i in ids:
                if i not in self._in_flight:
                    self._in_flight.add(i)
                    self._queue.put(i)
                    added += 1
            if added and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(target=self._run, name="spotrun-notify",
                                                daemon=True)
                self._thread.start()
        return added

    def idle(self) -> bool:
        """True when nothing is queued or being sent."""
        with self._lock:
            return not self._in_flight

    def close(self) -> None:
        """Stop the worker after what it is sending now."""
        self._queue.put(None)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                self._deliver(item)
            except Exception as exc:   # the worker must outlive any one message
                log.error("notify_failed", row=item, error=str(exc)[:300])
            finally:
                with self._lock:
                    self._in_flight.discard(item)

    def _deliver(self, row_id: int) -> None:
        with session(self.engine) as s:
            row = s.get(NotifyOutbox, row_id)
        if row is None or row.delivered_at is not None or row.given_up:
            return
        url = self.webhooks.get(row.webhook)
        body = json.dumps({"text": row.text}).encode()
        headers = {"Content-Type": "application/json",
                   "X-Spotrun-Event-Id": f"{row.event_key}@{row.webhook}",
                   "User-Agent": "spotrun-notify"}
        cfg = self.cfg

        @retry(stop=stop_after_attempt(max(cfg.retry_attempts, 1)),
               wait=wait_exponential(multiplier=cfg.retry_base_s, max=cfg.retry_max_s),
               reraise=False)
        def send() -> int:
            return self.post(url, body, headers, cfg.timeout_s)

        error = ""
        if url is None:
            error = f"no webhook named {row.webhook!r} any more"
        else:
            try:
                send()
            except RetryError as exc:
                error = str(exc.last_attempt.exception())[:300]
        with session(self.engine) as s:
            r = s.get(NotifyOutbox, row_id)
            if not error:
                r.delivered_at = utcnow()
                log.info("notify_sent", alert=r.event, job=r.job_id, webhook=r.webhook)
            else:
                r.rounds += 1
                r.last_error = error
                r.given_up = r.rounds >= cfg.max_rounds or url is None
                # Each failed round waits longer before the next (capped at an hour).
                r.next_try_at = utcnow() + timedelta(seconds=min(3600.0, 5.0 * 2 ** r.rounds))
                log.warning("notify_round_failed", alert=r.event, job=r.job_id,
                            webhook=r.webhook, rounds=r.rounds, given_up=r.given_up,
                            error=error)
            s.add(r)
            s.commit()


__all__ = ["Deliverer", "http_post", "urllib"]

"""The outbox: one row per (event, webhook), unique, so an event is queued once for good.

Detection inserts rows (a second insert of the same key is refused by the unique
constraint, whichever daemon or restart tries it); delivery sets `delivered_at`. A daemon
killed between a successful POST and its commit sends that message again after the
restart (at-least-once at that one point); every POST carries `X-Spotrun-Event-Id` so
a receiver can drop such a repeat.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Callable, Iterable

from sqlalchemy import UniqueConstraint
from sqlmodel import Field, SQLModel, select

from spotrun.db.models import UTCDateTime, utcnow


class NotifyOutbox(SQLModel, table=True):
    """An alert waiting for, or done with, delivery to one webhook."""

    __table_args__ = (UniqueConstraint("event_key", "webhook", name="uq_notify_event_webhook"),)

    id: int | None = Field(default=None, primary_key=True)
    event_key: str = Field(index=True)      # e.g. "job_failed:<job>", "budget_80:<job>:<usd>"
    event: str                              # one of spotrun.notify.EVENTS
    job_id: str = Field(index=True)
    webhook: str                            # the webhook's name in [notify] webhooks
    text: str
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)   # wall clock
    rounds: int = 0                         # delivery rounds tried (each with retries)
    next_try_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    delivered_at: datetime | None = Field(default=None, sa_type=UTCDateTime, index=True)
    given_up: bool = False
    last_error: str = ""


def add_missing(s: Any, alerts: Iterable[Any], targets: Callable[[str], list[str]]) -> int:
    """Add in session s an outbox row per (alert, webhook of its event) not queued yet (Alert
    items; targets: the webhooks an event goes to); how many rows were added."""
    alerts = list(alerts)
    have = {(r.event_key, r.webhook) for r in s.exec(
        select(NotifyOutbox).where(NotifyOutbox.event_key.in_([a.key for a in alerts])))}
    added = 0
    for a in alerts:
        for hook in targets(a.event):
            if (a.key, hook) not in have:
                have.add((a.key, hook))
                s.add(NotifyOutbox(event_key=a.key, event=a.event, job_id=a.job_id,
                                   webhook=hook, text=a.text))
                added += 1
    return added

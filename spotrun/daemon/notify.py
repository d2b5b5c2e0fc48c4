"""Notify loop: queue alerts (once each, kept in the outbox) and send them off the loop thread.

Each tick, in one transaction: alerts found since the last tick become outbox rows (a
row's unique key refuses a second copy, across restarts and daemons) and the events
watermark moves; then rows due for delivery are handed to the delivery thread, so a
slow or dead webhook never holds up the daemon's other loops.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import or_
from sqlalchemy.exc import IntegrityError
from sqlmodel import func, select

from spotrun.daemon.context import DaemonContext
from spotrun.db import Event, Meta, session, utcnow
from spotrun.ledger.stopmargin import stop_margin_for
from spotrun.notify import events as ev
from spotrun.notify.routes import parse_notify
from spotrun.notify.deliver import Deliverer, Post
from spotrun.db.outbox import NotifyOutbox, add_missing

WATERMARK = "notify:last_event_id"


class NotifyLoop:
    """Each tick: find alerts, write them to the outbox once, queue due rows for delivery."""

    name = "notify"

    def __init__(self, ctx: DaemonContext, post: Post | None = None) -> None:
        self.ctx = ctx
        self.config = parse_notify(ctx.settings)
        self.margin = stop_margin_for(ctx.settings)   # the budget alerts count what stops count
        self.deliverer = Deliverer(ctx.engine, self.config.webhooks, ctx.settings, post)

    def tick(self, now: datetime) -> int:
        """One pass; returns how many rows were queued for delivery."""
        if not self.config.webhooks:
            return 0
        self._queue_alerts()
        return self._send_due()

    def _alerts(self, s, after: int) -> tuple[list[ev.Alert], int]:
        found, mark = ev.from_events(s, after)
        try:
            # Both read the provider's clock; committed spend is read on it, as the budget
            # stop reads it.
            pnow = self.ctx.provider.now()
            found += ev.from_budgets(s, self.ctx.settings.notify.budget_warn_fraction, pnow,
                                     self.margin.seconds(s))
            found += ev.from_deadlines(s, pnow, self.ctx.settings.daemon.policy_changeover_s)
        except Exception as exc:   # the provider's clock may be down; try next tick
            self.ctx.log.warning("notify_budget_deadline_check_failed", error=str(exc)[:300])
        found += ev.from_heartbeats(s, self.ctx.store_for)
        return found, mark

    def _queue_alerts(self) -> None:
        with session(self.ctx.engine) as s:
            meta = s.get(Meta, WATERMARK)
            if meta is None:
                # First run: what happened before alerts were switched on is not news.
                top = s.exec(select(func.max(Event.id))).one() or 0
                s.add(Meta(key=WATERMARK, value=str(top)))
                s.commit()
                return
            alerts, mark = self._alerts(s, int(meta.value))
            add_missing(s, alerts, self.config.targets)
            meta.value = str(mark)
            s.add(meta)
            try:
                s.commit()
            except IntegrityError:   # another daemon queued the same alert first: it stays one
                s.rollback()

    def _send_due(self) -> int:
        now = utcnow()
        with session(self.ctx.engine) as s:
            ids = list(s.exec(select(NotifyOutbox.id).where(
                NotifyOutbox.delivered_at.is_(None), NotifyOutbox.given_up.is_(False),
                or_(NotifyOutbox.next_try_at.is_(None), NotifyOutbox.next_try_at <= now))
                .order_by(NotifyOutbox.id)))
        return self.deliverer.submit([i for i in ids if i is not None])

"""The action trail: who did what, from where, with what outcome (`spotrun trail`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import select

from spotrun.db import session
from spotrun.db.identity import TrailEntry
from spotrun.secrets import redact_tokens

OUTCOMES = ("ok", "denied", "error")


def entry(*, user: str, role: str, action: str, target: str, remote_addr: str, outcome: str,
          detail: str = "") -> TrailEntry:
    """One row, its tokens redacted (a trail row never holds a secret), for a caller's own
    transaction."""
    return TrailEntry(user=user, role=role, action=action, target=redact_tokens(target)[:200],
                      remote_addr=remote_addr, outcome=outcome,
                      detail=redact_tokens(detail)[:500])


def record(engine: Engine, *, user: str, role: str, action: str, target: str,
           remote_addr: str, outcome: str, detail: str = "") -> None:
    """Append one row in a transaction of its own."""
    with session(engine) as s:
        s.add(entry(user=user, role=role, action=action, target=target,
                    remote_addr=remote_addr, outcome=outcome, detail=detail))
        s.commit()


def trail_view(engine: Engine, *, user: str | None = None, since: datetime | None = None,
               limit: int = 1000) -> list[dict[str, Any]]:
    """`spotrun trail --json`: the newest rows last (at most limit), filtered by user/since."""
    q = select(TrailEntry)
    if user is not None:
        q = q.where(TrailEntry.user == user)
    if since is not None:
        q = q.where(TrailEntry.at >= since)
    with session(engine) as s:
        rows = list(s.exec(q.order_by(TrailEntry.id.desc()).limit(limit)))  # type: ignore
    return [{"id": r.id, "at": r.at, "user": r.user, "role": r.role, "action": r.action,
             "target": r.target, "remote_addr": r.remote_addr, "outcome": r.outcome,
             "detail": r.detail} for r in reversed(rows)]

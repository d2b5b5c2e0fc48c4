"""Committed spend: what a live attempt will still cost before it can be stopped.

The spend loop's notion, shared by job budgets (spotrun.daemon.spend) and project/owner
budgets (spotrun.budgets): from the attempt's ledger watermark (else its launch) to now,
plus the stop margin for the save and the terminate (spotrun.ledger.stopmargin, which
follows the stops measured), at its last booked price (else the launch price), for every
node. An intent not launched yet commits the margin alone.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Sequence

from sqlalchemy import func
from sqlmodel import select

from spotrun.db import Attempt, LedgerMark, SpendEntry
from spotrun.ledger.intervals import seconds_between
from spotrun.providers.billing_rules import SpendKind
from spotrun.states import AttemptState


def launch_commitment_usd(price_usd_per_hour: float, nodes: int, margin_s: float) -> float:
    """What a launch commits the moment its intent is written: the stop margin, every node."""
    return margin_s / 3600.0 * price_usd_per_hour * max(nodes or 1, 1)


def committed_by_attempt(s: Any, attempts: Sequence[Attempt], now: datetime,
                         margin_s: float) -> dict[int, float]:
    """Per attempt id: its committed USD at provider time `now`, in two queries whatever the
    number of attempts (their marks, then their last compute rows' prices)."""
    ids = [a.id for a in attempts if a.id is not None]
    if not ids:
        return {}
    marks = {m.key: m for m in s.exec(select(LedgerMark).where(
        LedgerMark.key.in_([f"attempt:{i}" for i in ids])))}
    last_end = (select(SpendEntry.attempt_id, func.max(SpendEntry.end).label("end"))
                .where(SpendEntry.attempt_id.in_(ids),
                       SpendEntry.kind == SpendKind.COMPUTE.value)
                .group_by(SpendEntry.attempt_id).subquery())
    prices = {aid: price for aid, price in s.exec(
        select(SpendEntry.attempt_id, SpendEntry.price_usd_per_hour)
        .join(last_end, (SpendEntry.attempt_id == last_end.c.attempt_id)
              & (SpendEntry.end == last_end.c.end))
        .where(SpendEntry.kind == SpendKind.COMPUTE.value))}
    out: dict[int, float] = {}
    for a in attempts:
        if a.id is None:
            continue
        mark = marks.get(f"attempt:{a.id}")
        since = mark.booked_until if mark is not None else a.started_at
        unbooked_s = max(seconds_between(since, now), 0.0) if since is not None else 0.0
        price = prices.get(a.id, a.price_usd_per_hour)
        out[a.id] = (unbooked_s + margin_s) / 3600.0 * price * max(a.nodes or 1, 1)
    return out


def committed_by_job(s: Any, job_ids: Sequence[str], now: datetime,
                     margin_s: float) -> dict[str, float]:
    """Per job id: what its attempts with an instance running commit (what a job budget's
    stop counts on top of the spend), in three queries whatever the number of jobs."""
    if not job_ids:
        return {}
    running = list(s.exec(select(Attempt).where(
        Attempt.job_id.in_(list(job_ids)), Attempt.state != AttemptState.ENDED,
        Attempt.started_at.is_not(None), Attempt.ended_at.is_(None))))
    per = committed_by_attempt(s, running, now, margin_s)
    out: dict[str, float] = {}
    for a in running:
        out[a.job_id] = out.get(a.job_id, 0.0) + per.get(a.id, 0.0)
    return out

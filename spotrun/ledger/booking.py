"""Book one attempt's instance time into the ledger, idempotently.

Each call books [watermark, min(upto, end)) split where the price changes (a span that
continues the attempt's last row at its price lengthens that row: one row per price span),
and moves the attempt's watermark (LedgerMark) in the same transaction, by
compare-and-set, so a crash or a second booker can never double-book or lose a
second. When the instance has ended the final rules apply once: seconds booked
past the end are reversed, a free reclaim reverses everything, the minimum and
whole-second rounding are topped up; then the mark is closed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from sqlalchemy import update
from sqlmodel import Session, select

from spotrun.db import Attempt, LedgerMark, SpendEntry
from spotrun.errors import SpotrunError
from spotrun.ledger.intervals import PricedSpan, seconds_between, split_at_prices
from spotrun.providers.billing_rules import BillingRules, PriceSource, SpendKind
from spotrun.providers.base import InstanceInfo, PricePoint
from spotrun.states import AttemptState, EndReason, Market, TerminationCause

_EPS_S = 1e-6


class PriceFeed(Protocol):
    """The part of a Provider the ledger needs: prices."""

    def spot_price(self, instance_type: str, zone: str) -> float | None:
        """The spot price in effect now."""

    def on_demand_price(self, instance_type: str) -> float:
        """The on-demand USD/h of the type."""

    def price_history(self, instance_type: str, zones: list[str], start: datetime,
                      end: datetime) -> list[PricePoint]:
        """Spot price change points in [start, end] plus the one in effect at start."""


class BookingConflict(SpotrunError):
    """Another booker moved the watermark first; this transaction must roll back."""


@dataclass(frozen=True)
class InstanceTimes:
    """What billing needs to know about an attempt's instance (provider clock)."""

    start: datetime | None
    end: datetime | None
    reclaimed_by_provider: bool


def attempt_key(attempt_id: int) -> str:
    """LedgerMark key of an attempt."""
    return f"attempt:{attempt_id}"


def instance_times(att: Attempt, info: InstanceInfo | None) -> InstanceTimes:
    """Start, end and cause, preferring the provider's own view (it is what bills)."""
    if info is not None:
        start = info.launched_at or att.started_at
        end = info.ended_at if info.state.is_terminal() else None
        if info.state.is_terminal() and end is None:
            end = att.ended_at
        if info.cause is not None and info.cause is not TerminationCause.UNKNOWN:
            reclaimed = info.cause is TerminationCause.SPOT_RECLAIM
        else:
            reclaimed = _reclaimed(att)
        return InstanceTimes(start, end, reclaimed)
    return InstanceTimes(att.started_at, att.ended_at, _reclaimed(att))


def _reclaimed(att: Attempt) -> bool:
    # The cause reconcile saw wins: a job may complete and then be reclaimed.
    if att.instance_cause:
        return att.instance_cause == TerminationCause.SPOT_RECLAIM.value
    return att.end_reason is EndReason.RECLAIMED


def price_spans(feed: PriceFeed, att: Attempt, start: datetime, end: datetime
                ) -> list[PricedSpan]:
    """[start, end) split at the attempt's price changes, each with its source."""
    if att.market is Market.ON_DEMAND:
        return split_at_prices(start, end, [], source=PriceSource.ON_DEMAND.value,
                               fallback_usd_per_hour=feed.on_demand_price(att.instance_type),
                               fallback_source=PriceSource.ON_DEMAND.value)
    hist = feed.price_history(att.instance_type, [att.zone], start, end)
    pts = [(p.ts, p.price_usd_per_hour) for p in hist
           if p.zone == att.zone and p.instance_type == att.instance_type]
    if any(ts <= start for ts, _ in pts):
        fallback, fsrc = 0.0, PriceSource.SPOT_HISTORY.value   # never used
    else:
        now_price = feed.spot_price(att.instance_type, att.zone)
        if now_price is not None:
            fallback, fsrc = now_price, PriceSource.SPOT_NOW.value
        else:
            fallback, fsrc = att.price_usd_per_hour, PriceSource.LAUNCH.value
    return split_at_prices(start, end, pts, source=PriceSource.SPOT_HISTORY.value,
                           fallback_usd_per_hour=fallback, fallback_source=fsrc)


def book_attempt(s: Session, att: Attempt, times: InstanceTimes, feed: PriceFeed,
                 rules: BillingRules, *, upto: datetime, booked_at: datetime,
                 volume_gb: float = 0.0, min_step_s: float = 0.0,
                 mark_key: str | None = None) -> list[SpendEntry]:
    """Book what is due for one attempt up to `upto` (provider clock); caller commits.

    `mark_key` books one instance of a multi-node attempt on its own (att is then a view of
    that node: its instance id, pool and times; its rows and final rules are that instance's).
    Raises BookingConflict if another booker moved the watermark meanwhile.
    """
    key = mark_key or attempt_key(att.id)
    per_instance = att.instance_id if mark_key else None
    mark = s.get(LedgerMark, key)
    if mark is not None and mark.closed:
        return []
    if times.start is None:
        if times.end is not None or att.state is AttemptState.ENDED:
            _save_mark(s, mark, key, att.job_id, times.end or upto, closed=True,
                       state={"note": "never started: nothing billed"})
        return []
    booked_until = mark.booked_until if mark is not None else times.start
    rows: list[SpendEntry] = []
    target = min(upto, times.end) if times.end is not None else upto
    due_s = seconds_between(booked_until, target)
    extended: list[SpendEntry] = []
    if due_s > 0 and (times.end is not None or due_s >= min_step_s):
        for span in price_spans(feed, att, booked_until, target):
            rows.append(_row(att, SpendKind.COMPUTE, span.start, span.end, span.seconds,
                             span.price_usd_per_hour, span.source, booked_at))
        if volume_gb > 0:
            rows.append(_volume_row(att, rules, volume_gb, booked_until, target, booked_at))
        rows, extended = _extend_open_rows(s, att, rows, booked_until, rules, volume_gb,
                                           per_instance)
        booked_until = target
    closed = False
    for r in extended:
        s.add(r)
    if extended:
        s.flush()   # the final rules below read the extended rows back
    if times.end is not None:
        if booked_until > times.end:
            rows += _reverse_after(s, att, times.end, booked_at, per_instance)
            booked_until = times.end
        rows += _final_rows(s, att, times, rules, rows, booked_at, per_instance)
        closed = True
    if not rows and not extended and not closed:
        return []
    for r in rows:
        s.add(r)
    _save_mark(s, mark, key, att.job_id, booked_until, closed=closed)
    return rows + extended


def _extend_open_rows(s: Session, att: Attempt, rows: list[SpendEntry], since: datetime,
                      rules: BillingRules, volume_gb: float, per_instance: str | None
                      ) -> tuple[list[SpendEntry], list[SpendEntry]]:
    """Rows that only continue the attempt's last row of their kind at the same price (and
    source) lengthen that row instead: one row per price span, not one per booking.

    Returns (rows still to add, existing rows lengthened). Amounts are recomputed from the
    row's whole span, so totals stay exact to the second.
    """
    out: list[SpendEntry] = []
    extended: list[SpendEntry] = []
    for kind in (SpendKind.COMPUTE, SpendKind.VOLUME):
        first = next((r for r in rows if r.kind == kind.value and r.start == since), None)
        if first is None:
            continue
        q = select(SpendEntry).where(SpendEntry.attempt_id == att.id,
                                     SpendEntry.kind == kind.value,
                                     SpendEntry.billed_seconds > 0)
        if per_instance:
            q = q.where(SpendEntry.instance_id == per_instance)
        prev = s.exec(q.order_by(SpendEntry.end.desc(), SpendEntry.id.desc()).limit(1)).first()
        if prev is None or prev.end != since or prev.instance_id != first.instance_id \
                or prev.price_source != first.price_source or prev.note != first.note \
                or (kind is SpendKind.COMPUTE
                    and prev.price_usd_per_hour != first.price_usd_per_hour):
            continue
        prev.end = first.end
        prev.billed_seconds = seconds_between(prev.start, prev.end)
        prev.usd = (rules.volume_usd(volume_gb, prev.billed_seconds) if kind is SpendKind.VOLUME
                    else prev.billed_seconds / 3600.0 * prev.price_usd_per_hour)
        prev.booked_at = first.booked_at
        extended.append(prev)
        out.append(first)
    return [r for r in rows if all(r is not f for f in out)], extended


# ---------------------------------------------------------------- final rules

def _final_rows(s: Session, att: Attempt, times: InstanceTimes, rules: BillingRules,
                pending: list[SpendEntry], booked_at: datetime,
                per_instance: str | None = None) -> list[SpendEntry]:
    assert times.start is not None and times.end is not None
    used_s = seconds_between(times.start, times.end)
    billed_s = rules.billed_seconds(used_s, market=att.market,
                                    reclaimed_by_provider=times.reclaimed_by_provider)
    rows = _instance_rows(s, att.id, per_instance) + [r for r in pending if r.kind in SpendKind.instance_kinds()]
    booked_s = sum(r.billed_seconds for r in rows)
    booked_usd = sum(r.usd for r in rows)
    if billed_s == 0.0 and abs(booked_s) > _EPS_S:
        avg = booked_usd / booked_s * 3600.0
        return [SpendEntry(
            job_id=att.job_id, attempt_id=att.id, instance_id=att.instance_id,
            kind=SpendKind.CORRECTION.value, market=att.market.value,
            instance_type=att.instance_type, zone=att.zone, start=times.start, end=times.end,
            billed_seconds=-booked_s, price_usd_per_hour=avg, usd=-booked_usd,
            price_source=PriceSource.BOOKED.value, booked_at=booked_at,
            note=f"spot instance reclaimed by the provider after {used_s:.0f} s "
                 f"(< {rules.spot_reclaim_free_within_s:.0f} s): no charge")]
    top_up = billed_s - booked_s
    if top_up > _EPS_S:
        last = max((r for r in rows if r.billed_seconds > 0), key=lambda r: r.end, default=None)
        price = last.price_usd_per_hour if last else att.price_usd_per_hour
        why = (f"{rules.minimum_s:.0f} s minimum" if used_s < rules.minimum_s
               else f"rounded up to {rules.granularity_s:g} s")
        return [SpendEntry(
            job_id=att.job_id, attempt_id=att.id, instance_id=att.instance_id,
            kind=SpendKind.ADJUSTMENT.value, market=att.market.value,
            instance_type=att.instance_type, zone=att.zone, start=times.end, end=times.end,
            billed_seconds=top_up, price_usd_per_hour=price, usd=top_up / 3600.0 * price,
            price_source=last.price_source if last else PriceSource.LAUNCH.value,
            booked_at=booked_at, note=f"{why}: ran {used_s:.3f} s, billed {billed_s:.0f} s")]
    return []


def _reverse_after(s: Session, att: Attempt, cut: datetime, booked_at: datetime,
                   per_instance: str | None = None) -> list[SpendEntry]:
    """Reverse the part of booked rows that lies after the instance's real end."""
    out: list[SpendEntry] = []
    q = select(SpendEntry).where(SpendEntry.attempt_id == att.id, SpendEntry.end > cut,
                                 SpendEntry.kind.in_([SpendKind.COMPUTE.value,
                                                      SpendKind.VOLUME.value]),
                                 SpendEntry.billed_seconds > 0)
    if per_instance:
        q = q.where(SpendEntry.instance_id == per_instance)
    for r in s.exec(q):
        start = max(r.start, cut)
        secs = seconds_between(start, r.end)
        if secs <= 0:
            continue
        frac = secs / r.billed_seconds if r.billed_seconds else 0.0
        kind = SpendKind.CORRECTION if r.kind == SpendKind.COMPUTE.value else SpendKind.VOLUME
        out.append(SpendEntry(
            job_id=r.job_id, attempt_id=r.attempt_id, instance_id=r.instance_id,
            kind=kind.value, market=r.market, instance_type=r.instance_type, zone=r.zone,
            start=start, end=r.end, billed_seconds=-secs, price_usd_per_hour=r.price_usd_per_hour,
            usd=-r.usd * frac, price_source=PriceSource.BOOKED.value, booked_at=booked_at,
            note=f"reverses row {r.id}: booked past the instance's end {cut.isoformat()}"))
    return out


def _instance_rows(s: Session, attempt_id: int, per_instance: str | None = None
                   ) -> list[SpendEntry]:
    q = select(SpendEntry).where(SpendEntry.attempt_id == attempt_id,
                                 SpendEntry.kind.in_(SpendKind.instance_kinds()))
    if per_instance:
        q = q.where(SpendEntry.instance_id == per_instance)
    return list(s.exec(q))


# ---------------------------------------------------------------- rows and marks

def _row(att: Attempt, kind: SpendKind, start: datetime, end: datetime, secs: float,
         price: float, source: str, booked_at: datetime) -> SpendEntry:
    return SpendEntry(job_id=att.job_id, attempt_id=att.id, instance_id=att.instance_id,
                      kind=kind.value, market=att.market.value, instance_type=att.instance_type,
                      zone=att.zone, start=start, end=end, billed_seconds=secs,
                      price_usd_per_hour=price, usd=secs / 3600.0 * price, price_source=source,
                      booked_at=booked_at)


def _volume_row(att: Attempt, rules: BillingRules, size_gb: float, start: datetime,
                end: datetime, booked_at: datetime) -> SpendEntry:
    secs = seconds_between(start, end)
    usd = rules.volume_usd(size_gb, secs)
    return SpendEntry(job_id=att.job_id, attempt_id=att.id, instance_id=att.instance_id,
                      kind=SpendKind.VOLUME.value, market=att.market.value,
                      instance_type=att.instance_type, zone=att.zone, start=start, end=end,
                      billed_seconds=secs, price_usd_per_hour=usd / secs * 3600.0 if secs else 0.0,
                      usd=usd, price_source=PriceSource.STORAGE_PRICE.value, booked_at=booked_at,
                      note=f"root volume {size_gb:g} GB at "
                           f"${rules.volume_usd_per_gb_month}/GB-month")


def _save_mark(s: Session, mark: LedgerMark | None, key: str, job_id: str,
               booked_until: datetime, *, closed: bool, state: dict | None = None) -> None:
    save_mark(s, mark, key, job_id, booked_until, closed=closed,
              state_json=json.dumps(state) if state is not None else None)


def save_mark(s: Session, mark: LedgerMark | None, key: str, job_id: str,
              booked_until: datetime, *, closed: bool, state_json: str | None = None) -> None:
    """Insert the mark, or move it by compare-and-set on its version."""
    if mark is None:
        s.add(LedgerMark(key=key, job_id=job_id, booked_until=booked_until, closed=closed,
                         version=1, state_json=state_json or "{}"))
        s.flush()  # a concurrent insert of the same key fails here (primary key)
        return
    values: dict = {"booked_until": booked_until, "closed": closed, "version": mark.version + 1}
    if state_json is not None:
        values["state_json"] = state_json
    res = s.execute(update(LedgerMark)
                    .where(LedgerMark.key == key, LedgerMark.version == mark.version)
                    .values(**values)
                    .execution_options(synchronize_session=False))
    if res.rowcount != 1:
        raise BookingConflict("the ledger watermark moved under us", field="ledger_mark",
                              value=key, hint="another booker ran; this pass is rolled back")
    s.expire(mark)

"""Storage lines: a job's objects in the store, booked as GB-month and write requests.

Each pass lists the job's prefix (and its checkpoint prefix when that lives
elsewhere), books the bytes held since the last pass (trapezoid between the
previous and the current size) and, as a separate line, the PUT requests for
objects that appeared since the last listing (an estimate: a rewritten key,
such as a heartbeat, is not seen).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Callable

from sqlmodel import Session

from spotrun import layout
from spotrun.db import Job, LedgerMark, SpendEntry
from spotrun.errors import StoreError
from spotrun.ledger.booking import save_mark
from spotrun.ledger.intervals import seconds_between
from spotrun.providers.billing_rules import BillingRules, PriceSource, SpendKind
from spotrun.store import open_store
from spotrun.store.base import ObjectStore

StoreOpener = Callable[[str], ObjectStore]


@dataclass(frozen=True)
class StoreUsage:
    """What a job holds in object storage now."""

    size_bytes: int
    keys: frozenset[str]


def storage_key(job_id: str) -> str:
    """LedgerMark key of a job's storage."""
    return f"storage:{job_id}"


def measure_job_storage(job: Job, opener: StoreOpener = open_store) -> StoreUsage:
    """List the job's objects (job prefix in its store, plus the checkpoint prefix)."""
    prefix = layout.job_prefix(job.id)
    under_job = f"{job.store_uri.rstrip('/')}/{prefix}/"
    sizes: dict[str, int] = {}
    for o in opener(job.store_uri).list(prefix + "/"):
        sizes[f"{job.store_uri.rstrip('/')}/{o.key}"] = o.size
    ck = job.checkpoint_uri.rstrip("/")
    if not (ck + "/").startswith(under_job):
        try:
            for o in opener(ck).list(""):
                sizes[f"{ck}/{o.key}"] = o.size
        except StoreError:
            pass  # a checkpoint store we cannot read now is booked on a later pass
    return StoreUsage(size_bytes=sum(sizes.values()), keys=frozenset(sizes))


def book_storage(s: Session, job: Job, usage: StoreUsage, rules: BillingRules, *,
                 start: datetime, upto: datetime, booked_at: datetime,
                 min_step_s: float = 0.0) -> list[SpendEntry]:
    """Book storage held in [watermark or start, upto) and new-object requests; caller commits."""
    key = storage_key(job.id)
    mark = s.get(LedgerMark, key)
    since = mark.booked_until if mark is not None else start
    state = json.loads(mark.state_json) if mark is not None else {}
    secs = seconds_between(since, upto)
    if secs <= 0 or secs < min_step_s:
        return []
    prev_size = float(state.get("size_bytes", usage.size_bytes))
    avg_size = (prev_size + usage.size_bytes) / 2.0
    usd = rules.storage_usd(avg_size, secs)
    rows = [SpendEntry(
        job_id=job.id, kind=SpendKind.STORAGE.value, start=since, end=upto, billed_seconds=secs,
        price_usd_per_hour=usd / secs * 3600.0, usd=usd,
        price_source=PriceSource.STORAGE_PRICE.value, booked_at=booked_at,
        note=f"{avg_size / 1e6:.3f} MB average ({usage.size_bytes} bytes now, "
             f"{len(usage.keys)} objects) at ${rules.storage_usd_per_gb_month}/GB-month")]
    new = usage.keys - frozenset(state.get("seen", []))
    if new:
        req_usd = len(new) / 1000.0 * rules.put_requests_usd_per_1000
        rows.append(SpendEntry(
            job_id=job.id, kind=SpendKind.REQUESTS.value, start=since, end=upto,
            billed_seconds=0.0, price_usd_per_hour=0.0, usd=req_usd,
            price_source=PriceSource.STORAGE_PRICE.value, booked_at=booked_at,
            note=f"{len(new)} new objects: PUT requests at "
                 f"${rules.put_requests_usd_per_1000}/1000 (estimated from listings)"))
    for r in rows:
        s.add(r)
    save_mark(s, mark, key, job.id, upto, closed=False,
              state_json=json.dumps({"size_bytes": usage.size_bytes,
                                     "seen": sorted(usage.keys)}))
    return rows

"""`spotrun audit --reconcile`: each job's ledger against AWS Cost Explorer, by cost tag.

Instances and their root volumes carry the tag `spotrun:job=<job id>`. Once that tag is
activated as a cost allocation tag (Billing console), Cost Explorer can group costs by
it. One GetCostAndUsage call covers every job: daily granularity over the jobs' days,
UnblendedCost, filtered on the tag's values and grouped by it (pages followed).
The ledger side is what those tagged resources bill: instance rows (compute,
adjustment, correction) and volume rows; S3 storage is not tagged per job.
Cost Explorer lags about a day, costs $0.01 per request and may be denied to the
caller: each job then says why it could not be checked instead of failing the verb.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import date, datetime, timedelta, timezone
from typing import Any, Callable, Protocol

from sqlmodel import Session, select

from spotrun.aws_clients import error_code
from spotrun.db import Job, SpendEntry, attempts_of
from spotrun.errors import SpotrunError
from spotrun.providers.billing_rules import SpendKind
from spotrun.providers.base import TAG_JOB

CE_LAG_S = 24 * 3600.0
DENIED = {"AccessDeniedException", "AccessDenied", "UnauthorizedOperation",
          "UnrecognizedClientException", "OptInRequired"}


class CostExplorerClient(Protocol):
    """The part of a boto3 `ce` client used here."""

    def get_cost_and_usage(self, **kwargs: Any) -> dict[str, Any]:
        """One page of GetCostAndUsage."""


@dataclass
class ReconcileLine:
    """One job: the ledger's tagged spend, Cost Explorer's, and their difference."""

    id: str
    name: str
    ledger_usd: float
    cost_explorer_usd: float | None
    difference_usd: float | None       # Cost Explorer minus ledger
    could_not_check: str | None = None
    estimated: bool = False            # Cost Explorer marked some days as estimates
    start: str | None = None           # first day asked (UTC, inclusive)
    end: str | None = None             # last day asked (UTC, exclusive)

    def to_dict(self) -> dict[str, Any]:
        """The JSON view."""
        return asdict(self)


def ledger_tagged_usd(s: Session, job_id: str) -> float:
    """The ledger's spend on the job's tagged resources (instances and root volumes)."""
    kinds = list(SpendKind.instance_kinds()) + [SpendKind.VOLUME.value]
    return float(sum(s.exec(select(SpendEntry.usd).where(SpendEntry.job_id == job_id,
                                                         SpendEntry.kind.in_(kinds)))))


def _window(s: Session, job: Job, now: datetime) -> tuple[datetime, datetime] | None:
    atts = [a for a in attempts_of(s, job.id) if a.started_at is not None]
    if not atts:
        return None
    start = min(_aware(a.started_at) for a in atts)
    end = max(_aware(a.ended_at) if a.ended_at else now for a in atts)
    return start, end


def reconcile(s: Session, jobs: list[Job], ce: CostExplorerClient, *, now: datetime,
              call: Callable[..., Any] | None = None) -> list[ReconcileLine]:
    """Compare every job's tagged ledger spend with Cost Explorer (one query for all)."""
    call = call or (lambda fn, **kw: fn(**kw))
    lines: list[ReconcileLine] = []
    windows: dict[str, tuple[datetime, datetime]] = {}
    for job in jobs:
        line = ReconcileLine(id=job.id, name=job.name, ledger_usd=ledger_tagged_usd(s, job.id),
                             cost_explorer_usd=None, difference_usd=None)
        win = _window(s, job, now)
        if win is None:
            line.could_not_check = "no instance ran: nothing to compare"
        else:
            windows[job.id] = win
            line.start = win[0].date().isoformat()
            line.end = (win[1].date() + timedelta(days=1)).isoformat()
        lines.append(line)
    if not windows:
        return lines
    d0 = min(w[0] for w in windows.values()).date()
    d1 = max(w[1] for w in windows.values()).date() + timedelta(days=1)
    from botocore.exceptions import BotoCoreError, ClientError
    try:
        by_job, estimated = _query(ce, call, sorted(windows), d0, d1)
    except (ClientError, BotoCoreError, SpotrunError) as exc:   # per job: why not checked
        reason = _reason(exc)
        for line in lines:
            if line.id in windows:
                line.could_not_check = reason
        return lines
    any_found = bool(by_job)
    for line in lines:
        if line.id not in windows:
            continue
        if line.id in by_job:
            line.cost_explorer_usd = by_job[line.id]
            line.difference_usd = by_job[line.id] - line.ledger_usd
            line.estimated = line.id in estimated
        elif (now - windows[line.id][1]).total_seconds() < CE_LAG_S:
            line.could_not_check = "no data yet: Cost Explorer lags about 24 h behind usage"
        elif not any_found:
            line.could_not_check = (f"no cost under tag {TAG_JOB}: activate it as a cost "
                                    "allocation tag (Billing console); only later usage counts")
        else:
            line.could_not_check = f"no cost under tag {TAG_JOB}={line.id}"
    return lines


def _query(ce: CostExplorerClient, call: Callable[..., Any], ids: list[str], d0: date,
           d1: date) -> tuple[dict[str, float], set[str]]:
    kw: dict[str, Any] = {
        "TimePeriod": {"Start": d0.isoformat(), "End": d1.isoformat()},
        "Granularity": "DAILY", "Metrics": ["UnblendedCost"],
        "GroupBy": [{"Type": "TAG", "Key": TAG_JOB}],
        "Filter": {"Tags": {"Key": TAG_JOB, "Values": ids, "MatchOptions": ["EQUALS"]}},
    }
    by_job: dict[str, float] = {}
    estimated: set[str] = set()
    token = ""
    # botocore ships no paginator for GetCostAndUsage (can_paginate is False): follow the token.
    while True:
        resp = call(ce.get_cost_and_usage, **(kw | ({"NextPageToken": token} if token else {})))
        for day in resp.get("ResultsByTime", []):
            for group in day.get("Groups", []):
                key = (group.get("Keys") or [""])[0]
                job_id = key.split("$", 1)[1] if "$" in key else ""
                if job_id not in ids:
                    continue   # "spotrun:job$" = untagged usage, never ours
                amount = float(group.get("Metrics", {}).get("UnblendedCost", {})
                               .get("Amount", 0.0))
                by_job[job_id] = by_job.get(job_id, 0.0) + amount
                if day.get("Estimated"):
                    estimated.add(job_id)
        token = resp.get("NextPageToken") or ""
        if not token:
            return by_job, estimated


def _reason(exc: BaseException) -> str:
    code = error_code(exc)
    if code in DENIED:
        return f"access denied to Cost Explorer ({code}): allow ce:GetCostAndUsage"
    if code == "DataUnavailableException":
        return "no data yet: Cost Explorer has no data for these days"
    if code == "BillExpirationException":
        return "Cost Explorer no longer has bills for these days"
    return f"Cost Explorer unavailable: {code or type(exc).__name__}: {exc}"[:300]


def _aware(t: datetime) -> datetime:
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t

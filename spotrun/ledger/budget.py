"""Budgets: refuse a launch the model expects to overrun, stop a job before it passes.

The scheduler calls `budget_check` before a launch; the spend loop calls it each
tick with the cost of finishing the current stretch (time to checkpoint and
terminate) and, when it says no, sets `Job.budget_stop_requested` for the
reconcile loop. `raise_budget` is what `spotrun resume --budget-usd N` calls.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func
from sqlmodel import Session, select

from spotrun.db import Job, SpendEntry, add_event, utcnow
from spotrun.errors import BadInputError


@dataclass(frozen=True)
class BudgetDecision:
    """Whether the next stretch of spend fits the job's budget."""

    allowed: bool
    budget_usd: float | None
    spent_usd: float
    expected_usd: float
    reason: str

    @property
    def remaining_usd(self) -> float | None:
        """Budget left after what is already booked (None = no budget)."""
        return None if self.budget_usd is None else self.budget_usd - self.spent_usd

    def to_dict(self) -> dict:
        """A JSON-able view."""
        return {"allowed": self.allowed, "budget_usd": self.budget_usd,
                "spent_usd": self.spent_usd, "expected_usd": self.expected_usd,
                "remaining_usd": self.remaining_usd, "reason": self.reason}


def job_budget_usd(job: Job) -> float | None:
    """The job's budget: the column (raised by resume) wins over the spec."""
    if job.budget_usd is not None:
        return job.budget_usd
    try:
        return (json.loads(job.spec_json).get("policy") or {}).get("budget_usd")
    except (ValueError, AttributeError):
        return None


def job_spend_usd(s: Session, job_id: str) -> float:
    """Everything booked for the job so far (all ledger rows, corrections included)."""
    total = s.exec(select(func.sum(SpendEntry.usd)).where(SpendEntry.job_id == job_id)).one()
    return float(total or 0.0)


def budget_check(s: Session, job: Job, now: datetime, expected_usd_next: float
                 ) -> BudgetDecision:
    """May the job spend expected_usd_next more without passing its budget?"""
    del now  # part of the scheduler's calling convention; spend is read from the ledger
    if not math.isfinite(expected_usd_next) or expected_usd_next < 0:
        raise BadInputError("allowed: a number >= 0", field="expected_usd_next",
                            value=expected_usd_next)
    budget = job_budget_usd(job)
    spent = job_spend_usd(s, job.id)
    if budget is None:
        return BudgetDecision(True, None, spent, expected_usd_next, "no budget")
    if spent + expected_usd_next <= budget:
        return BudgetDecision(True, budget, spent, expected_usd_next,
                              f"${spent:.4f} spent + ${expected_usd_next:.4f} expected "
                              f"<= ${budget:.2f}")
    return BudgetDecision(False, budget, spent, expected_usd_next,
                          f"${spent:.4f} spent + ${expected_usd_next:.4f} expected "
                          f"> budget ${budget:.2f}")


def request_budget_stop(s: Session, job: Job, decision: BudgetDecision,
                        now: datetime | None = None) -> bool:
    """Flag the job for a budget stop (once); True if this call set the flag. Caller commits."""
    if job.budget_stop_requested:
        return False
    job.budget_stop_requested = True
    job.updated_at = now or utcnow()
    s.add(job)
    add_event(s, job.id, "budget_stop_requested", decision.reason, ts=now)
    return True


def raise_budget(s: Session, job: Job, budget_usd: float, now: datetime | None = None) -> Job:
    """Raise the budget (N > 0, above what is spent) and clear a budget stop; caller commits."""
    if isinstance(budget_usd, bool) or not isinstance(budget_usd, (int, float)) \
            or not math.isfinite(budget_usd) or budget_usd <= 0:
        raise BadInputError("allowed: a number > 0", field="--budget-usd", value=budget_usd)
    spent = job_spend_usd(s, job.id)
    if budget_usd <= spent:
        raise BadInputError(f"must be above what the job has spent (${spent:.2f})",
                            field="--budget-usd", value=budget_usd)
    job.budget_usd = float(budget_usd)
    job.budget_stop_requested = False
    job.updated_at = now or utcnow()
    s.add(job)
    add_event(s, job.id, "budget_raised", f"budget_usd={budget_usd:g}", ts=now)
    return job

"""Hindsight regret: what the job's instances cost minus the best schedule in hindsight.

`spotrun.simulate.optimal.optimal_costs(model, rows)` solves the optimum for a SimModel;
a builder registered in `MODEL_FOR_JOB["default"]` turns a finished job into one
(`spotrun.audit.observed.build_observed_model`). `spotrun audit` registers it with
`use_observed_model(settings)`: the local provider's market trace as the truth when
there is one, else only the daemon's own observations. Without a builder the audit
reports None.

Regret compares like with like: the job's instance spend (compute, adjustment and
correction rows, spot and on-demand) against the model's instance cost. Storage and
volume lines are not in the model. AWS does not charge a spot instance reclaimed in its
first hour; the model pays every tick it ran, so a job with free reclaims can show a
negative regret (it was cheaper than any schedule that pays for its time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from sqlmodel import Session, select

from spotrun.db import Job, JobRows, SpendEntry
from spotrun.providers.billing_rules import SpendKind
from spotrun.providers.facts import facts_for, od_price_for

# (session, job, its rows read in bulk or None) -> (SimModel, start row) or None; set by
# whoever can build the model. The rows (spotrun.db.JobRows) spare a query per job.
ModelForJob = Callable[[Session, Job, "JobRows | None"], "tuple[Any, int] | None"]
MODEL_FOR_JOB: dict[str, ModelForJob] = {}


@dataclass(frozen=True)
class Hindsight:
    """The optimum and the regret of one finished job (USD)."""

    instance_usd: float
    optimal_usd: float
    regret_usd: float


def observed_builder(od_price: Callable[[str], "float | None"],
                     truth: Any = None) -> ModelForJob:
    """A MODEL_FOR_JOB builder over build_observed_model with these prices and truth."""
    def build(s: Session, job: Job, rows: JobRows | None = None) -> "tuple[Any, int] | None":
        # lazy: start-up cost (the simulator and numpy; `status` reads this package)
        from spotrun.audit.observed import build_observed_model
        built = build_observed_model(s, job, od_price=od_price, truth=truth, rows=rows)
        return None if built is None else (built.model, 0)
    return build


def use_observed_model(settings: Any) -> None:
    """Register the observed-model builder for these settings (region; local market truth)."""
    od_price = od_price_for(settings)   # the provider's catalog, in its pricing region
    truth = facts_for(settings).market_truth(settings)
    MODEL_FOR_JOB["default"] = observed_builder(od_price, truth)


def instance_usd(s: Session, job_id: str, rows: JobRows | None = None) -> float:
    """The job's instance spend: compute, adjustment and correction rows of every attempt
    (summed from rows' ledger when given, else one query)."""
    kinds = list(SpendKind.instance_kinds())
    if rows is not None:
        return float(sum(r.usd for r in rows.spend if r.kind in kinds))
    found = s.exec(select(SpendEntry.usd).where(SpendEntry.job_id == job_id,
                                                SpendEntry.kind.in_(kinds)))
    return float(sum(found))


def hindsight_wanted() -> bool:
    """True while a model builder is registered (the audit then reads what it needs)."""
    return MODEL_FOR_JOB.get("default") is not None


def hindsight(s: Session, job: Job, rows: JobRows | None = None) -> Hindsight | None:
    """Optimum and regret for a finished job; None if unfinished, no builder, or no model.

    rows: the job's rows read in bulk (spotrun.db.rows_by_job); None reads them here.
    """
    builder = MODEL_FOR_JOB.get("default")
    if not job.state.is_terminal() or builder is None:
        return None
    built = builder(s, job, rows)
    if built is None:
        return None
    # lazy: start-up cost (numpy; `status` reads this package)
    import numpy as np

    # lazy: start-up cost (numpy), only for --regret
    from spotrun.simulate.optimal import optimal_costs
    model, row = built
    best = float(optimal_costs(model, np.asarray([row]))[0])
    if not np.isfinite(best):
        return None
    actual = instance_usd(s, job.id, rows)
    return Hindsight(instance_usd=actual, optimal_usd=best, regret_usd=actual - best)


def hindsight_regret_usd(s: Session, job: Job, actual_usd: float | None = None) -> float | None:
    """Instance spend minus the hindsight-optimal cost; None if no model (actual_usd unused)."""
    h = hindsight(s, job)
    return None if h is None else h.regret_usd

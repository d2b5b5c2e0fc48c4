"""Hook for hindsight regret: the cost of the best schedule given what was observed.

`spotrun.policy.optimal.optimal_costs(model, rows)` solves it for a SimModel (a
trace of pool availability and prices, the work and deadline in ticks). What is
missing is a per-job model: the availability the job's pools had over its
window (the local market's trace; on AWS only our own reclaims are observed).
Until a `SimModel` can be built from a job, the audit reports None.
"""

from __future__ import annotations

from typing import Any, Callable

from sqlmodel import Session

from spotrun.db import Job

# (session, job) -> (SimModel, start row) or None; set by whoever can build the model.
ModelForJob = Callable[[Session, Job], "tuple[Any, int] | None"]
MODEL_FOR_JOB: dict[str, ModelForJob] = {}


def hindsight_regret_usd(s: Session, job: Job, actual_usd: float | None = None) -> float | None:
    """Actual cost minus the hindsight-optimal cost for a finished job; None if no model."""
    builder = MODEL_FOR_JOB.get("default")
    if not job.state.is_terminal() or builder is None or actual_usd is None:
        return None
    built = builder(s, job)
    if built is None:
        return None
    from spotrun.policy.optimal import optimal_costs
    import numpy as np
    model, row = built
    return actual_usd - float(optimal_costs(model, np.asarray([row]))[0])

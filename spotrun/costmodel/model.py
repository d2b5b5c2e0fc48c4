"""The cost model's arithmetic: progress fraction, Young/Daly interval, expected totals.

Pure functions of numbers (hours and seconds in the names); rank.py feeds them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from spotrun.errors import BadInputError


def young_daly_interval_s(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """Young/Daly checkpoint interval: sqrt(2 * C * MTBF), in seconds."""
    if checkpoint_cost_s < 0 or mtbf_s < 0:
        raise BadInputError("must be >= 0", field="checkpoint_cost_s/mtbf_s",
                            value=(checkpoint_cost_s, mtbf_s))
    return math.sqrt(2.0 * checkpoint_cost_s * mtbf_s)


def recommended_interval_s(checkpoint_cost_s: float, mtbf_h: float | None, *,
                           min_s: float, max_s: float) -> float:
    """Young/Daly clamped to [min_s, max_s]; max_s when nothing reclaims (mtbf None/inf)."""
    if mtbf_h is None or math.isinf(mtbf_h):
        return max_s
    tau = young_daly_interval_s(checkpoint_cost_s, mtbf_h * 3600.0)
    return min(max(tau, min_s), max_s)


def progress_fraction(*, mtbf_h: float | None, restart_s: float, checkpoint_cost_s: float,
                      interval_s: float, lost_per_reclaim_s: float) -> float:
    """Share of billed time that becomes kept training progress, in [0, 1].

    A renewal cycle is an up stretch of mean M = mtbf_h, then a restart of R = restart_s.
    While up, a save blocking C every interval tau keeps tau / (tau + C) of the time. A reclaim
    loses L = lost_per_reclaim_s of work (spotrun.costmodel.notice_loss.reclaim_loss: little when
    the notice is honoured, about half an interval when not).
    So f = tau/(tau+C) * (M - L) / (M + R).
    """
    tau = max(interval_s, 1e-9)
    keep = tau / (tau + max(checkpoint_cost_s, 0.0))
    if mtbf_h is None or math.isinf(mtbf_h):
        return keep
    m = mtbf_h * 3600.0
    return max(0.0, keep * (m - max(lost_per_reclaim_s, 0.0)) / (m + max(restart_s, 0.0)))


@dataclass(frozen=True)
class Expected:
    """Totals for a piece of work on one candidate (None without a work amount)."""

    usd_per_reference_hour: float
    hours: float | None
    usd: float | None
    preemptions: float | None


def expected(*, work_reference_hours: float | None, price_usd_per_hour: float, speedup: float,
             fraction: float, mtbf_h: float | None, restart_s: float) -> Expected:
    """Expected $ per reference-hour, and hours, $ and reclaims for the work (if known)."""
    speed = speedup * fraction
    if speed <= 0:
        return Expected(math.inf, None if work_reference_hours is None else math.inf,
                        None if work_reference_hours is None else math.inf, None)
    per_ref_h = price_usd_per_hour / speed
    if work_reference_hours is None:
        return Expected(per_ref_h, None, None, None)
    hours = work_reference_hours / speed
    if mtbf_h is None or math.isinf(mtbf_h):
        pre = 0.0
    else:
        pre = hours / (mtbf_h + restart_s / 3600.0)   # one reclaim per renewal cycle
    return Expected(per_ref_h, hours, price_usd_per_hour * hours, pre)

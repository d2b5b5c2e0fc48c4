"""decide: the one computation of where and how a job runs next.

`spotrun plan`, `spotrun submit --dry-run`, the daemon's scheduler (and, for deadline jobs,
its placer) all call `decide`; nothing else ranks or picks. Its inputs are values: the job
spec, the catalog, one market snapshot, the job's history, the hours left to the deadline
(converted once, `hours_left`), and the provider's clock scale. Its output is a Placement: the
pools to try in order, each with GPUs used, nodes, price, speedup, expected $ and hours and the
checkpoint interval (provider and wall seconds), every rejected pool with its reason, and,
when nothing can launch now, the true reason the job waits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from spotrun.catalog import Catalog
from spotrun.costmodel.history import HistorySource
from spotrun.costmodel.notice_loss import NoticePrior
from spotrun.decide.market import MarketSnapshot
from spotrun.decide.rank import NO_PROGRESS, NOW, Candidate, Ranking, rank
from spotrun.spec import JobSpec
from spotrun.states import Market, MarketPolicy
from spotrun.costmodel.risk import risk_model

MAX_CANDIDATES = 8   # pools offered per launch; the next launch decides again anyway


@dataclass(frozen=True)
class Placement:
    """Where and how the job runs next: the pools to try in order, and everything rejected."""

    candidates: list[Candidate]          # launch order, best first (empty: wait)
    ranking: Ranking
    market: MarketSnapshot
    time_scale: float = 1.0              # provider-clock seconds per wall second
    wait_reason: str | None = None       # why nothing launches now (None when something can)
    policy_decision: Any = None          # the deadline policy's decision, when it decided
    warnings: list[str] = field(default_factory=list)

    @property
    def first(self) -> Candidate | None:
        """What the launch tries first."""
        return self.candidates[0] if self.candidates else None

    def ordered(self) -> list[Candidate]:
        """The launch order first, then every other ranked candidate (not launched now)."""
        keys = {(c.instance_type, c.zone, c.market) for c in self.candidates}
        return list(self.candidates) + [c for c in self.ranking.candidates
                                        if (c.instance_type, c.zone, c.market) not in keys]

    def candidate_dict(self, c: Candidate) -> dict[str, Any]:
        """A candidate's JSON row, with its checkpoint interval on both clocks."""
        d = c.to_dict()
        d["checkpoint_interval_wall_s"] = round(c.checkpoint_interval_s
                                                / max(self.time_scale, 1e-9), 3)
        return d

    def to_dict(self) -> dict[str, Any]:
        """The JSON of `plan --json` and `submit --dry-run --json` (same keys)."""
        r = self.ranking
        return {"prices": self.market.to_dict(),
                "reference": self.candidate_dict(r.reference) if r.reference else None,
                "reference_instance": r.reference_instance,
                "work_reference_hours": r.work_reference_hours,
                "candidates": [dict(self.candidate_dict(c), launch=i < len(self.candidates))
                               for i, c in enumerate(self.ordered())],
                "rejected": [x.to_dict() for x in r.rejected],
                "wait_reason": self.wait_reason, "warnings": list(self.warnings),
                "notes": list(r.notes)}


def hours_left(deadline_iso: str | None, now: datetime) -> float | None:
    """Hours from now to the deadline (both on the provider's clock); None without one."""
    if not deadline_iso:
        return None
    return (datetime.fromisoformat(deadline_iso) - now).total_seconds() / 3600.0


def decide(spec: JobSpec, *, catalog: Catalog, market: MarketSnapshot, history: HistorySource,
           hours_left: float | None, time_scale: float = 1.0, job_id: str | None = None,
           steps_done: int = 0, risk: Any = None, notice: NoticePrior | None = None
           ) -> Placement:
    """The launch order for the job's next attempt, and why each other pool is not in it.

    `notice`: the provider's interruption notice (costmodel.notice_prior_of(facts, settings)).
    """
    if risk is None:
        risk = risk_model(catalog)
    ranking = rank(spec, catalog=catalog, market=market, history=history, hours_left=hours_left,
                   job_id=job_id, steps_done=steps_done, risk=risk, notice=notice,
                   time_scale=time_scale)
    order = launch_order(ranking.candidates, spec,
                         allow_on_demand=hours_left is not None)[:MAX_CANDIDATES]
    wait = None if order else wait_reason(spec, ranking, market)
    return Placement(candidates=order, ranking=ranking, market=market, time_scale=time_scale,
                     wait_reason=wait, warnings=price_cap_warnings(spec, ranking, market))


def launch_order(candidates: list[Candidate], spec: JobSpec, *,
                 allow_on_demand: bool) -> list[Candidate]:
    """The ranked candidates a launch may try, in order (pure).

    Without a deadline, `auto` waits for spot rather than paying on-demand; the deadline
    policy decides when on-demand becomes the choice.
    """
    od_ok = spec.policy.market is MarketPolicy.ON_DEMAND or (
        spec.policy.market is MarketPolicy.AUTO and allow_on_demand)
    out: list[Candidate] = []
    od_types: set[str] = set()
    for c in candidates:
        if c.market is Market.SPOT:
            if spec.policy.market is MarketPolicy.ON_DEMAND:
                continue
        else:
            if not od_ok or c.instance_type in od_types:
                continue
            od_types.add(c.instance_type)
        out.append(c)
    return out


def wait_reason(spec: JobSpec, ranking: Ranking, market: MarketSnapshot) -> str:
    """The true reason nothing can launch now, in one line."""
    now = [r for r in ranking.rejected if r.kind == NOW
           and (r.market == Market.SPOT.value or spec.policy.market is MarketPolicy.ON_DEMAND)]
    cap = spec.policy.max_price_usd_per_hour
    if cap is not None and now and all("max_price_usd_per_hour" in r.reason for r in now):
        lowest = market.cheapest_spot({r.instance_type for r in now})
        where = f"; lowest ${lowest[0]:.2f}/h ({lowest[1]} in {lowest[2]})" if lowest else ""
        return f"price cap ${cap:g}/h is below every {_market_word(spec)} price now{where}"
    if now and all("capacity" in r.reason for r in now):
        return (f"no spot capacity now in any of {len({(r.instance_type, r.zone) for r in now})}"
                f" pool(s); waiting for capacity")
    closed = [market.notice_in(r.instance_type, r.zone) for r in now
              if r.zone and r.market == Market.SPOT.value]
    if now and len(closed) == len(now) and all(n is not None for n in closed):
        q = market.quarantine
        first = min(q.until(n) for n in closed if n is not None)
        return (f"every spot pool that can take the job had an interruption notice in the "
                f"last {q.window_s:g} s ({len(now)} pool(s)); the first opens at "
                f"{first:%H:%M:%S}")
    if now:
        return "; ".join(dict.fromkeys(r.reason for r in now[:3]))
    stuck = [r for r in ranking.rejected if NO_PROGRESS in r.reason]
    if stuck:
        return "; ".join(dict.fromkeys(r.reason for r in stuck[:3]))
    if ranking.candidates and spec.policy.market is MarketPolicy.AUTO:
        return "no spot pool can take the job now and on-demand is used only under a deadline"
    return "no pool can take the job"


def _market_word(spec: JobSpec) -> str:
    return {MarketPolicy.SPOT: "spot", MarketPolicy.ON_DEMAND: "on-demand",
            MarketPolicy.AUTO: "spot"}[spec.policy.market]


def price_cap_warnings(spec: JobSpec, ranking: Ranking, market: MarketSnapshot) -> list[str]:
    """A warning when the price cap is below every pool's price now (accepted: prices move)."""
    cap = spec.policy.max_price_usd_per_hour
    if cap is None:
        return []
    capped = [r for r in ranking.rejected if "max_price_usd_per_hour" in r.reason]
    if not capped or any(c.price_usd_per_hour <= cap for c in ranking.candidates):
        return []
    lowest = market.cheapest_spot({r.instance_type for r in capped})
    where = f"; lowest spot ${lowest[0]:.2f}/h ({lowest[1]} in {lowest[2]})" if lowest else ""
    return [f"policy.max_price_usd_per_hour ${cap:g}/h is below every price now{where}: "
            f"the job waits until a price falls under the cap"]


def is_never(ranking: Ranking, hours_left: float | None, spec: JobSpec | None = None) -> bool:
    """True when no market change can make the job runnable (refuse at submit).

    With the spec, ranked candidates its policy never launches (on-demand rows of an `auto`
    job without a deadline) count as none.
    """
    if ranking.candidates and hours_left is not None and all(
            c.misses_deadline for c in ranking.candidates):
        return True
    launchable = ranking.candidates if spec is None else launch_order(
        ranking.candidates, spec, allow_on_demand=hours_left is not None)
    if launchable:
        return False
    od_ok = spec is None or spec.policy.market is MarketPolicy.ON_DEMAND or (
        spec.policy.market is MarketPolicy.AUTO and hours_left is not None)
    return not any(r.kind == NOW and (od_ok or r.market != Market.ON_DEMAND.value)
                   for r in ranking.rejected)


def fastest(ranking: Ranking) -> Candidate | None:
    """The candidate with the fewest expected hours (on-demand included), if any."""
    rows = [c for c in ranking.candidates if c.expected_hours is not None
            and not math.isinf(c.expected_hours)]
    return min(rows, key=lambda c: c.expected_hours) if rows else None

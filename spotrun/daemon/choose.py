"""Which pools to try for a launch, best first, by the cost model.

The cost model (spotrun.costmodel) ranks every pool by expected $ per unit of
progress with live prices and spotrun's own reclaim history, so a pool that just
reclaimed the job is tried again only if the model still prefers it after
counting that reclaim. The provider's live view drops pools without capacity now.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Engine

from spotrun.catalog import load_catalog
from spotrun.costmodel import Candidate, DbHistory, rank_candidates
from spotrun.providers.base import Pool, Provider
from spotrun.spec import JobSpec
from spotrun.states import Market, MarketPolicy


@dataclass(frozen=True)
class Choice:
    """A pool to try and the model's figures for it."""

    pool: Pool
    candidate: Candidate


def choose(spec: JobSpec, provider: Provider, settings: Any, engine: Engine, *,
           job_id: str | None = None, steps_done: int = 0, allow_on_demand: bool = False
           ) -> list[Choice]:
    """Candidate pools in preference order for one launch (empty: wait for capacity)."""
    plan = rank_candidates(spec, catalog=load_catalog(), zones=provider.zones(), prices=provider,
                           history=DbHistory(engine), region=settings.region, now=provider.now(),
                           job_id=job_id, steps_done=steps_done)
    view = _market_view(provider, sorted({c.instance_type for c in plan.candidates}))
    return launchable(plan.candidates, spec, allow_on_demand=allow_on_demand, available=view)


def launchable(candidates: list[Candidate], spec: JobSpec, *, allow_on_demand: bool,
               available: dict[tuple[str, str], bool] | None = None) -> list[Choice]:
    """The ranked candidates a launch may try, in order (pure)."""
    # Without a deadline, "auto" waits for spot rather than paying on-demand; the deadline
    # policy decides when on-demand becomes the choice.
    od_ok = spec.policy.market is MarketPolicy.ON_DEMAND or (
        spec.policy.market is MarketPolicy.AUTO and allow_on_demand)
    out: list[Choice] = []
    od_types: set[str] = set()
    for c in candidates:
        if c.market is Market.SPOT:
            if spec.policy.market is MarketPolicy.ON_DEMAND:
                continue
            if available is not None and not available.get((c.instance_type, c.zone), True):
                continue
        else:
            if not od_ok or c.instance_type in od_types:
                continue
            od_types.add(c.instance_type)
        out.append(Choice(Pool(c.instance_type, c.zone, c.market), c))
    return out


def _market_view(provider: Provider, types: list[str]) -> dict[tuple[str, str], bool] | None:
    """(type, zone) -> spot available now, where the provider can tell (the local market can)."""
    fn = getattr(provider, "market_view", None)
    if fn is None:
        return None
    try:
        rows = fn(types)
    except Exception:  # a view is a hint; the launch itself tells the truth
        return None
    return {(r.instance_type, r.zone): bool(r.available) for r in rows}

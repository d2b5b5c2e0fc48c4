"""The daemon's call into the one decision (spotrun.decide), with its live inputs.

The market snapshot and the reclaim-risk hints come from the provider, the history from the
state database, the deadline from the job row (fixed once on the provider's clock);
everything else is `decide` itself.
"""

from __future__ import annotations

from spotrun.catalog import load_catalog
from spotrun.costmodel import DbHistory
from spotrun.costmodel.notice import notice_prior_of
from spotrun.costmodel.risk import risk_model
from spotrun.daemon.context import DaemonContext
from spotrun.db import Job
from spotrun.decide import Placement, decide, hours_left, provider_snapshot
from spotrun.providers.facts import facts_for
from spotrun.spec import JobSpec


def placement_for(ctx: DaemonContext, job: Job, spec: JobSpec) -> Placement:
    """Where the job's next attempt should run, decided on what the daemon sees now."""
    catalog = load_catalog()
    market = provider_snapshot(ctx.provider, catalog.names(), spec.resources.zones or None)
    types = list(spec.resources.instance_types or catalog.names())
    risk = risk_model(catalog, hints=ctx.provider.risk_hints(types, list(market.zones)))
    return decide(spec, catalog=catalog, market=market, history=DbHistory(ctx.engine),
                  hours_left=hours_left(spec.policy.deadline, market.at),
                  time_scale=ctx.time_scale, job_id=job.id, steps_done=job.last_step, risk=risk,
                  notice=notice_prior_of(facts_for(ctx.settings), ctx.settings))

"""`spotrun submit --dry-run`: the ranked candidates and the launch plan; nothing is written."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from rich.console import Console
from rich.table import Table

from spotrun.catalog import load_catalog
from spotrun.config import Settings
from spotrun.costmodel import CatalogPrices, NoHistory, rank_candidates
from spotrun.daemon.choose import launchable
from spotrun.daemon.scheduler import MAX_CANDIDATES, build_agent_config
from spotrun.db import Attempt, Job
from spotrun.jobs import Submission
from spotrun.providers import make_provider
from spotrun.providers.base import TAG_ATTEMPT, TAG_JOB, TAG_MANAGED, LaunchRequest
from spotrun.states import JobState
from spotrun.zones import known_zones
import json


def dry_run_plan(sub: Submission, settings: Settings) -> dict[str, Any]:
    """What the first launch would do, from catalog prices and no history (pure)."""
    catalog = load_catalog()
    spec = sub.spec
    plan = rank_candidates(spec, catalog=catalog, zones=known_zones(settings),
                           prices=CatalogPrices(catalog, settings.region), history=NoHistory(),
                           region=settings.region, now=datetime.now(timezone.utc))
    choices = launchable(plan.candidates, spec,
                         allow_on_demand=spec.policy.deadline is not None)[:MAX_CANDIDATES]
    out: dict[str, Any] = {"job_id": sub.job_id, "name": spec.name,
                           "checkpoint_uri": sub.checkpoint_uri,
                           "candidates": [c.candidate.to_dict() for c in choices],
                           "infeasible": [{"instance_type": i.instance_type, "reason": i.reason}
                                          for i in plan.infeasible],
                           "launch": None}
    if not choices:
        return out
    job = Job(id=sub.job_id, name=spec.name, state=JobState.QUEUED,
              spec_json=json.dumps(spec.to_dict()), store_uri=sub.store_uri,
              checkpoint_uri=sub.checkpoint_uri, bundle_key=None)
    first = choices[0].candidate
    attempt = Attempt(job_id=job.id, number=1, market=first.market,
                      instance_type=first.instance_type, zone=first.zone,
                      price_usd_per_hour=first.price_usd_per_hour, client_token="<dry-run>",
                      gpus=first.gpus, checkpoint_interval_s=first.checkpoint_interval_s)
    provider = make_provider(settings)  # constructing a provider calls no cloud
    request = LaunchRequest(
        job_id=job.id, attempt_number=1, client_token=attempt.client_token,
        candidates=tuple(c.pool for c in choices),
        user_data=build_agent_config(settings, provider.name, job, attempt).to_json(),
        tags={TAG_JOB: job.id, TAG_ATTEMPT: "1", TAG_MANAGED: "true"},
        max_price_usd_per_hour=spec.policy.max_price_usd_per_hour)
    out["launch"] = provider.plan_launch(request).to_dict()
    return out


def print_plan(plan: dict[str, Any]) -> None:
    """The dry-run as tables."""
    console = Console()
    console.print(f"[bold]dry run[/bold]: {plan['name']} (would be {plan['job_id']}); "
                  f"checkpoints to {plan['checkpoint_uri']}; nothing was written")
    t = Table(title="launch candidates, in the order the first launch tries them")
    for col in ("#", "type", "zone", "market", "$/h", "$/ref-h", "exp. h", "exp. $"):
        t.add_column(col)
    for i, c in enumerate(plan["candidates"], 1):
        t.add_row(str(i), c["instance_type"], c["zone"], c["market"],
                  f"{c['price_usd_per_hour']:.3f}", f"{c['usd_per_reference_hour']:.3f}",
                  "-" if c["expected_hours"] is None else f"{c['expected_hours']:.1f}",
                  "-" if c["expected_usd"] is None else f"{c['expected_usd']:.2f}")
    console.print(t)
    if plan["launch"]:
        console.print(f"provider {plan['launch']['provider']} would make these calls:")
        for call in plan["launch"]["calls"]:
            console.print(f"  {json.dumps(call, default=str)[:300]}")
    else:
        console.print("[bold red]no pool can take this job now[/bold red]")

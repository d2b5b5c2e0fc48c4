"""`spotrun submit --dry-run`: the decision and the launch plan; nothing is written."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table

from spotrun.catalog import load_catalog
from spotrun.decide.from_settings import decide_for_cli, live_market
from spotrun.config import Settings
from spotrun.jobs import Submission
from spotrun.providers.base import TAG_ATTEMPT, TAG_JOB, TAG_MANAGED, LaunchRequest, Pool


def dry_run_plan(sub: Submission, settings: Settings) -> dict[str, Any]:
    """What the first launch would do, decided on the market the daemon will see (pure)."""
    from spotrun.daemon.scheduler import AttemptPlan, build_agent_config
    catalog = load_catalog()
    spec = sub.spec
    market, provider = live_market(settings, catalog, list(spec.resources.zones) or None)
    placed = decide_for_cli(spec, settings, catalog, market, provider=provider)
    out: dict[str, Any] = {"job_id": sub.job_id, "name": spec.name,
                           "checkpoint_uri": sub.checkpoint_uri, **placed.to_dict(),
                           "launch": None}
    first = placed.first
    if first is None:
        return out
    # The agent's config from the same values the daemon will use (no database rows).
    plan = AttemptPlan(job_id=sub.job_id, spec=spec, store_uri=sub.store_uri,
                       checkpoint_uri=sub.checkpoint_uri, bundle_key=None, attempt=1,
                       gpus=first.gpus, checkpoint_interval_s=first.checkpoint_interval_s)
    request = LaunchRequest(
        job_id=sub.job_id, attempt_number=1, client_token="<dry-run>",
        candidates=tuple(Pool(c.instance_type, c.zone, c.market) for c in placed.candidates),
        user_data=build_agent_config(settings, plan).to_json(),
        tags={TAG_JOB: sub.job_id, TAG_ATTEMPT: "1", TAG_MANAGED: "true"},
        max_price_usd_per_hour=spec.policy.max_price_usd_per_hour,
        # A multi-node job's first launch is one group of all its nodes in one pool.
        count=spec.resources.nodes, node_ranks=tuple(range(spec.resources.nodes)))
    out["launch"] = provider.plan_launch(request).to_dict()
    return out


def print_plan(plan: dict[str, Any]) -> None:
    """The dry-run as tables."""
    console = Console()
    console.print(f"[bold]dry run[/bold]: {plan['name']} (would be {plan['job_id']}); "
                  f"checkpoints to {plan['checkpoint_uri']}; prices: {plan['prices']['source']}; "
                  f"nothing was written")
    t = Table(title="launch candidates, in the order the first launch tries them")
    for col in ("#", "type", "zone", "market", "GPUs", "$/h", "$/ref-h", "exp. h", "exp. $"):
        t.add_column(col)
    for i, c in enumerate(plan["candidates"], 1):
        t.add_row(str(i), c["instance_type"], c["zone"], c["market"],
                  f"{c['gpus_used']}/{c['node_gpus']}", f"{c['price_usd_per_hour']:.3f}",
                  f"{c['usd_per_reference_hour']:.3f}",
                  "-" if c["expected_hours"] is None else f"{c['expected_hours']:.1f}",
                  "-" if c["expected_usd"] is None else f"{c['expected_usd']:.2f}")
    console.print(t)
    for w in plan.get("warnings") or []:
        console.print(f"[yellow]warning:[/yellow] {w}")
    if plan["launch"]:
        console.print(f"provider {plan['launch']['provider']} would make these calls:")
        for call in plan["launch"]["calls"]:
            console.print(f"  {json.dumps(call, default=str)[:300]}")
    else:
        console.print(f"[bold red]nothing launches now[/bold red]: {plan.get('wait_reason')}")

"""`spotrun submit --dry-run`: the decision and the launch plan; nothing is written."""

from __future__ import annotations

import json
from typing import Any, Sequence

from rich.console import Console

from spotrun.agent.contract import AttemptPlan, first_ranks, launch_request
from spotrun.cli.marketview import decide_on_market
from spotrun.cli.tables import Column, print_table
from spotrun.config import Settings
from spotrun.decide import Candidate
from spotrun.jobs import Submission
from spotrun.providers.base import LaunchRequest, Pool
from spotrun.providers.facts import catalog_for


def dry_run_plan(sub: Submission, settings: Settings) -> dict[str, Any]:
    """What the first launch would do, decided on the market the daemon will see (pure)."""
    catalog = catalog_for(settings)
    spec = sub.spec
    # The same market plan reads (spotrun/cli/marketview.py), so both pick the same pool.
    view, placed = decide_on_market(spec, settings, catalog, list(spec.resources.zones) or None)
    provider = view.provider
    out: dict[str, Any] = {"job_id": sub.job_id, "name": spec.name,
                           "checkpoint_uri": sub.checkpoint_uri,
                           **view.annotate(placed.to_dict()), "launch": None}
    first = placed.first
    if first is None or provider is None:
        return out
    request = dry_run_request(sub, settings, first, placed.candidates)
    out["launch"] = provider.plan_launch(request).to_dict()
    return out


def dry_run_request(sub: Submission, settings: Settings, first: Candidate,
                    candidates: Sequence[Candidate]) -> LaunchRequest:
    """The first launch's request, as the scheduler builds it (spotrun.agent.contract) from the
    values it will have: no database rows, no bundle yet."""
    plan = AttemptPlan(job_id=sub.job_id, spec=sub.spec, store_uri=sub.store_uri,
                       checkpoint_uri=sub.checkpoint_uri, bundle_key=None, attempt=1,
                       gpus=first.gpus, checkpoint_interval_s=first.checkpoint_interval_s,
                       project=sub.spec.project, owner=sub.job_owner())
    pools = [Pool(c.instance_type, c.zone, c.market) for c in candidates]
    return launch_request(settings, plan, pools, client_token="<dry-run>",
                          ranks=first_ranks(sub.spec))


def print_plan(plan: dict[str, Any], *, wide: bool = False) -> None:
    """The dry-run as tables (every column with wide)."""
    console = Console()
    prices = plan["prices"].get("summary") or plan["prices"]["source"]
    console.print(f"[bold]dry run[/bold]: {plan['name']} (would be {plan['job_id']}); "
                  f"checkpoints to {plan['checkpoint_uri']}; prices: {prices}; "
                  f"nothing was written")
    rows = []
    for i, c in enumerate(plan["candidates"], 1):
        nodes = c.get("nodes") or 1
        per_node = f"{c['price_usd_per_hour']:.3f}"
        rows.append({
            "n": str(i), "type": c["instance_type"], "zone": c["zone"], "market": c["market"],
            # GPUs used / the node's GPUs, per node; N nodes price as N instances.
            "gpus": (f"{nodes}x" if nodes > 1 else "") + f"{c['gpus_used']}/{c['node_gpus']}",
            "price": per_node if nodes == 1 else
            f"{per_node} x{nodes} = {c['price_usd_per_hour'] * nodes:.2f}",
            "ref": f"{c['usd_per_reference_hour']:.3f}",
            "hours": "-" if c["expected_hours"] is None else f"{c['expected_hours']:.1f}",
            "usd": "-" if c["expected_usd"] is None else f"{c['expected_usd']:.2f}"})
    print_table(console, "launch candidates, in the order the first launch tries them", [
        Column("n", "#"), Column("type", "type"), Column("zone", "zone"),
        Column("market", "market"), Column("gpus", "GPUs"), Column("price", "$/h"),
        Column("ref", "$/ref-h", 2), Column("hours", "exp. h", 3), Column("usd", "exp. $", 1)],
        rows, wide=wide)
    for w in plan.get("warnings") or []:
        console.print(f"[yellow]warning:[/yellow] {w}")
    if plan["launch"]:
        console.print(f"provider {plan['launch']['provider']} would make these calls:")
        for call in plan["launch"]["calls"]:
            console.print(f"  {json.dumps(call, default=str)[:300]}")
    elif any(c.get("launch") for c in plan["candidates"]):
        # Catalog prices stood in for an unreadable market: no provider to plan the calls.
        console.print("no launch calls shown: the provider's market could not be read")
    else:
        console.print(f"[bold red]nothing launches now[/bold red]: {plan.get('wait_reason')}")

"""`spotrun submit --dry-run`: the decision and the launch plan; nothing is written."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console

from spotrun.cli.tables import Column, print_table


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

"""`spotrun plan` through the team server: decided on the server's market, printed here."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from spotrun.cli.common import backend, echo_json
from spotrun.cli.tables import Column, print_table


def plan_remote(spec_files: tuple[str, ...], *, as_json: bool, zones: tuple[str, ...],
                offline: bool, top: int, wide: bool) -> None:
    """Send the spec files to the server's `POST /plan`; print its answer as plan does."""
    wanted = [z.strip() for item in zones for z in item.split(",") if z.strip()]
    out = backend().plan(list(spec_files), zones=wanted, offline=offline)  # type: ignore
    if as_json:
        echo_json(out[0] if len(out) == 1 else out)
        return
    console = Console()
    for i, one in enumerate(out):
        if i:
            console.print()
        print_plan_dict(console, one, top=top, wide=wide)


def print_plan_dict(console: Console, d: dict[str, Any], *, top: int, wide: bool) -> None:
    """One file's plan from its `--json` object (the candidates that launch, in order)."""
    prices = (d.get("prices") or {}).get("summary") or (d.get("prices") or {}).get("source")
    console.print(f"[bold]spotrun plan[/] ({d['spec_file']}): prices: {prices}; "
                  "decided on the team server")
    cands = d.get("candidates") or []
    shown = cands if top == 0 else cands[:top]
    rows = []
    for i, c in enumerate(shown, 1):
        nodes = c.get("nodes") or 1
        rows.append({
            "n": str(i) if c.get("launch") else f"({i})", "type": c["instance_type"],
            "zone": c["zone"], "market": c["market"],
            "gpus": (f"{nodes}x" if nodes > 1 else "") + f"{c['gpus_used']}/{c['node_gpus']}",
            "price": f"{c['price_usd_per_hour']:.3f}",
            "ref": f"{c['usd_per_reference_hour']:.3f}",
            "usd": "-" if c["expected_usd"] is None else f"{c['expected_usd']:,.2f}"})
    print_table(console, None, [
        Column("n", "#"), Column("type", "type"), Column("zone", "zone"),
        Column("market", "market"), Column("gpus", "GPUs", 2), Column("price", "$/h"),
        Column("ref", "$/ref-h", 1), Column("usd", "exp. $", 1)], rows, wide=wide)
    if len(shown) < len(cands):
        console.print(f"... {len(cands) - len(shown)} more candidates (--top 0 for all, "
                      "--json for every figure)", highlight=False)
    if d.get("wait_reason"):
        console.print(f"[bold yellow]nothing launches now[/]: {d['wait_reason']}")
    for w in d.get("warnings") or []:
        console.print(f"[yellow]warning:[/] {w}")

"""`spotrun plan job.yaml`: the decision, every candidate by modelled $ per unit of progress."""

from __future__ import annotations

import click
from rich import box
from rich.console import Console
from rich.table import Table

from spotrun.catalog import load_catalog
from spotrun.cli.common import echo_json, get_settings, json_option
from spotrun.decide.from_settings import decide_for_cli, live_market, offline_market
from spotrun.decide import Candidate, Placement
from spotrun.errors import BadInputError
from spotrun.spec import load_spec_file
from spotrun.states import Market
from spotrun.zones import known_zones


@click.command(name="plan")
@click.argument("spec_file", metavar="JOB.yaml", type=click.Path(dir_okay=False))
@json_option
@click.option("--zones", "zones_opt", multiple=True, metavar="ZONE",
              help="Zones to consider (repeat or comma-separate); default: all known.")
@click.option("--live", is_flag=True,
              help="Decide on the provider's market as the daemon sees it (a running local "
                   "market or its trace; EC2 prices), not the catalog's price snapshot.")
@click.option("--top", type=click.IntRange(min=0), default=20, show_default=True,
              help="Table rows to show (0 = all); --json always carries every candidate.")
def plan(spec_file: str, as_json: bool, zones_opt: tuple[str, ...], live: bool, top: int) -> None:
    """Rank instance candidates for a job by modelled cost per unit of progress.

    The same decision as `submit --dry-run` and the daemon: a job that can never run
    (memory, GPUs per node, filters, deadline) exits 2 with the reason.
    """
    settings = get_settings()
    catalog = load_catalog()
    known = known_zones(settings)
    spec = load_spec_file(spec_file, instance_types=catalog.names(), zones=known)
    zones = _zones(zones_opt, known)
    provider = None
    if live:
        market, provider = live_market(settings, catalog, zones)
    else:
        market = offline_market(settings, catalog, zones)
    placed = decide_for_cli(spec, settings, catalog, market, provider=provider)
    if as_json:
        echo_json(placed.to_dict())
        return
    _print(placed, spec.name, top, spec.work.total_steps)


def _zones(zones_opt: tuple[str, ...], known: list[str]) -> list[str]:
    wanted = [z.strip() for item in zones_opt for z in item.split(",") if z.strip()]
    for z in wanted:
        if z not in known:
            raise BadInputError(f"unknown zone {z!r}; allowed: {', '.join(known)}",
                                field="--zones", value=z)
    return wanted or known


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _row(c: Candidate, rank: str, scale: float) -> list[str]:
    return [rank, c.instance_type, c.zone, "od" if c.market is Market.ON_DEMAND else "spot",
            (f"{c.nodes}x" if c.nodes > 1 else "") + f"{c.gpus}/{c.node_gpus}",
            _fmt(c.price_usd_per_hour, ".3f") + (
                f" x{c.nodes} = {c.price_usd_per_hour * c.nodes:.2f}" if c.nodes > 1 else ""),
            _fmt(c.speedup, ".2f"), _fmt(c.progress_fraction, ".1%"),
            _fmt(c.usd_per_reference_hour, ".3f"), _fmt(c.expected_hours, ".1f"),
            _fmt(c.expected_usd, ",.2f"), _fmt(c.reclaims_per_hour, ".2f"),
            f"{c.checkpoint_interval_s / 60:.0f} min"]


def _work_text(work_reference_hours: float | None, total_steps: int | None) -> str:
    """What the plan knows of the job's size, in the spec's own terms."""
    if work_reference_hours is not None:
        return f"{work_reference_hours:.1f} reference-hours of work"
    if total_steps is not None:
        return (f"{total_steps} steps (work.total_steps), no measured speed yet: rates only "
                "(work.reference_hours gives hours and $)")
    return "size unknown (give work.reference_hours or work.total_steps): rates only"


def _prices_text(source: str) -> str:
    """Where the $/h figures come from; the catalog's are list prices, not a market's."""
    if source == "catalog snapshot":
        return "catalog prices (the packaged snapshot, not a live market; --live for that)"
    return source


def _print(placed: Placement, name: str, top: int, total_steps: int | None = None) -> None:
    # The table needs ~130 columns; a narrower (or piped) console would elide the figures.
    r = placed.ranking
    multi = r.candidates[0].nodes if r.candidates else 1   # "$/h x N = total" needs ~20 more
    console = Console(width=max(Console().width, 132 if multi == 1 else 152))
    what = _work_text(r.work_reference_hours, total_steps)
    console.print(f"[bold]spotrun plan: {name}[/]: {what}; speedup is over "
                  f"{r.reference_instance}; prices: {_prices_text(placed.market.source)}")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("#", "type", "zone", "market", "GPUs", "$/h", "speedup", "progress", "$/ref-h",
                "exp. h", "exp. $", "reclaims/h", "ckpt"):
        table.add_column(col, justify="left" if col in ("type", "zone", "market") else "right",
                         no_wrap=True)
    if r.reference is not None:
        table.add_row(*_row(r.reference, "ref", placed.time_scale), style="bold cyan",
                      end_section=True)
    rows = placed.ordered()
    shown = rows if top == 0 else rows[:top]
    for i, c in enumerate(shown, 1):
        launch = i <= len(placed.candidates)
        table.add_row(*_row(c, str(i) if launch else f"({i})", placed.time_scale),
                      style=None if launch and not c.misses_deadline else "dim")
    console.print(table)
    console.print("GPUs = used/on the node (the whole node is paid); ( ) = not launched now; "
                  "exp. = expected for the remaining work")
    if multi > 1:
        console.print(f"{multi} nodes: $/h = per node x nodes = total; speedup and "
                      f"exp. are for all nodes together (EFA types scale better across nodes)")
    if len(shown) < len(rows):
        console.print(f"... {len(rows) - len(shown)} more candidates "
                      f"(--top 0 for all, --json for every figure)")
    if placed.wait_reason:
        console.print(f"[bold yellow]nothing launches now[/]: {placed.wait_reason}")
    for w in placed.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    for note in r.notes:
        console.print(f"note: {note}")
    never = [x for x in r.rejected if x.kind == "never"]
    if never:
        bad = Table(title="cannot run the job", title_justify="left", box=box.SIMPLE_HEAD)
        bad.add_column("type")
        bad.add_column("reason")
        seen: set[str] = set()
        for x in never:
            if x.instance_type not in seen:
                seen.add(x.instance_type)
                bad.add_row(x.instance_type, x.reason)
        console.print(bad)

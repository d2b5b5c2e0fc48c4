"""`spotrun plan JOB.yaml...`: the decision, every candidate by modelled $ per unit of progress."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from spotrun.backends import remote_wanted
from spotrun.cli.common import echo_json, get_settings, json_option, local_only
from spotrun.planning.market_view import MarketView
from spotrun.planning.plans import load_named, plan_json, plan_specs, zones_wanted
from spotrun.cli.tables import Column, print_table
from spotrun.decide import Candidate, Placement
from spotrun.errors import BadInputError
from spotrun.states import Market
from spotrun.clouds import spec_zones
from spotrun.config import Settings
from spotrun.decide.clouds import NOWHERE, CheckpointAt
from spotrun.planning.across_clouds import checkpoint_at

# Priority 0 is always shown; at a narrow width the highest numbers go first.
COLUMNS = [
    Column("rank", "#"), Column("type", "type"), Column("zone", "zone"),
    Column("market", "market"), Column("gpus", "GPUs", 2, "right"),
    Column("price", "$/h", 0, "right"), Column("speedup", "speedup", 5, "right"),
    Column("progress", "progress", 4, "right"), Column("ref", "$/ref-h", 1, "right"),
    Column("hours", "exp. h", 3, "right"), Column("usd", "exp. $", 1, "right"),
    Column("reclaims", "reclaims/h", 6, "right"), Column("ckpt", "ckpt", 7, "right")]
# With several clouds (or a move priced with --resume-from): each row's cloud, the egress
# of moving the checkpoint there and the copy's time before its first step.
CLOUD_COLUMNS = [Column("cloud", "cloud", 1), Column("egress", "egress $", 2, "right"),
                 Column("copy", "copy", 3, "right")]


@click.command(name="plan")
@click.argument("spec_files", metavar="JOB.yaml...", nargs=-1, required=True,
                type=click.Path(dir_okay=False))
@json_option
@click.option("--zones", "zones_opt", multiple=True, metavar="ZONE",
              help="Zones to consider (repeat or comma-separate); default: the spec's, else "
                   "every zone the provider offers.")
@click.option("--offline", is_flag=True,
              help="Decide on the packaged catalog's prices instead of the market the daemon "
                   "reads.")
# The market the daemon reads is the default now; --live stays so old scripts keep working.
@click.option("--live", is_flag=True, hidden=True)
@click.option("--top", type=click.IntRange(min=0), default=20, show_default=True,
              help="Table rows to show (0 = all); --json always carries every candidate.")
@click.option("--wide", is_flag=True, help="Show every column, however wide the terminal.")
@click.option("--resume-from", "resume_from", metavar="CLOUD", default=None,
              help="Plan a resumed attempt whose checkpoint is in CLOUD (one of `providers`): "
                   "a candidate in another cloud pays the checkpoint's egress and waits for "
                   "its copy (needs --checkpoint-gb).")
@click.option("--checkpoint-gb", "checkpoint_gb", type=click.FloatRange(min=0, min_open=True),
              default=None, metavar="GB", help="The resume checkpoint's size, GB (10^9 bytes).")
def plan(spec_files: tuple[str, ...], as_json: bool, zones_opt: tuple[str, ...], offline: bool,
         live: bool, top: int, wide: bool, resume_from: str | None,
         checkpoint_gb: float | None) -> None:
    """Rank instance candidates for each job by modelled cost per unit of progress.

    The same decision, on the same market, as `submit --dry-run` and the daemon: on the
    local provider the running market, else its trace at the start row (nothing is
    started); on AWS, EC2's prices. --offline uses the catalog's prices. A job that can
    never run (memory, GPUs per node, filters, deadline) exits 2 with the reason; with
    several spec files nothing is printed unless every one can be planned. --json prints
    one object for one file, a list for several.
    """
    if offline and live:
        raise BadInputError("--live and --offline exclude each other", field="--offline",
                            hint="the market the daemon reads is the default; --offline "
                                 "alone for the catalog's prices")
    if remote_wanted(local_only()):
        from spotrun.cli.plan_remote import plan_remote   # lazy: httpx, only when remote
        plan_remote(spec_files, as_json=as_json, zones=zones_opt, offline=offline, top=top,
                    wide=wide)
        return
    settings = get_settings()
    at = resume_point_of(settings, resume_from, checkpoint_gb)
    several = len(spec_files) > 1
    zones_wanted(zones_opt, spec_zones(settings))
    # Every spec is read before any is decided: a bad one anywhere prints nothing.
    specs = [(path, load_named(path, settings, several)) for path in spec_files]
    planned = plan_specs(settings, specs, zones_opt, offline, at=at)
    clouds = len(settings.clouds) > 1 or at.cloud is not None
    if as_json:
        out = plan_json(planned)
        echo_json(out[0] if len(out) == 1 else out)
        return
    console = Console()
    for i, (path, spec, view, placed) in enumerate(planned):
        if i:
            console.print()
        _print(console, placed, spec.name, view, top=top, wide=wide,
               total_steps=spec.work.total_steps, path=path if len(planned) > 1 else None,
               clouds=clouds)


def resume_point_of(settings: Settings, cloud: str | None, gb: float | None) -> CheckpointAt:
    """--resume-from / --checkpoint-gb as the checkpoint a decision moves (both or neither)."""
    if (cloud is None) != (gb is None):
        raise BadInputError("--resume-from and --checkpoint-gb go together",
                            field="--resume-from" if cloud is None else "--checkpoint-gb",
                            hint="e.g. --resume-from aws --checkpoint-gb 40")
    if cloud is None or gb is None:
        return NOWHERE
    if cloud not in settings.clouds:
        raise BadInputError(f"not a configured cloud; allowed: {', '.join(settings.clouds)}",
                            field="--resume-from", value=cloud)
    return checkpoint_at(settings, cloud, int(gb * 1e9))


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _copy_text(seconds: float) -> str:
    if seconds <= 0:
        return "-"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _row(c: Candidate, rank: str) -> dict[str, str]:
    price = _fmt(c.price_usd_per_hour, ".3f")
    if c.nodes > 1 and c.price_usd_per_hour is not None:
        price += f" x{c.nodes} = {c.price_usd_per_hour * c.nodes:.2f}"
    return {"rank": rank, "type": c.instance_type, "zone": c.zone,
            "market": "od" if c.market is Market.ON_DEMAND else "spot",
            "gpus": (f"{c.nodes}x" if c.nodes > 1 else "") + f"{c.gpus}/{c.node_gpus}",
            "price": price, "speedup": _fmt(c.speedup, ".2f"),
            "progress": _fmt(c.progress_fraction, ".1%"),
            "ref": _fmt(c.usd_per_reference_hour, ".3f"), "hours": _fmt(c.expected_hours, ".1f"),
            "usd": _fmt(c.expected_usd, ",.2f"), "reclaims": _fmt(c.reclaims_per_hour, ".2f"),
            "ckpt": f"{c.checkpoint_interval_s / 60:.0f} min", "cloud": c.cloud or "-",
            "egress": f"{c.egress_usd:,.2f}" if c.egress_usd else "-",
            "copy": _copy_text(c.transfer_s)}


def _work_text(work_reference_hours: float | None, total_steps: int | None) -> str:
    """What the plan knows of the job's size, in the spec's own terms."""
    if work_reference_hours is not None:
        return f"{work_reference_hours:.1f} reference-hours of work"
    if total_steps is not None:
        return (f"{total_steps} steps (work.total_steps), no measured speed yet: rates only "
                "(work.reference_hours gives hours and $)")
    return "size unknown (give work.reference_hours or work.total_steps): rates only"


def _print(console: Console, placed: Placement, name: str, view: MarketView, *, top: int,
           wide: bool, total_steps: int | None = None, path: str | None = None,
           clouds: bool = False) -> None:
    r = placed.ranking
    multi = r.candidates[0].nodes if r.candidates else 1
    what = _work_text(r.work_reference_hours, total_steps)
    where = f" ({path})" if path else ""
    console.print(f"[bold]spotrun plan: {name}[/]{where}: {what}; speedup is over "
                  f"{r.reference_instance}; prices: {view.prices_text()}")
    rows: list[dict[str, str]] = []
    styles: list[str | None] = []
    if r.reference is not None:
        rows.append(_row(r.reference, "ref"))
        styles.append("bold cyan")
    ordered = placed.ordered()
    shown = ordered if top == 0 else ordered[:top]
    for i, c in enumerate(shown, 1):
        launch = i <= len(placed.candidates)
        rows.append(_row(c, str(i) if launch else f"({i})"))
        styles.append(None if launch and not c.misses_deadline else "dim")
    columns = COLUMNS[:3] + CLOUD_COLUMNS[:1] + COLUMNS[3:] + CLOUD_COLUMNS[1:] if clouds \
        else COLUMNS
    print_table(console, None, columns, rows, wide=wide, row_styles=styles,
                sections_after=(0,) if r.reference is not None else ())
    console.print("GPUs = used/on the node (the whole node is paid); ( ) = not launched now; "
                  "exp. = expected for the remaining work", highlight=False)
    if multi > 1:
        console.print(f"{multi} nodes: $/h = per node x nodes = total; speedup and "
                      f"exp. are for all nodes together (EFA types scale better across nodes)",
                      highlight=False)
    if len(shown) < len(ordered):
        console.print(f"... {len(ordered) - len(shown)} more candidates "
                      f"(--top 0 for all, --json for every figure)", highlight=False)
    if placed.wait_reason:
        console.print(f"[bold yellow]nothing launches now[/]: {placed.wait_reason}")
    for w in view.warnings() + list(placed.warnings):
        console.print(f"[yellow]warning:[/] {w}")
    for note in r.notes:
        console.print(f"note: {note}")
    # One row per type (its first reason); the reason wraps beside the type at any width.
    never: dict[str, str] = {}
    for x in r.rejected:
        if x.kind == "never":
            never.setdefault(x.instance_type, x.reason)
    if never:
        console.print("cannot run the job:")
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True)
        grid.add_column(overflow="fold")
        for itype, reason in never.items():
            grid.add_row(f" {itype}", reason)
        console.print(grid, highlight=False)

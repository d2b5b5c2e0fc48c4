"""`spotrun plan job.yaml`: rank instance candidates by modelled $ per reference-hour of progress."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.table import Table

from spotrun.catalog import load_catalog
from spotrun.cli.common import echo_json, get_settings, json_option
from spotrun.config import Settings
from spotrun.costmodel import (Candidate, CatalogPrices, DbHistory, NoHistory, Plan,
                               rank_candidates)
from spotrun.costmodel.history import HistorySource
from spotrun.costmodel.prices import PriceSource
from spotrun.errors import BadInputError
from spotrun.spec import load_spec_file
from spotrun.states import Market


@click.command(name="plan")
@click.argument("spec_file", metavar="JOB.yaml", type=click.Path(dir_okay=False))
@json_option
@click.option("--zones", "zones_opt", multiple=True, metavar="ZONE",
              help="Zones to consider (repeat or comma-separate); default: all known.")
@click.option("--live", is_flag=True,
              help="Use the configured provider's live prices and zones, not the catalog snapshot.")
@click.option("--top", type=click.IntRange(min=0), default=20, show_default=True,
              help="Table rows to show (0 = all); --json always carries every candidate.")
def plan(spec_file: str, as_json: bool, zones_opt: tuple[str, ...], live: bool, top: int) -> None:
    """Rank instance candidates for a job by modelled cost per unit of progress."""
    settings = get_settings()
    catalog = load_catalog()
    provider = None
    if live:
        from spotrun.providers import make_provider
        provider = make_provider(settings)
        known = list(provider.zones())
    else:
        known = _known_zones(settings, catalog.meta)
    spec = load_spec_file(spec_file, instance_types=catalog.names(), zones=known)
    zones = _zones(zones_opt, known)
    prices: PriceSource = provider if provider is not None else CatalogPrices(catalog,
                                                                              settings.region)
    now = provider.now() if provider is not None else datetime.now(timezone.utc)
    result = rank_candidates(spec, catalog=catalog, zones=zones, prices=prices,
                             history=_history(settings), region=settings.region, now=now)
    if as_json:
        echo_json(result.to_dict())
        return
    _print(result, spec.name, top, "live" if live else "catalog snapshot")


def _known_zones(settings: Settings, meta: dict[str, Any]) -> list[str]:
    """The provider's zones (without calling it); else the zones the catalog has priors for."""
    try:
        from spotrun.zones import known_zones
        zones = known_zones(settings)
    except ImportError:
        zones = []
    if zones:
        return zones
    prior_zones = list(((meta.get("preemption_priors") or {}).get("zones") or {}))
    in_region = [z for z in prior_zones if z.startswith(settings.region)]
    return in_region or prior_zones


def _zones(zones_opt: tuple[str, ...], known: list[str]) -> list[str]:
    wanted = [z.strip() for item in zones_opt for z in item.split(",") if z.strip()]
    for z in wanted:
        if z not in known:
            raise BadInputError(f"unknown zone {z!r}; allowed: {', '.join(known)}",
                                field="--zones", value=z)
    return wanted or known


def _history(settings: Settings) -> HistorySource:
    """The state database's history when there is one; reading never creates it."""
    url = settings.database_url
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).exists():
        return NoHistory()
    from spotrun.db import make_engine
    return DbHistory(make_engine(url))


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _row(c: Candidate, rank: str) -> list[str]:
    return [rank, c.instance_type, c.zone, "od" if c.market is Market.ON_DEMAND else "spot", _fmt(c.price_usd_per_hour, ".3f"),
            _fmt(c.speedup, ".2f"), _fmt(c.progress_fraction, ".1%"),
            _fmt(c.usd_per_reference_hour, ".3f"), _fmt(c.expected_hours, ".1f"),
            _fmt(c.expected_usd, ",.0f"), _fmt(c.expected_preemptions, ".1f"),
            f"{c.checkpoint_interval_s / 60:.0f} min"]


def _print(result: Plan, name: str, top: int, price_source: str) -> None:
    # The table needs ~120 columns; a narrower (or piped) console would elide the figures.
    console = Console(width=max(Console().width, 124))
    work = result.work_reference_hours
    what = (f"{work:.1f} reference-hours of work" if work is not None
            else "no work given: rates only")
    console.print(f"[bold]spotrun plan: {name}[/]: {what}; speedup is over "
                  f"{result.reference_instance}; prices: {price_source}")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("#", "type", "zone", "market", "$/h", "speedup", "progress", "$/ref-h",
                "exp. h", "exp. $", "reclaims", "ckpt"):
        table.add_column(col, justify="left" if col in ("type", "zone", "market") else "right",
                         no_wrap=True)
    if result.reference is not None:
        table.add_row(*_row(result.reference, "ref"), style="bold cyan", end_section=True)
    shown = result.candidates if top == 0 else result.candidates[:top]
    for i, c in enumerate(shown, 1):
        table.add_row(*_row(c, str(i)), style="dim" if c.misses_deadline else None)
    console.print(table)
    if len(shown) < len(result.candidates):
        console.print(f"... {len(result.candidates) - len(shown)} more candidates "
                      f"(--top 0 for all, --json for every figure)")
    if not result.candidates:
        console.print("[bold red]no candidate can run this job[/]")
    for note in result.notes:
        console.print(f"note: {note}")
    if result.infeasible:
        bad = Table(title="cannot run the job", title_justify="left", box=box.SIMPLE_HEAD)
        bad.add_column("type")
        bad.add_column("reason")
        for i in result.infeasible:
            bad.add_row(i.instance_type, i.reason)
        console.print(bad)

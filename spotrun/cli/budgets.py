"""`spotrun budgets`: each project and owner budget with what it spent, committed and has left."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console

from spotrun.cli.common import backend, echo_json, json_option
from spotrun.cli.tables import Column, print_table


@click.command()
@click.option("--wide", is_flag=True, help="Show every column, however wide the terminal.")
@json_option
def budgets(wide: bool, as_json: bool) -> None:
    """List the `[budgets]` of spotrun.toml: spent this period (the ledger), committed (what
    running jobs spend until they can be stopped) and left, per project and per owner.

    Periods are UTC calendar days, ISO weeks and months on the provider's clock (the local
    market's runs faster than the wall). `--json` prints a list (docs/audit.md).
    """
    data = backend().budgets()   # [] when no budget is configured
    if not data:
        if as_json:
            echo_json([])
        else:
            click.echo("no budgets: add [budgets.project.NAME] or [budgets.owner.NAME] "
                       "(usd, period) to spotrun.toml; see docs/budgets.md", err=True)
        return
    if as_json:
        echo_json(data)
        return
    print_budgets(Console(), data, wide=wide)


def _money(v: float) -> str:
    return f"{v:,.2f}" if abs(v) >= 10 else f"{v:.4f}"


def print_budgets(console: Console, data: list[dict[str, Any]], *, wide: bool = False) -> None:
    """The budgets as a table that fits the terminal (80 columns in a pipe)."""
    # Which budget, spent and left always; a long name drops the rest before any cell is cut.
    cols = [Column("budget", "budget"),
            Column("period", "period", 2), Column("usd", "budget $", 1, "right"),
            Column("spent", "spent $", 0, "right"),
            Column("committed", "committed $", 4, "right"),
            Column("left", "left $", 0, "right"), Column("used", "used", 5, "right"),
            Column("running", "running", 6, "right"), Column("queued", "queued", 7, "right"),
            Column("stopped", "stopped", 8, "right")]
    rows = [{"budget": f"{d['scope']} {d['name']}",
             "period": d["period_key"] if d["period"] != "total" else "total",
             "usd": _money(d["budget_usd"]), "spent": _money(d["spent_usd"]),
             "committed": _money(d["committed_usd"]), "left": _money(d["left_usd"]),
             "used": f"{d['used_fraction'] * 100:.0f}%", "running": str(len(d["running_jobs"])),
             "queued": str(d["queued_jobs"]), "stopped": str(d["stopped_jobs"])}
            for d in data]
    print_table(console, "budgets (USD; periods on the provider clock, UTC)", cols, rows,
                wide=wide, row_styles=["red" if d["left_usd"] < 0 else None for d in data])

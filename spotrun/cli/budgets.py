"""`spotrun budgets`: each project and owner budget with what it spent, committed and has
left, and where it comes from; `budgets set` and `budgets remove` change them."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console

from spotrun.budgets.source import DATABASE, TOML
from spotrun.cli.common import backend, echo_json, json_option
from spotrun.cli.tables import Column, print_table
from spotrun.config import PERIODS
from spotrun.errors import BadInputError


@click.group(invoke_without_command=True)
@click.option("--wide", is_flag=True, help="Show every column, however wide the terminal.")
@json_option
@click.pass_context
def budgets(ctx: click.Context, wide: bool, as_json: bool) -> None:
    """List the budgets in force: spent this period (the ledger), committed (what running
    jobs spend until they can be stopped) and left, per project and per owner, and where
    each comes from (spotrun.toml, or `budgets set`, which overrides the toml's).

    Periods are UTC calendar days, ISO weeks and months on the provider's clock (the local
    market's runs faster than the wall). `--json` prints a list (docs/audit.md).
    """
    if ctx.invoked_subcommand is not None:
        return
    data = backend().budgets()   # [] when no budget is configured
    if not data:
        if as_json:
            echo_json([])
        else:
            click.echo("no budgets: `spotrun budgets set SCOPE NAME --usd X --period P`, or "
                       "[budgets.project.NAME] / [budgets.owner.NAME] in spotrun.toml; see "
                       "docs/budgets.md", err=True)
        return
    if as_json:
        echo_json(data)
        return
    print_budgets(Console(), data, wide=wide)


@budgets.command(name="set")
@click.argument("scope")
@click.argument("name")
@click.option("--usd", default=None, help="The budget in USD, a number > 0.")
@click.option("--period", default=None, help="day, week, month (UTC calendar) or total.")
@json_option
def set_cmd(scope: str, name: str, usd: str | None, period: str | None, as_json: bool) -> None:
    """Set (or change) the budget of project or owner NAME; it overrides spotrun.toml's of
    the same name, and the daemon applies it at its next pass. Remotely: admins."""
    if usd is None:
        raise BadInputError("required: the budget in USD", field="--usd")
    if period is None:
        raise BadInputError(f"required; allowed: {', '.join(PERIODS)}", field="--period")
    _done(backend().set_budget(scope, name, usd, period), as_json)


@budgets.command(name="remove")
@click.argument("scope")
@click.argument("name")
@json_option
def remove_cmd(scope: str, name: str, as_json: bool) -> None:
    """Remove the budget `budgets set` gave project or owner NAME (spotrun.toml's budget of
    that name, if any, applies again). Remotely: admins."""
    _done(backend().remove_budget(scope, name), as_json)


def _done(out: dict[str, Any], as_json: bool) -> None:
    """Print what a set or remove left in force."""
    if as_json:
        echo_json(out)
        return
    b = out["budget"]
    what = f"budget {out['scope']} {out['name']}"
    if b is None:
        click.echo(f"{what}: none (removed)")
    else:
        click.echo(f"{what}: ${b['usd']:,.2f} per {b['period']} ({_source(out, long=True)})")


def _source(d: dict[str, Any], *, long: bool = False) -> str:
    """`spotrun.toml`, or `set by ada` (`, over the toml's`; long: with its amount)."""
    if d.get("source") != DATABASE:
        return TOML
    text = f"set by {d.get('set_by') or '?'}"
    over = d.get("overrides_toml")
    if over:
        text += (f", over spotrun.toml's ${over['usd']:,.2f}/{over['period']}" if long
                 else ", over the toml's")
    return text


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
            Column("stopped", "stopped", 8, "right"), Column("source", "source", 3)]
    rows = [{"budget": f"{d['scope']} {d['name']}",
             "period": d["period_key"] if d["period"] != "total" else "total",
             "usd": _money(d["budget_usd"]), "spent": _money(d["spent_usd"]),
             "committed": _money(d["committed_usd"]), "left": _money(d["left_usd"]),
             "used": f"{d['used_fraction'] * 100:.0f}%", "running": str(len(d["running_jobs"])),
             "queued": str(d["queued_jobs"]), "stopped": str(d["stopped_jobs"]),
             "source": _source(d)}
            for d in data]
    print_table(console, "budgets (USD; periods on the provider clock, UTC)", cols, rows,
                wide=wide, row_styles=["red" if d["left_usd"] < 0 else None for d in data])

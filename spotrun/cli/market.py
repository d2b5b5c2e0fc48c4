"""`spotrun market serve|start|stop|status`: the local provider's spot market process."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import click
from rich.console import Console
from rich.table import Table

from spotrun.cli.common import echo_json, get_settings, json_option
from spotrun.errors import BadInputError
from spotrun.providers.local.market.client import (MarketClient, ensure_market, read_live_info,
                                                  stop_market)
from spotrun.providers.local.market.options import MarketOptions
from spotrun.providers.local.market.server import serve as run_server


def _market_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
                     help="Market state dir (default: $SPOTRUN_HOME/market)."),
        click.option("--trace", help="Availability CSV (default: the packaged demo extract)."),
        click.option("--prices", help="Price change-point CSV."),
        click.option("--pool", "pools", multiple=True, help="Trace column to offer (repeat)."),
        click.option("--instance-type", help="The instance type the trace measured."),
        click.option("--time-scale", type=float, help="Market seconds per wall second."),
        click.option("--start-tick", type=int, help="Trace row at the market's start."),
        click.option("--notice-s", type=float, help="Interruption notice lead, market seconds."),
        click.option("--spot-price", type=float, help="Flat spot USD/h (overrides --prices)."),
        click.option("--region", help="Region for on-demand prices."),
        click.option("--grace-s", type=float, help="Wall seconds from SIGTERM to SIGKILL."),
        click.option("--pacing", type=click.Choice(["rehearsal", "fixed"]),
                     help="rehearsal: real time while a job starts, slower during notices."),
        click.option("--startup-max-s", type=float,
                     help="Wall seconds an instance's start-up may hold the clock at x1."),
        click.option("--boot-s", type=float,
                     help="Market seconds an instance boots before its job starts."),
        click.option("--boot-s-for", "boot_s_for", multiple=True, metavar="TYPE=SECONDS",
                     help="Boot time of one instance type (repeat)."),
        click.option("--notice-wall-s", type=float,
                     help="Rehearsal pacing: wall seconds an interruption notice lasts."),
        click.option("--instance-command", hidden=True,
                     help="Tests only: run this instead of the agent."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def _resolve(state_dir: Path | None, **given: Any) -> tuple[Path, MarketOptions]:
    settings = get_settings()
    if given.get("boot_s_for"):
        given["boot_s_by_type"] = _boot_pairs(given["boot_s_for"])
    given.pop("boot_s_for", None)
    names = {"pools": "pools", "spot_price": "spot_price_usd_per_hour"}
    overrides = {names.get(k, k): (tuple(v) if k == "pools" else v) for k, v in given.items()
                 if v is not None and v != ()}
    options = MarketOptions.from_settings(settings, **overrides).validate()
    return (state_dir or settings.home_path / "market").resolve(), options


def _boot_pairs(items: tuple[str, ...]) -> tuple[tuple[str, float], ...]:
    """`TYPE=SECONDS` options as (type, seconds) pairs; one bad item is a BadInputError."""
    pairs = []
    for item in items:
        itype, _, seconds = item.partition("=")
        try:
            pairs.append((itype.strip(), float(seconds)))
        except ValueError:
            raise BadInputError("expected TYPE=SECONDS", field="boot_s_for", value=item) from None
    return tuple(sorted(pairs))


@click.group(name="market")
def market() -> None:
    """The local provider's simulated spot market (a separate, durable process)."""


@market.command()
@_market_options
@click.option("--port", type=int, default=0, hidden=True, help="Port (0 = a free one).")
def serve(state_dir: Path | None, port: int, **given: Any) -> None:
    """Run the market in the foreground (writes STATE_DIR/market.json once ready)."""
    directory, options = _resolve(state_dir, **given)
    raise SystemExit(run_server(directory, options, port))


@market.command()
@_market_options
def start(state_dir: Path | None, **given: Any) -> None:
    """Start the market detached (or find the one running); print its URL."""
    directory, options = _resolve(state_dir, **given)
    client = ensure_market(directory, options)
    click.echo(client.url)


@market.command()
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
def stop(state_dir: Path | None) -> None:
    """Terminate the market's instances, then stop the market."""
    directory = (state_dir or get_settings().home_path / "market").resolve()
    click.echo("stopped" if stop_market(directory) else "no market running")


@market.command()
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
@json_option
def status(state_dir: Path | None, as_json: bool) -> None:
    """Pools, availability now, prices, instances."""
    directory = (state_dir or get_settings().home_path / "market").resolve()
    info = read_live_info(directory)
    if info is None:
        if as_json:
            echo_json({"running": False, "state_dir": str(directory)})
        else:
            click.echo(f"no market running in {directory}")
        return
    data = MarketClient(info["url"]).status()
    data.update(running=True, url=info["url"], pid=info["pid"], state_dir=str(directory))
    if as_json:
        echo_json(data)
        return
    _print_status(data)


def _print_status(data: dict[str, Any]) -> None:
    console = Console()
    t = data["time"]
    console.print(f"market {data['url']} pid {data['pid']}  time {t['now']}  "
                  f"x{t['time_scale']:g}  trace row {t['position']:.1f}/{t['trace_rows']}")
    pools = Table("zone", "type", "spot now", "spot $/h", "on-demand $/h")
    for p in data["pools"]:
        price = p["spot_price_usd_per_hour"]
        pools.add_row(p["zone"], p["instance_type"], "yes" if p["available"] else "no",
                      "-" if price is None else f"{price:.4f}",
                      f"{p['on_demand_price_usd_per_hour']:.4f}")
    console.print(pools)
    inst = Table("id", "type", "zone", "market", "state", "cause", "launched", "ended", "$/h")
    for i in data["instances"]:
        inst.add_row(i["instance_id"], i["instance_type"], i["zone"], i["market"], i["state"],
                     i["cause"] or "", (i["launched_at"] or "")[:19], (i["ended_at"] or "")[:19],
                     "-" if i["price_usd_per_hour"] is None else f"{i['price_usd_per_hour']:.4f}")
    console.print(inst)

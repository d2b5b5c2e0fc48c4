"""`spotrun simulate`: replay a spot trace under scheduling policies (BRIEF section 4)."""

from __future__ import annotations

import csv
import math
import os
import re
import time
from pathlib import Path
from typing import Any

import click

from spotrun.cli.common import echo_json, get_settings, json_option
from spotrun.errors import BadInputError
from spotrun.decide.policy import ALL_POLICY_NAMES, OPTIMAL, POLICIES, Mode
from spotrun.providers.facts import FACTS, facts_for
from spotrun.simulate.clouds import (CloudInput, CloudModels, build_cloud_models, compare_clouds,
                                     known_clouds, select_pools)
from spotrun.simulate.model import SimModel, build_model, pick_starts
from spotrun.simulate.sweep import SimResult, run_policies
from spotrun.traces import load_prices, load_trace

# Every name --policy takes: the default list first, then the candidates run by name only.
KNOWN_POLICIES = [*ALL_POLICY_NAMES, *(n for n in POLICIES if n not in ALL_POLICY_NAMES)]


class Finite(click.FloatRange):
    """A float in a range that is also finite (click's FloatRange lets nan and inf through)."""

    name = "number"

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        """The float, or click's usage error naming the option (exit 2)."""
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


POSITIVE = Finite(min=0, min_open=True)
NON_NEGATIVE = Finite(min=0)


def _is_price_file(path: str) -> bool:
    """True when path reads like a price change-point CSV (its header starts `zone,`)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.readline().strip().lower().startswith("zone,")
    except (OSError, UnicodeDecodeError):
        return False


def _stray_error(trace_path: str | None, stray: list[str]) -> BadInputError:
    """The one-line error for extra words: most often a --trace glob the shell expanded."""
    first = stray[0]
    if _is_price_file(first):
        return BadInputError(f"takes one file; {first} is a price file (pass it with --prices; "
                             "a glob such as *.csv matched it too)", field="--trace",
                             value=trace_path)
    return BadInputError(f"takes one file; {first} is one too many (a glob matching several "
                         "files?)", field="--trace", value=trace_path)


def _check_output(path: str | None) -> Path | None:
    if path is None:
        return None
    p = Path(path)
    if p.is_dir() or not p.parent.is_dir() or not os.access(p.parent, os.W_OK):
        raise BadInputError("must be a file in an existing, writable directory",
                            field="--decisions", value=path)
    return p


def write_decisions(path: Path, result: SimResult) -> int:
    """Write run,policy,tick,mode,pool rows (one per tick each run was active); row count."""
    model = result.model
    n = 0
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["run", "policy", "tick", "mode", "pool"])
        for name, runs in result.runs.items():
            for run, (row, decisions) in enumerate(zip(result.start_rows, runs.decisions or [])):
                for tau, d in enumerate(decisions):
                    w.writerow([run, name, int(model.tick_values[row + tau]), d.mode.value,
                                d.pool if d.mode is Mode.SPOT else ""])
                    n += 1
    return n


def _model_info(model: SimModel, result: SimResult) -> dict:
    return {"pools": model.pools, "tick_s": model.tick_s, "work_ticks": model.work_ticks,
            "deadline_ticks": model.deadline_ticks, "changeover_ticks": model.changeover_ticks,
            "od_price_usd_per_hour": model.history.od_price_usd_per_hour,
            "on_demand_cost_usd": round(model.on_demand_cost_usd(), 4),
            "starts": [int(model.tick_values[r]) for r in result.start_rows]}


def _print_table(model: SimModel, summary: dict, elapsed_s: float) -> None:
    from rich.console import Console
    from rich.table import Table

    runs = next(iter(summary.values()))["runs"]
    table = Table(title=f"{runs} runs on {', '.join(model.pools)}")
    for col in ("policy", "runs", "mean USD", "vs OD", "vs optimal", "met"):
        table.add_column(col, justify="left" if col == "policy" else "right", no_wrap=True)
    for name, s in summary.items():
        vs_opt = s["mean_cost_vs_optimal"]
        table.add_row(name, str(s["runs"]), f"{s['mean_cost_usd']:.2f}",
                      f"{s['mean_cost_vs_on_demand']:.3f}",
                      "-" if vs_opt is None else f"{vs_opt:.3f}",
                      f"{s['deadline_met_fraction']:.0%}")
    console = Console()
    console.print(table)
    console.print(f"tick {model.tick_s:g} s; work {model.work_ticks}, deadline "
                  f"{model.deadline_ticks}, changeover {model.changeover_ticks} ticks; "
                  f"{elapsed_s:.1f} s")


# A cloud's name as a `CLOUD=` prefix may spell it.
_CLOUD_NAME = re.compile(r"[a-z][a-z0-9-]*")


def split_cloud(text: str) -> tuple[str | None, str]:
    """(cloud, rest) of a `CLOUD=VALUE` argument; (None, text) without the prefix (a file
    whose own name holds `=` is taken as it is)."""
    head, sep, rest = text.partition("=")
    if sep and _CLOUD_NAME.fullmatch(head) and not Path(text).exists():
        return head, rest
    return None, text


class PerCloud(click.ParamType):
    """A number, or `CLOUD=number` for one cloud's own value: (cloud or None, number)."""

    name = "[CLOUD=]number"

    def __init__(self, number: Finite) -> None:
        self.number = number

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        """(cloud, number), or click's usage error naming the option (exit 2)."""
        if isinstance(value, tuple):
            return value
        cloud, text = split_cloud(str(value))
        if cloud is None:
            return None, self.number.convert(value, param, ctx)
        try:
            return cloud, self.number.convert(text, param, ctx)
        except click.BadParameter as exc:
            self.fail(f"{cloud}: {exc.message}", param, ctx)


def _clouds_of(traces: tuple[str, ...]) -> list[tuple[str | None, str]]:
    """--trace values as (cloud, path): one plain file, or one CLOUD=CSV per cloud."""
    given = [split_cloud(t) for t in traces]
    if len(given) > 1 and any(c is None for c, _ in given):
        raise BadInputError("given more than once; with several clouds each trace names its "
                            "cloud (--trace aws=a.csv --trace gcp=b.csv)", field="--trace")
    allowed = known_clouds()
    seen: set[str] = set()
    for cloud, _ in given:
        if cloud is None:
            continue
        if cloud not in allowed:
            raise BadInputError(f"unknown cloud {cloud!r}; allowed: {', '.join(allowed)}",
                                field="--trace", value=cloud)
        if cloud in seen:
            raise BadInputError(f"cloud {cloud} is given twice", field="--trace", value=cloud)
        seen.add(cloud)
    return given


def per_cloud(flag: str, given: list[tuple[str | None, Any]], clouds: list[str | None]
              ) -> dict[str | None, Any]:
    """Each cloud's value of a flag: its own `CLOUD=` one, else the plain one (None if none);
    clouds == [None]: the trace names no cloud, so no value may."""
    plain = [v for c, v in given if c is None]
    if len(plain) > 1:
        raise BadInputError("given more than once (one value, or CLOUD=VALUE per cloud)",
                            field=flag)
    out = {c: plain[0] if plain else None for c in clouds}
    seen: set[str] = set()
    for cloud, value in given:
        if cloud is None:
            continue
        if clouds == [None]:
            raise BadInputError(f"{cloud}= names a cloud but --trace names none (give --trace "
                                f"{cloud}=CSV)", field=flag, value=cloud)
        if cloud not in clouds:
            raise BadInputError(f"cloud {cloud!r} has no --trace; allowed: "
                                f"{', '.join(str(c) for c in clouds)}", field=flag, value=cloud)
        if cloud in seen:
            raise BadInputError(f"cloud {cloud} is given twice", field=flag, value=cloud)
        seen.add(cloud)
        out[cloud] = value
    return out


def _one_cloud_model(trace_path: str, pools: tuple[str, ...], prices_path: str | None,
                     spot_price: float | None, od_price: float | None, quarantine_s: float,
                     job: dict) -> SimModel:
    """The model of one cloud's trace, as `simulate` has always built it."""
    trace = load_trace(trace_path)
    if pools:
        if len(set(pools)) != len(pools):
            raise BadInputError("a pool is given twice", field="--pool", value=list(pools))
        unknown = [p for p in pools if p not in trace.pools]
        if unknown:
            raise BadInputError(f"unknown pool {unknown[0]!r}; allowed: {', '.join(trace.pools)}",
                                field="--pool", value=unknown[0])
        trace = trace.select(list(pools))
    prices = load_prices(prices_path) if prices_path else None
    return build_model(trace, prices, spot_price_usd_per_hour=spot_price,
                       od_price_usd_per_hour=od_price,  # type: ignore[arg-type]
                       notice_quarantine_s=quarantine_s, **job)


def _cloud_models(clouds: list[str], paths: dict, pools: tuple[str, ...], prices: dict,
                  spot: dict, od: dict, checkpoint_gb: float, job: dict) -> CloudModels:
    """The models across the clouds and of each alone (each cloud's provider's quarantine)."""
    inputs = []
    for cloud in clouds:
        if od[cloud] is None:
            raise BadInputError(f"no on-demand price for {cloud} (give {cloud}=USD, or one "
                                f"number for every cloud)", field="--od-price")
        try:
            book = load_prices(prices[cloud]) if prices[cloud] else None
        except BadInputError as exc:
            raise BadInputError(f"{cloud}: {exc.message}", field="--prices") from None
        inputs.append(CloudInput(cloud, load_trace(paths[cloud]), book, spot[cloud], od[cloud]))
    if pools:
        inputs = select_pools(inputs, list(pools))
    return build_cloud_models(inputs, checkpoint_gb=checkpoint_gb,
                              quarantine_s={c: FACTS[c].notice_quarantine_s for c in clouds},
                              **job)


def _clouds_info(models: CloudModels) -> dict:
    """The `model` keys a run across clouds adds: each cloud's pools, prices and moves."""
    moves = models.moves
    return {"checkpoint_gb": models.checkpoint_gb, "copy_ticks": moves.copy_ticks,
            "clouds": {c: {"pools": m.pools, "od_price_usd_per_hour": moves.od_usd_per_hour[k],
                           "on_demand_cost_usd": round(m.on_demand_cost_usd(), 4),
                           "egress_usd_per_move": round(moves.egress_usd[k], 4)}
                       for k, (c, m) in enumerate(models.alone.items())}}


def _print_clouds_table(models: CloudModels, summary: dict, elapsed_s: float) -> None:
    """Each policy across the clouds beside each cloud alone, the saving, egress and moves."""
    from rich.console import Console
    from rich.table import Table

    clouds = list(models.alone)
    runs = next(iter(summary.values()))["runs"]
    table = Table(title=f"{runs} runs across {', '.join(clouds)} "
                        f"(checkpoint {models.checkpoint_gb:g} GB)")
    cols = ["policy", "across $", *(f"{c} $" for c in clouds), "saving", "egress $", "moves",
            "met"]
    for col in cols:
        table.add_column(col, justify="left" if col == "policy" else "right", no_wrap=True)
    for name, s in summary.items():
        across = s["mean_cost_usd"]
        saving = s["saving_vs_best_single_cloud_pct"]
        table.add_row(name, "-" if across is None else f"{across:.2f}",
                      *(f"{s['mean_cost_alone_usd'][c]:.2f}" for c in clouds),
                      "-" if saving is None else f"{saving:+.1f}% vs {s['best_single_cloud']}",
                      "-" if s["mean_egress_usd"] is None else f"{s['mean_egress_usd']:.2f}",
                      "-" if s["moves_per_run"] is None else f"{s['moves_per_run']:.2f}",
                      "-" if s["deadline_met_fraction"] is None
                      else f"{s['deadline_met_fraction']:.0%}")
    console = Console()
    console.print(table)
    m, moves = models.across, models.moves
    egress = ", ".join(f"from {c} ${moves.egress_usd[k]:.2f}" for k, c in enumerate(clouds))
    console.print(f"tick {m.tick_s:g} s; work {m.work_ticks}, deadline {m.deadline_ticks}, "
                  f"changeover {m.changeover_ticks} ticks; a move: {egress} egress, "
                  f"{moves.copy_ticks} ticks of copy; {elapsed_s:.1f} s")
    if not moves.free and OPTIMAL in summary:
        console.print("optimal: each cloud alone only (its programme prices no move)")


@click.command(help="What-if: replay a spot trace under scheduling policies.")
@click.option("--trace", "trace_paths", required=True, multiple=True, metavar="[CLOUD=]CSV",
              help="Availability trace (tick, time, pools); one CLOUD=CSV per cloud for "
                   "several clouds.")
@click.option("--pool", "pools", multiple=True, metavar="COL",
              help="Trace column the job may use (repeat; default: all; CLOUD:COL with "
                   "several clouds).")
@click.option("--prices", "prices_paths", multiple=True, metavar="[CLOUD=]CSV",
              help="Spot price change points.")
@click.option("--spot-price", "spot_prices", type=PerCloud(NON_NEGATIVE), multiple=True,
              metavar="[CLOUD=]USD", help="Spot price per hour (no price file, or fallback).")
@click.option("--od-price", "od_prices", type=PerCloud(POSITIVE), required=True, multiple=True,
              metavar="[CLOUD=]USD", help="On-demand price per hour.")
@click.option("--checkpoint-gb", type=NON_NEGATIVE, default=0.0, metavar="G",
              help="Checkpoint size a move between clouds copies [0: moves are free].")
@click.option("--work-hours", type=POSITIVE, required=True, metavar="W",
              help="Productive hours the job needs.")
@click.option("--deadline-hours", type=POSITIVE, required=True, metavar="D",
              help="Hours from start to deadline.")
@click.option("--changeover-hours", type=NON_NEGATIVE, default=0.2, show_default=True,
              metavar="H", help="Paid, unproductive time per launch.")
@click.option("--policy", "policies", multiple=True, metavar="NAME",
              help=f"Policy to run (repeat; default: {', '.join(ALL_POLICY_NAMES)}; also "
                   f"{', '.join(n for n in POLICIES if n not in ALL_POLICY_NAMES)}).")
@click.option("--starts", type=click.IntRange(min=1), metavar="N",
              help="Random starts (seeded) [100].")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, metavar="S",
              help="Seed for the starts.")
@click.option("--t0", "t0", type=int, multiple=True, metavar="TICK",
              help="Start at this trace tick (repeat).")
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
              help="Instances the job needs at once.")
@click.option("--workers", type=click.IntRange(min=1), metavar="N",
              help="Processes to use [min(2, CPUs)].")
@click.option("--decisions", "decisions_path", metavar="FILE.csv",
              help="Write run,policy,tick,mode,pool rows.")
@click.argument("stray", nargs=-1, type=click.UNPROCESSED, metavar="")
@json_option
def simulate(trace_paths, pools, prices_paths, spot_prices, od_prices, checkpoint_gb,
             work_hours, deadline_hours, changeover_hours, policies, starts, seed, t0, nodes,
             workers, decisions_path, stray, as_json) -> None:
    """Run the policies on the same starts and print mean costs and ratios."""
    if stray:
        raise _stray_error(trace_paths[0], list(stray))
    workers = min(2, os.cpu_count() or 1) if workers is None else workers
    if t0 and starts is not None:
        raise BadInputError("give --t0 or --starts, not both", field="--t0")
    names = list(dict.fromkeys(policies)) or list(ALL_POLICY_NAMES)
    for name in names:
        if name not in KNOWN_POLICIES:
            raise BadInputError(f"unknown policy {name!r}; allowed: {', '.join(KNOWN_POLICIES)}",
                                field="--policy", value=name)
    out_path = _check_output(decisions_path)
    traces = _clouds_of(trace_paths)
    clouds = [c for c, _ in traces]
    prices = per_cloud("--prices", [split_cloud(p) for p in prices_paths], clouds)
    spot = per_cloud("--spot-price", list(spot_prices), clouds)
    od = per_cloud("--od-price", list(od_prices), clouds)
    job = dict(work_hours=work_hours, deadline_hours=deadline_hours,
               changeover_hours=changeover_hours, nodes=nodes)
    if len(traces) > 1:
        _simulate_clouds(
            _cloud_models(clouds, dict(traces), pools, prices, spot, od,  # type: ignore[arg-type]
                          checkpoint_gb, job),
            names, starts=starts, seed=seed, t0=t0, workers=workers, out_path=out_path,
            as_json=as_json)
        return
    cloud, trace_path = traces[0]
    # A reclaim of the trace closes its pool as a notice does in the daemon: for the
    # provider's notice_quarantine_s (docs/cost-model.md, "Notice quarantine"): the named
    # cloud's, else the configured provider's.
    facts = FACTS[cloud] if cloud is not None else facts_for(get_settings())
    model = _one_cloud_model(trace_path, pools, prices[cloud], spot[cloud], od[cloud],
                             facts.notice_quarantine_s, job)
    rows = pick_starts(model, starts=starts, seed=seed, t0=list(t0) or None)
    began = time.monotonic()
    result = run_policies(model, rows, names, workers=workers, record=out_path is not None)
    elapsed = time.monotonic() - began
    if out_path is not None:
        write_decisions(out_path, result)
    summary = result.summary()
    if as_json:
        echo_json({"policies": summary, "model": _model_info(model, result)})
    else:
        _print_table(model, summary, elapsed)


def _simulate_clouds(models: CloudModels, names: list[str], *, starts: int | None, seed: int,
                     t0: tuple[int, ...], workers: int, out_path: Path | None,
                     as_json: bool) -> None:
    """Several clouds: every policy across them and in each alone, on the same starts."""
    rows = pick_starts(models.across, starts=starts, seed=seed, t0=list(t0) or None)
    began = time.monotonic()
    result = compare_clouds(models, rows, names, workers=workers, record=out_path is not None)
    elapsed = time.monotonic() - began
    if out_path is not None:
        write_decisions(out_path, result.across)
    summary = result.summary()
    if as_json:
        echo_json({"policies": summary,
                   "model": {**_model_info(models.across, result.across), **_clouds_info(models)},
                   "alone": result.alone_summary()})
    else:
        _print_clouds_table(models, summary, elapsed)

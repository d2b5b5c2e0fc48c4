"""`spotrun simulate`: replay a spot trace under scheduling policies (BRIEF section 4)."""

from __future__ import annotations

import csv
import math
import os
import time
from pathlib import Path

import click

from spotrun.cli.common import echo_json, get_settings, json_option
from spotrun.errors import BadInputError
from spotrun.decide.policy import ALL_POLICY_NAMES, POLICIES, Mode
from spotrun.providers.facts import facts_for
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


@click.command(help="What-if: replay a spot trace under scheduling policies.")
@click.option("--trace", "trace_path", required=True, metavar="CSV",
              help="Availability trace (tick, time, pools).")
@click.option("--pool", "pools", multiple=True, metavar="COL",
              help="Trace column the job may use (repeat; default: all).")
@click.option("--prices", "prices_path", metavar="CSV", help="Spot price change points.")
@click.option("--spot-price", type=NON_NEGATIVE, metavar="USD",
              help="Spot price per hour (no price file, or fallback).")
@click.option("--od-price", type=POSITIVE, required=True, metavar="USD",
              help="On-demand price per hour.")
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
def simulate(trace_path, pools, prices_path, spot_price, od_price, work_hours, deadline_hours,
             changeover_hours, policies, starts, seed, t0, nodes, workers, decisions_path,
             stray, as_json) -> None:
    """Run the policies on the same starts and print mean costs and ratios."""
    if stray:
        raise _stray_error(trace_path, list(stray))
    workers = min(2, os.cpu_count() or 1) if workers is None else workers
    if t0 and starts is not None:
        raise BadInputError("give --t0 or --starts, not both", field="--t0")
    names = list(dict.fromkeys(policies)) or list(ALL_POLICY_NAMES)
    for name in names:
        if name not in KNOWN_POLICIES:
            raise BadInputError(f"unknown policy {name!r}; allowed: {', '.join(KNOWN_POLICIES)}",
                                field="--policy", value=name)
    out_path = _check_output(decisions_path)
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
    # A reclaim of the trace closes its pool as a notice does in the daemon: for the
    # configured provider's notice_quarantine_s (docs/cost-model.md, "Notice quarantine").
    quarantine_s = facts_for(get_settings()).notice_quarantine_s
    model = build_model(trace, prices, spot_price_usd_per_hour=spot_price,
                        od_price_usd_per_hour=od_price, work_hours=work_hours,
                        deadline_hours=deadline_hours, changeover_hours=changeover_hours,
                        nodes=nodes, notice_quarantine_s=quarantine_s)
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

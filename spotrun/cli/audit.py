"""`spotrun audit`: per-job actual spend, on-demand baseline, saving and waste.

Reads the database only (ledger rows, attempts); never calls a cloud. Times in
--since/--until compare with booked provider times (UTC).
"""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from spotrun.audit.groups import BY, group_audits
from spotrun.audit.render import RECLAIM_COLUMNS, TABLE_COLUMNS, cause_rows, cell, flat, \
    notice_lines, reclaim_rows, to_csv, totals
from spotrun.backends import remote_wanted
from spotrun.cli.common import backend, echo_json, get_settings, local_only, open_state_db
from spotrun.contracts import parse_time
from spotrun.db import find_job, iter_jobs, session, utcnow
from spotrun.errors import BadInputError, NotFoundError
from spotrun.audit.plot import plot_audit
from spotrun.cli.audit_by import print_groups, group_reconcile, print_reconcile_groups
from spotrun.cli.tables import Column, print_table
from spotrun.providers.facts import facts_for


@click.command()
@click.argument("jobs", nargs=-1)
@click.option("--since", help="Only spend booked at or after this time "
                              "(ISO-8601, UTC, provider clock).")
@click.option("--until", help="Only spend booked before this time (ISO-8601, UTC, provider clock).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of jobs.")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV: one row per job, then TOTAL.")
@click.option("--wide", is_flag=True, help="Show every column, however wide the terminal.")
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False),
              help="Write cumulative spend vs baseline with reclaims marked (PNG).")
@click.option("--reconcile", "do_reconcile", is_flag=True,
              help="Compare each job's ledger with AWS Cost Explorer (tag spotrun:job).")
@click.option("--by", type=click.Choice(BY), default=None,
              help="Sum the figures per project or per owner (with JOBS, --since, --until, "
                   "--json, --wide or --reconcile).")
def audit(jobs: tuple[str, ...], since: str | None, until: str | None, as_json: bool,
          as_csv: bool, wide: bool, plot_file: str | None, do_reconcile: bool,
          by: str | None) -> None:
    """Actual spend against the on-demand baseline for JOBS (default: every job), or per
    project or owner (`--by`).

    Every dollar lands in one cause (productive, lost work, startup, restart overhead,
    paid idle, checkpoint stall, node replacement, storage, volumes, other); the causes
    sum to `actual_usd`. Hours are on the provider's clock (the local market's is faster
    than the wall). Free reclaims are shown apart, as not charged.
    """
    if as_json and as_csv:
        raise BadInputError("give --json or --csv, not both", field="--csv")
    if do_reconcile:
        _reconcile(list(jobs), as_json, bad=as_csv or plot_file or since or until, by=by)
        return
    if by and (as_csv or plot_file):
        raise BadInputError("combines with JOBS, --since, --until, --json, --wide and "
                            "--reconcile", field="--by", value=by)
    t_since, t_until = parse_time(since, "--since"), parse_time(until, "--until")
    if t_since and t_until and t_until <= t_since:
        raise BadInputError("must be after --since", field="--until", value=until)
    if plot_file and not plot_file.lower().endswith(".png"):
        raise BadInputError("allowed: a file name ending in .png", field="--plot", value=plot_file)
    if plot_file and remote_wanted(local_only()):
        raise BadInputError("draws from the local database only; add --local on the server "
                            "host", field="--plot", value=plot_file)
    result = backend().audit(list(jobs), since=t_since, until=t_until, hindsight=not by)
    if by:
        groups = group_audits(result, by)
        if as_json:
            echo_json([g.to_dict() for g in groups])
        else:
            print_groups(Console(), groups, wide)
        return
    if plot_file:
        plot_audit(result, plot_file)
    if as_json:
        echo_json([j.to_dict() for j in result])
    elif as_csv:
        click.echo(to_csv(result), nl=False)
    else:
        _table(result, wide)
        if plot_file:
            click.echo(f"plot written to {plot_file}", err=True)


def _reconcile(refs: list[str], as_json: bool, bad: object, by: str | None = None) -> None:
    """Ledger vs Cost Explorer per job, or summed per project or owner (aws provider only)."""
    if bad:
        raise BadInputError("--reconcile takes only JOBS, --by and --json",
                            field="--reconcile")
    settings = get_settings()
    reconcile = facts_for(settings).reconcile
    if reconcile is None:
        raise BadInputError("needs a provider whose cloud bills by job tag (aws: Cost Explorer)",
                            field="--reconcile", value=settings.provider)
    engine = open_state_db(settings, refs[0] if refs else None)
    with session(engine) as s:
        jobs = _jobs(s, refs)
        lines = reconcile(settings, s, jobs, utcnow())
    if by:
        grouped = group_reconcile(lines, jobs, by)
        if as_json:
            echo_json(grouped)
        else:
            print_reconcile_groups(Console(), grouped)
        return
    if as_json:
        echo_json([ln.to_dict() for ln in lines])
        return
    t = Table(title="ledger vs Cost Explorer (USD, tagged instances and volumes)")
    for header in ("job", "ledger $", "Cost Explorer $", "difference $", "note"):
        t.add_column(header, justify="left" if header in ("job", "note") else "right")
    for ln in lines:
        note = (f"could not check: {ln.could_not_check}" if ln.could_not_check
                else "estimated" if ln.estimated else "")
        t.add_row(ln.id, cell("actual_usd", ln.ledger_usd),
                  cell("actual_usd", ln.cost_explorer_usd),
                  cell("actual_usd", ln.difference_usd), note)
    Console().print(t)


def _jobs(s, refs: list[str]):
    if not refs:
        return list(iter_jobs(s))
    out = []
    for ref in refs:
        job = find_job(s, ref)
        if job is None:
            raise NotFoundError("no such job", field="JOB", value=ref, hint="see `spotrun status`")
        out.append(job)
    return out


def _table(result, wide: bool = False) -> None:
    console = Console()
    rows = [flat(job) for job in result]
    if len(result) != 1:
        rows.append(totals(result))
    cols = [Column(k, h, p, "left" if k in ("id", "state") else "right")
            for k, h, p in TABLE_COLUMNS]
    text = [{k: (str(r.get(k) or "") if k in ("id", "state") else cell(k, r.get(k)))
             for k, _h, _p in TABLE_COLUMNS} for r in rows]
    print_table(console, "spend audit (USD; baseline = on-demand for the same progress)", cols,
                text, wide=wide,
                bold_rows=[len(result)] if len(result) != 1 else [])
    ccols = [Column("cause", "cause"), Column("usd", "$", 0, "right"),
             Column("hours", "h", 1, "right"), Column("share", "share", 2, "right")]
    for job in result:
        clock = "market" if job.time_scale != 1.0 else "provider"
        print_table(console, f"{job.id}: where the money went (h = {clock}-clock hours)",
                    ccols, cause_rows(job), wide=wide)
        rows = reclaim_rows(job)
        if rows:
            print_table(console, f"{job.id}: reclaims (steps computed again; seconds to train "
                                 f"again, {clock} clock)",
                        [Column(k, h, p, "left" if k == "reclaim" else "right")
                         for k, h, p in RECLAIM_COLUMNS], rows, wide=wide)
        for line in notice_lines(job):
            console.print(f"{job.id}: {line}", highlight=False, markup=False)
    for j in result:
        for n in j.notes:
            console.print(f"note: {j.id}: {n}", highlight=False)
    if any((j.not_charged.usd or 0) > 0 for j in result):
        console.print("note: not charged = spot reclaimed by the provider in its first hour: "
                      "AWS bills nothing for it (not part of actual).", highlight=False)
    if any(j.hindsight_optimal_usd is not None for j in result):
        console.print("note: hindsight optimum = the cheapest schedule knowing the market in "
                      "advance; it pays every second, so free reclaims can beat it (regret < 0).",
                      highlight=False)

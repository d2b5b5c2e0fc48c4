"""`spotrun audit`: per-job actual spend, on-demand baseline, saving and waste.

Reads the database only (ledger rows, attempts); never calls a cloud. Times in
--since/--until compare with booked provider times (UTC).
"""

from __future__ import annotations

from datetime import datetime, timezone

import click
from rich.console import Console
from rich.table import Table

from spotrun.audit import audit_jobs
from spotrun.audit.regret import use_observed_model
from spotrun.audit.render import TABLE_COLUMNS, cell, flat, to_csv, totals
from spotrun.catalog import load_catalog
from spotrun.cli.common import echo_json, get_settings, open_state_db
from spotrun.db import session
from spotrun.errors import BadInputError


def _parse_time(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise BadInputError("allowed: an ISO-8601 time such as 2030-01-31T12:00:00Z",
                            field=name, value=value) from None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def catalog_od_price(region: str):
    """On-demand USD/h by instance type from the packaged catalog (None if unlisted)."""
    cat = load_catalog("aws")

    def price(instance_type: str) -> float | None:
        t = cat.types.get(instance_type)
        return t.on_demand_price(region) if t is not None else None
    return price


@click.command()
@click.argument("jobs", nargs=-1)
@click.option("--since", help="Only spend booked at or after this time (ISO-8601, UTC).")
@click.option("--until", help="Only spend booked before this time (ISO-8601, UTC).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of jobs.")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV: one row per job, then TOTAL.")
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False),
              help="Write cumulative spend vs baseline with reclaims marked (PNG).")
@click.option("--reconcile", "do_reconcile", is_flag=True,
              help="Compare each job's ledger with AWS Cost Explorer (tag spotrun:job).")
def audit(jobs: tuple[str, ...], since: str | None, until: str | None, as_json: bool,
          as_csv: bool, plot_file: str | None, do_reconcile: bool) -> None:
    """Actual spend against the on-demand baseline for JOBS (default: every job)."""
    if as_json and as_csv:
        raise BadInputError("give --json or --csv, not both", field="--csv")
    if do_reconcile:
        _reconcile(list(jobs), as_json, bad=as_csv or plot_file or since or until)
        return
    t_since, t_until = _parse_time(since, "--since"), _parse_time(until, "--until")
    if t_since and t_until and t_until <= t_since:
        raise BadInputError("must be after --since", field="--until", value=until)
    if plot_file and not plot_file.lower().endswith(".png"):
        raise BadInputError("allowed: a file name ending in .png", field="--plot", value=plot_file)
    settings = get_settings()
    use_observed_model(settings)
    engine = open_state_db(settings, jobs[0] if jobs else None)
    with session(engine) as s:
        result = audit_jobs(s, list(jobs), since=t_since, until=t_until,
                            od_price=catalog_od_price(settings.region))
    if plot_file:
        from spotrun.audit.plot import plot_audit
        plot_audit(result, plot_file)
    if as_json:
        echo_json([j.to_dict() for j in result])
    elif as_csv:
        click.echo(to_csv(result), nl=False)
    else:
        _table(result)
        if plot_file:
            click.echo(f"plot written to {plot_file}", err=True)


def _reconcile(refs: list[str], as_json: bool, bad: object) -> None:
    """Ledger vs Cost Explorer per job (aws provider only)."""
    if bad:
        raise BadInputError("--reconcile takes only JOBS and --json", field="--reconcile")
    settings = get_settings()
    if settings.provider != "aws":
        raise BadInputError("needs provider = \"aws\" (Cost Explorer bills AWS usage)",
                            field="--reconcile", value=settings.provider)
    from spotrun.audit.reconcile import reconcile
    from spotrun.aws_clients import RetryPolicy, call, make_client
    from spotrun.db import utcnow
    # Cost Explorer has one endpoint, in us-east-1, whatever region the instances ran in.
    ce = make_client("ce", region="us-east-1", endpoint_url=settings.aws.endpoint_url)
    policy = RetryPolicy.from_settings(settings.aws)
    engine = open_state_db(settings, refs[0] if refs else None)
    with session(engine) as s:
        jobs = _jobs(s, refs)
        lines = reconcile(s, jobs, ce, now=utcnow(),
                          call=lambda fn, **kw: call(policy, fn, **kw))
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
    from spotrun.db import find_job, iter_jobs
    from spotrun.errors import NotFoundError
    if not refs:
        return list(iter_jobs(s))
    out = []
    for ref in refs:
        job = find_job(s, ref)
        if job is None:
            raise NotFoundError("no such job", field="JOB", value=ref, hint="see `spotrun status`")
        out.append(job)
    return out


def _table(result) -> None:
    console = Console()
    rows = [flat(job) for job in result]
    if len(result) != 1:
        rows.append(totals(result))
    if len(rows) <= 4:
        # Few jobs: one column per job, one row per figure, readable in 80 columns.
        t = Table(title="spend audit (USD)")
        t.add_column("")
        for row in rows:
            t.add_column(str(row.get("id")), justify="right")
        for key, header in TABLE_COLUMNS[1:]:
            t.add_row(header, *[cell(key, row.get(key)) for row in rows])
    else:
        t = Table(title="spend audit (USD)")
        for key, header in TABLE_COLUMNS:
            t.add_column(header, justify="left" if key in ("id", "state") else "right")
        for i, row in enumerate(rows):
            t.add_row(*[cell(k, row.get(k)) for k, _ in TABLE_COLUMNS],
                      style="bold" if i == len(result) else None)
    console.print(t)
    notes = [f"{j.id}: {n}" for j in result for n in j.notes]
    for n in notes:
        click.echo(f"note: {n}")

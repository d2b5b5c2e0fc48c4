"""Job verbs: submit, status, logs, cancel, resume."""

from __future__ import annotations

import time
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn
from rich.table import Table

from spotrun import layout
from spotrun.cli.common import echo_json, get_settings, json_option
from spotrun.daemon.savefail import save_warnings
from spotrun.db import Attempt, Event, Job, attempts_of, find_job, iter_jobs, open_db, session
from spotrun.errors import NotFoundError
from spotrun.jobs import request_cancel, resume_job, submit as submit_job, validate_submission
from spotrun.store import open_store
from sqlmodel import select


@click.command()
@click.argument("spec_file", type=click.Path(dir_okay=False))
@click.option("--dry-run", is_flag=True, help="Validate and print the launch plan; write nothing.")
@json_option
def submit(spec_file: str, dry_run: bool, as_json: bool) -> None:
    """Submit SPEC_FILE (YAML); prints the new job id.

    The daemon (`spotrun daemon`) picks the job up. Bad input exits 2 and writes nothing.
    """
    settings = get_settings()
    sub = validate_submission(spec_file, settings)
    if dry_run:
        from spotrun.cli.dryrun import dry_run_plan
        plan = dry_run_plan(sub, settings)
        if as_json:
            echo_json(plan)
        else:
            from spotrun.cli.dryrun import print_plan
            print_plan(plan)
        return
    engine = open_db(settings.database_url)
    console = Console(stderr=True)
    if sub.spec.workdir and console.is_terminal and not as_json:
        with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                      TransferSpeedColumn(), console=console, transient=True) as bar:
            task = bar.add_task("uploading code bundle", total=None)
            job = submit_job(sub, engine,
                             progress=lambda done, total: bar.update(task, completed=done,
                                                                     total=total or None))
    else:
        job = submit_job(sub, engine)
    if as_json:
        echo_json({"id": job.id, "name": job.name, "state": job.state.value})
    else:
        click.echo(job.id)


def job_dict(job: Job, attempts: list[Attempt]) -> dict[str, Any]:
    """The `status --json` view of one job (the brief's contract plus progress)."""
    return {
        "id": job.id, "name": job.name, "state": job.state.value,
        "created_at": job.created_at, "updated_at": job.updated_at,
        "step": job.last_step, "total_steps": job.total_steps,
        "cancel_requested": job.cancel_requested, "reason": job.reason,
        "budget_usd": job.budget_usd, "checkpoint_uri": job.checkpoint_uri,
        "attempts": [{
            "number": a.number, "state": a.state.value, "market": a.market.value,
            "instance_type": a.instance_type, "zone": a.zone, "instance_id": a.instance_id,
            "price_usd_per_hour": a.price_usd_per_hour, "started_at": a.started_at,
            "ended_at": a.ended_at, "end_reason": a.end_reason.value if a.end_reason else None,
            "start_step": a.start_step, "last_step": a.last_step, "notice_at": a.notice_at,
            "detail": a.detail if a.state.is_terminal() else None,
            "checkpoint_failures": a.checkpoint_failures, "checkpoint_error": a.checkpoint_error,
        } for a in attempts],
        "warnings": save_warnings(attempts),
    }


@click.command()
@click.argument("job_ref", required=False)
@click.option("--events", "show_events", is_flag=True, help="Also list the job's events.")
@json_option
def status(job_ref: str | None, show_events: bool, as_json: bool) -> None:
    """Show all jobs, or one job's timeline of attempts (JOB_REF: id or name)."""
    settings = get_settings()
    engine = open_db(settings.database_url)
    with session(engine) as s:
        if job_ref:
            job = find_job(s, job_ref)
            if job is None:
                raise NotFoundError("no such job", field="JOB", value=job_ref)
            jobs = [job]
        else:
            jobs = list(iter_jobs(s))
        data = [job_dict(j, attempts_of(s, j.id)) for j in jobs]
        events = {}
        if job_ref or show_events:
            for j in jobs:
                events[j.id] = list(s.exec(select(Event).where(Event.job_id == j.id)
                                           .order_by(Event.id)))
    if as_json:
        if show_events:
            for d in data:
                d["events"] = [{"ts": e.ts, "kind": e.kind, "detail": e.detail}
                               for e in events.get(d["id"], [])]
        echo_json(data)
        return
    console = Console()
    if not job_ref:
        print_jobs(console, data)
        return
    print_timeline(console, data[0], events.get(data[0]["id"], []))


def print_jobs(console: Console, data: list[dict[str, Any]]) -> None:
    """A table of jobs."""
    t = Table(title="jobs")
    for col in ("id", "state", "progress", "attempts", "reclaims", "current"):
        t.add_column(col)
    for d in data:
        att = d["attempts"]
        cur = next((a for a in reversed(att) if a["state"] != "ended"), None)
        prog = f"{d['step']}/{d['total_steps']}" if d["total_steps"] else str(d["step"])
        t.add_row(d["id"], d["state"], prog, str(len(att)),
                  str(sum(1 for a in att if a["end_reason"] == "reclaimed")),
                  f"{cur['instance_type']} {cur['zone']} {cur['market']}" if cur else "-")
    console.print(t)
    for d in data:
        for w in d.get("warnings", []):
            console.print(f"[yellow]warning[/yellow] {d['id']}: {w}", markup=True)


def print_timeline(console: Console, d: dict[str, Any], events: list[Event]) -> None:
    """One job: header, attempts table, events."""
    prog = f"{d['step']}/{d['total_steps']}" if d["total_steps"] else str(d["step"])
    console.print(f"[bold]{d['id']}[/bold]  state [bold]{d['state']}[/bold]  step {prog}"
                  + (f"  ({d['reason']})" if d["reason"] else ""))
    for w in d.get("warnings", []):
        console.print(f"[yellow]warning[/yellow] {w}")
    t = Table(title="attempts")
    for col in ("#", "pool", "$/h", "ran", "steps", "end"):
        t.add_column(col, no_wrap=True)
    for a in d["attempts"]:
        t.add_row(str(a["number"]), f"{a['instance_type']} {a['zone']} {a['market']}",
                  f"{a['price_usd_per_hour']:.3f}", _span(a["started_at"], a["ended_at"]),
                  f"{a['start_step']}->{a['last_step']}", a["end_reason"] or a["state"])
    console.print(t)
    if events:
        e = Table(title="events")
        e.add_column("time")
        e.add_column("event")
        e.add_column("detail")
        for ev in events:
            e.add_row(ev.ts.strftime("%H:%M:%S"), ev.kind, ev.detail)
        console.print(e)


def _span(start: Any, end: Any) -> str:
    """Run time in the provider's clock, as h:mm:ss."""
    if not start or not end:
        return "-"
    secs = int((end - start).total_seconds())
    return f"{secs // 3600}:{secs % 3600 // 60:02d}:{secs % 60:02d}"


@click.command()
@click.argument("job_ref")
@click.option("--attempt", "attempt_no", type=int, default=None, help="Only this attempt.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the job ends.")
@click.option("--poll-s", type=float, default=1.0, show_default=True,
              help="How often --follow looks for new output.")
def logs(job_ref: str, attempt_no: int | None, follow: bool, poll_s: float) -> None:
    """Print a job's output (all attempts in order), read from the store."""
    settings = get_settings()
    engine = open_db(settings.database_url)
    with session(engine) as s:
        job = find_job(s, job_ref)
        if job is None:
            raise NotFoundError("no such job", field="JOB", value=job_ref)
        job_id, store_uri = job.id, job.store_uri
    store = open_store(store_uri)
    printed: set[str] = set()
    while True:
        for key in _segments(store, job_id, attempt_no):
            if key in printed:
                continue
            printed.add(key)
            click.echo(store.get_bytes(key).decode("utf-8", errors="replace"), nl=False)
        if not follow:
            return
        with session(engine) as s:
            if s.get(Job, job_id).state.is_terminal():
                follow = False  # one more pass picks up the final segments
                continue
        time.sleep(poll_s)  # a CLI follow loop paces itself; not a test wait


def _segments(store: Any, job_id: str, attempt_no: int | None) -> list[str]:
    prefix = layout.log_prefix(job_id, attempt_no) + "/" if attempt_no else \
        f"{layout.job_prefix(job_id)}/logs/"
    return [o.key for o in store.list(prefix) if o.key.endswith(".log")]


@click.command()
@click.argument("job_ref")
@json_option
def cancel(job_ref: str, as_json: bool) -> None:
    """Cancel a job: the daemon terminates its instances (idempotent)."""
    settings = get_settings()
    job = request_cancel(open_db(settings.database_url), job_ref)
    if as_json:
        echo_json({"id": job.id, "state": job.state.value, "cancel_requested": job.cancel_requested})
    elif job.state.is_terminal():
        click.echo(f"{job.id} already {job.state.value}")
    else:
        click.echo(f"{job.id} cancel requested")


@click.command()
@click.argument("job_ref")
@click.option("--budget-usd", type=float, default=None, help="New, higher budget in USD.")
def resume(job_ref: str, budget_usd: float | None) -> None:
    """Resume a budget_exhausted or failed job from its last checkpoint."""
    settings = get_settings()
    job = resume_job(open_db(settings.database_url), job_ref, budget_usd)
    click.echo(f"{job.id} {job.state.value}" + (f" budget ${job.budget_usd:g}"
                                                 if job.budget_usd else ""))


__all__ = ["submit", "status", "logs", "cancel", "resume", "job_dict"]

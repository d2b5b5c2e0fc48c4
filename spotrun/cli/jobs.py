"""Job verbs: submit, status, logs, cancel, resume."""

from __future__ import annotations

import re
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from spotrun.cli.common import backend, echo_json, json_option
from spotrun.states import JobState
from spotrun.store.progress import one_bar
from spotrun.cli.tables import Column, print_table
from spotrun.daemon.lease import NO_DAEMON


@click.command()
@click.argument("spec_file", type=click.Path(dir_okay=False))
@click.option("--dry-run", is_flag=True, help="Validate and print the launch plan; write nothing.")
@click.option("--wide", is_flag=True, help="With --dry-run: show every column of the plan.")
@click.option("--owner", default=None,
              help="Whose job it is (default: you, the OS user); only where "
                   "[budgets] allow_owner_override = true.")
@json_option
def submit(spec_file: str, dry_run: bool, wide: bool, owner: str | None, as_json: bool) -> None:
    """Submit SPEC_FILE (YAML); prints the new job id.

    The daemon (`spotrun daemon`) picks the job up. Bad input exits 2 and writes nothing;
    so does a job whose `policy.budget_usd` is more than its project's or owner's budget
    has left (docs/budgets.md).
    """
    console = Console(stderr=True)
    with upload_bar(console, show=console.is_terminal and not as_json) as progress:
        done = backend().submit(spec_file, owner=owner, dry_run=dry_run, progress=progress)
    for warning in done.warnings:
        click.echo(f"warning: {warning}", err=True)
    if dry_run:
        if as_json:
            echo_json(done.job)
        else:
            # lazy: start-up cost (the decision's tables, for --dry-run alone)
            from spotrun.cli.dryrun import print_plan
            print_plan(done.job, wide=wide)
        return
    if as_json:
        echo_json(done.job)
    else:
        click.echo(done.job["id"])
    if done.note:
        click.echo(done.note, err=True)


def upload_bar(console: Console, *, show: bool) -> Any:
    """A progress callback drawing the code bundle's upload as a rich bar (None: no bar);
    the bar appears with the first bytes, so a job without a workdir shows none."""
    return one_bar(console, "uploading code bundle", show=show)


@click.command()
@click.argument("job_ref", required=False)
@click.option("--events", "show_events", is_flag=True, help="Also list the job's events.")
@click.option("--wide", is_flag=True, help="Show every column, however wide the terminal.")
@json_option
def status(job_ref: str | None, show_events: bool, wide: bool, as_json: bool) -> None:
    """Show all jobs, or one job's timeline of attempts (JOB_REF: id or name).

    `--json` prints a list of jobs, or one object when JOB_REF is given. Times ending
    `_market` are on the provider's clock (the local market runs faster than the wall),
    `_wall` on the wall clock; each job's `clock` says which is which.
    """
    data = backend().status(job_ref, events=show_events)
    if as_json:
        echo_json(data)
        return
    console = Console()
    if not job_ref:
        print_jobs(console, data, wide=wide)
        return
    print_timeline(console, data, data.get("events", []), wide=wide)


def _money(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}" if abs(v) < 10 else f"{v:,.2f}"


def print_jobs(console: Console, data: list[dict[str, Any]], *, wide: bool = False) -> None:
    """A table of jobs: ids whole; at narrow widths the low-priority columns drop out."""
    cols = [Column("id", "id"), Column("state", "state"), Column("progress", "progress", 1),
            Column("reclaims", "reclaims", 1, "right"), Column("spend", "spend $", 2, "right"),
            Column("attempts", "attempts", 3, "right"), Column("current", "current", 4),
            Column("project", "project", 5), Column("owner", "owner", 6)]
    rows = []
    waiting: list[str] = []
    for d in data:
        att = d["attempts"]
        cur = next((a for a in reversed(att) if a["state"] != "ended"), None)
        prog = f"{d['step']}/{d['total_steps']}" if d["total_steps"] else str(d["step"])
        state = d["state"]
        if d.get("reason") and d["reason"].startswith(NO_DAEMON):
            waiting.append(d["reason"])
            state += " (no daemon)"
        rows.append({"id": d["id"], "state": state, "progress": prog,
                     "reclaims": str(d["reclaims"]), "spend": _money(d.get("spend_usd")),
                     "attempts": str(len(att)),
                     "current": f"{cur['instance_type']} {cur['zone']} {cur['market']}"
                     if cur else "-", "project": d.get("project") or "-",
                     "owner": d.get("owner") or "-"})
    print_table(console, "jobs", cols, rows, wide=wide)
    if waiting:
        console.print(waiting[0], soft_wrap=True, highlight=False, markup=False)
    for d in data:
        for w in d.get("warnings", []):
            console.print(f"[yellow]warning[/yellow] {d['id']}: {w}", markup=True)


def _instances_text(a: dict[str, Any]) -> str:
    """One instance id, or `N nodes: id, id` for a multi-node attempt (its live ones)."""
    nodes = a.get("nodes") or []
    if (a.get("nodes_wanted") or 1) <= 1 and a.get("nodes_min") is None:
        return a["instance_id"] or "-"
    live = [n["instance_id"] for n in nodes if n.get("state") != "ended"] or \
        [n["instance_id"] for n in nodes]
    return f"{a.get('nodes_wanted')} nodes: " + (", ".join(i for i in live if i) or "-")


def steps_text(a: dict[str, Any]) -> str:
    """An attempt's steps as `resumed from R, ran to E` (E unknown: `?`)."""
    end = "?" if a.get("ran_to") is None else str(a["ran_to"])
    return f"resumed from {a['resumed_from']}, ran to {end}"


def lost_text(a: dict[str, Any]) -> str:
    """An attempt's lost steps: `-` while it runs or if it never ran, `?` when unknown."""
    if a.get("lost_steps") is not None:
        return str(a["lost_steps"])
    return "?" if a.get("started_at_market") and a.get("ended_at_market") else "-"


RESUME_PARTS = (("detection_s", "detection"), ("waiting_s", "waiting"), ("launch_s", "launch"),
                ("boot_s", "boot"), ("restore_s", "restore"), ("first_step_s", "first step"))


def seconds_text(v: float | None) -> str:
    """A duration: `12.3s`, `4m05s`, `1h02m`; `?` when unknown."""
    if v is None:
        return "?"
    if abs(v) < 100:
        return f"{v:.1f}s"
    m, sec = divmod(int(round(v)), 60)
    return f"{m}m{sec:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m"


def reclaim_lines(attempts: list[dict[str, Any]], clock: str) -> list[str]:
    """Under the attempts table, per reclaim: the steps lost, the notice's outcome, and the
    time the next attempt took to train again, by part (provider-clock seconds)."""
    out = []
    for a in attempts:
        if a.get("end_reason") == "reclaimed" or a.get("notice_outcome"):
            out.append(f"attempt {a['number']}: {a.get('end_reason') or a['state']}, lost steps "
                       f"{lost_text(a)}; notice: {a.get('notice_outcome') or '-'}")
        ttr = a.get("time_to_resume")
        if ttr:
            parts = ", ".join(f"{label} {seconds_text(ttr.get(key))}"
                              for key, label in RESUME_PARTS)
            out.append(f"attempt {a['number']} resumed {seconds_text(ttr.get('total_s'))} "
                       f"({clock} clock) after attempt {ttr.get('from_attempt')}'s reclaim: "
                       f"{parts}")
    return out


def print_timeline(console: Console, d: dict[str, Any], events: list[dict[str, Any]], *,
                   wide: bool = False) -> None:
    """One job: header, attempts table, events."""
    clock = (d.get("clock") or {}).get("provider_clock", "provider")
    scale = (d.get("clock") or {}).get("time_scale", 1.0)
    prog = f"{d['step']}/{d['total_steps']}" if d["total_steps"] else str(d["step"])
    console.print(f"[bold]{d['id']}[/bold]  state [bold]{d['state']}[/bold]  step {prog}  "
                  f"reclaims {d['reclaims']}  project {d.get('project')}  owner "
                  f"{d.get('owner')}" + (f"  ({d['reason']})" if d["reason"] else ""),
                  soft_wrap=True)
    for w in d.get("warnings", []):
        console.print(f"[yellow]warning[/yellow] {w}")
    if scale != 1.0:
        console.print(f"times: run and start on the market clock (up to x{scale:g} the wall); "
                      "events on the wall clock", style="dim", soft_wrap=True)
    cols = [Column("n", "#", 0, "right"), Column("steps", "steps", 0),
            Column("end", "end", 0), Column("lost", "lost steps", 1, "right"),
            Column("pool", "pool", 1),
            Column("ran", f"ran ({clock})", 2, "right"),
            Column("price", "$/h", 3, "right"),
            Column("start", f"start ({clock})", 4), Column("instance", "instance", 5)]
    # The cloud names the pool once a job has run on more than one (docs/clouds.md).
    moved = len({a.get("cloud") for a in d["attempts"] if a.get("cloud")}) > 1
    rows = [{"n": str(a["number"]), "pool": (f"{a['cloud']} " if moved else "")
             + f"{a['instance_type']} {a['zone']} {a['market']}",
             "price": f"{a['price_usd_per_hour']:.3f}",
             "ran": _span(a["started_at_market"], a["ended_at_market"]),
             "steps": steps_text(a), "end": a["end_reason"] or a["state"],
             "lost": lost_text(a),
             "start": a["started_at_market"].strftime("%Y-%m-%d %H:%M:%S")
             if a["started_at_market"] else "-",
             "instance": _instances_text(a)} for a in d["attempts"]]
    print_table(console, "attempts", cols, rows, wide=wide)
    for line in reclaim_lines(d["attempts"], clock):
        console.print(line, highlight=False, markup=False)
    if events:
        e = Table(title="events (wall clock)")
        e.add_column("time", no_wrap=True)
        e.add_column("event", no_wrap=True)
        e.add_column("detail", overflow="fold")
        for ev in events:
            e.add_row(ev["ts_wall"].strftime("%H:%M:%S"), ev["kind"],
                      label_times(ev["detail"], clock))
        console.print(e)


_ISO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)?")


def label_times(detail: str, clock: str) -> str:
    """Mark the times inside an event's text: they come from the provider (a notice's time)."""
    if clock == "provider":
        return detail
    return _ISO_TIME.sub(lambda m: f"{m.group(0)} ({clock})", detail)


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
@json_option
def logs(job_ref: str, attempt_no: int | None, follow: bool, poll_s: float,
         as_json: bool) -> None:
    """Print a job's output, attempt by attempt, read from the store.

    Each attempt starts with a `== attempt N (pool) ==` line; an attempt that printed
    nothing says so. `--json` prints `[{"attempt", "pool", "end_reason", "output"}]`.
    """
    be = backend()
    if as_json:
        echo_json(be.logs_json(job_ref, attempt_no))
        return
    for stream, text in be.logs(job_ref, attempt_no, follow=follow, poll_s=poll_s):
        click.echo(text, nl=False, err=stream == "err")


@click.command()
@click.argument("job_ref")
@json_option
def cancel(job_ref: str, as_json: bool) -> None:
    """Cancel a job (idempotent): one that never launched at once; otherwise the daemon
    terminates its instances."""
    done = backend().cancel(job_ref)
    job = done.job
    if as_json:
        echo_json(job)
    elif JobState(job["state"]).is_terminal() and job["state"] != done.was:
        click.echo(f"{job['id']} {job['state']}")
    elif JobState(job["state"]).is_terminal():
        click.echo(f"{job['id']} already {job['state']}")
    else:
        click.echo(f"{job['id']} cancel requested")


@click.command()
@click.argument("job_ref")
@click.option("--budget-usd", type=float, default=None, help="New, higher budget in USD.")
@json_option
def resume(job_ref: str, budget_usd: float | None, as_json: bool) -> None:
    """Resume a budget_exhausted or failed job from its last checkpoint."""
    job = backend().resume(job_ref, budget_usd)
    if as_json:
        echo_json(job)
        return
    click.echo(f"{job['id']} {job['state']}" + (f" budget ${job['budget_usd']:g}"
                                                 if job["budget_usd"] else ""))


__all__ = ["submit", "status", "logs", "cancel", "resume"]

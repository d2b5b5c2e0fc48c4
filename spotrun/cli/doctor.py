"""`spotrun doctor`: check the state database, then cloud credentials, quotas and resources."""

from __future__ import annotations

import dataclasses

import click

from spotrun.cli.common import echo_json, get_settings, json_option
from spotrun.db.migrations import LATEST
from spotrun.db.probe import probe
from spotrun.clouds import cloud_settings
from spotrun.providers.facts import facts_for


def database_check(settings) -> dict[str, str]:
    """One report line about the state database: readable, lock free, schema not newer."""
    look = probe(settings.database_url, timeout_s=settings.db_busy_timeout_s, latest=LATEST)
    # A missing database is made by the first command; an older one is upgraded on open.
    fine = look.ok or look.kind in ("missing", "older")
    return {"name": "database", "status": "ok" if fine else "fix", "detail": look.message}


@click.command(name="doctor")
@json_option
def doctor(as_json: bool) -> None:
    """Check the database, cloud credentials, quotas and resources; one line each, exit 1 if
    any needs a fix."""
    settings = get_settings()
    db = database_check(settings)
    checks, message = [], ""
    several = len(settings.clouds) > 1
    for cloud in settings.clouds:
        view = cloud_settings(settings, cloud)
        cloud_checks = facts_for(view).doctor
        if cloud_checks is None:
            message = f"provider is {cloud!r}: nothing to check in a cloud"
            continue
        # Several clouds: each cloud's checks, named for it (a cloud whose credentials fail
        # shows here; the daemon leaves its candidates out with the reason meanwhile).
        checks += [dataclasses.replace(c, name=f"{cloud}: {c.name}") if several else c
                   for c in cloud_checks(view)]
    if as_json:
        echo_json({"provider": settings.provider, "providers": list(settings.clouds),
                   "checks": [db] + [c.to_dict() for c in checks], "message": message})
    else:
        from rich.console import Console
        from rich.table import Table

        click.echo(f"database  {db['status']}  {db['detail']}")
        if message:
            click.echo(message)
        else:
            # The console's width (a pipe: COLUMNS, else 80): a long detail wraps in its
            # column, never widening the table past it and never cut.
            table = Table(show_lines=False)
            table.add_column("check", no_wrap=True)
            table.add_column("status", no_wrap=True)
            table.add_column("detail", overflow="fold")
            style = {"ok": "green", "fix": "red", "unknown": "yellow"}
            for c in checks:
                status = c.status.value
                table.add_row(c.name, f"[{style.get(status, 'yellow')}]{status}[/]", c.detail)
            Console().print(table)
    if db["status"] == "fix" or any(c.status.value == "fix" for c in checks):
        raise SystemExit(1)

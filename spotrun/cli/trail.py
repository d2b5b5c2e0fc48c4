"""`spotrun trail`: who did what through the team server, and what was denied."""

from __future__ import annotations

import click
from rich.console import Console

from spotrun.cli.common import backend, echo_json, json_option
from spotrun.cli.tables import Column, print_table
from spotrun.contracts import parse_time


@click.command()
@click.option("--user", default=None, help="Only this user's calls.")
@click.option("--since", default=None, help="Only calls at or after this time (ISO-8601, UTC).")
@json_option
def trail(user: str | None, since: str | None, as_json: bool) -> None:
    """The action trail: each state-changing or denied call (who, role, action, target,
    address, outcome ok|denied|error). Remotely: admins only."""
    data = backend().trail(user=user, since=parse_time(since, "--since"))
    if as_json:
        echo_json(data)
        return
    cols = [Column("at", "at (UTC)"), Column("user", "user"), Column("action", "action"),
            Column("target", "target", 1), Column("outcome", "outcome"),
            Column("role", "role", 3), Column("addr", "from", 2), Column("detail", "detail", 4)]
    rows = [{"at": r["at"].strftime("%Y-%m-%d %H:%M:%S"), "user": r["user"] or "-",
             "action": r["action"], "target": r["target"] or "-", "outcome": r["outcome"],
             "role": r["role"] or "-", "addr": r["remote_addr"] or "-",
             "detail": r["detail"] or ""} for r in data]
    print_table(Console(), "action trail", cols, rows)

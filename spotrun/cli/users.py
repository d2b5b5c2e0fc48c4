"""`spotrun users ...`: the team server's users and API tokens (on the server host, direct DB)."""

from __future__ import annotations

import click
from rich.console import Console

from spotrun.cli.common import echo_json, get_settings, json_option, open_state_db
from spotrun.cli.tables import Column, print_table
from spotrun.server import identity


@click.group()
def users() -> None:
    """Users and API tokens of `spotrun server` (run on the server host; docs/server.md)."""


def _token_lines(name: str, token: str) -> None:
    click.echo(token)
    click.echo(f"the token of {name}: shown once, stored only hashed; "
               f"`spotrun login URL` on their machine asks for it", err=True)


@users.command("add")
@click.argument("name")
@click.option("--role", default="member", show_default=True, help="admin, member or viewer.")
def add(name: str, role: str) -> None:
    """Create user NAME with a role; prints its first API token (once)."""
    engine = open_state_db(get_settings())
    _token_lines(name, identity.add_user(engine, name, role))


@users.command("token")
@click.argument("name")
def token(name: str) -> None:
    """Issue another API token for NAME; prints it (once)."""
    engine = open_state_db(get_settings())
    _token_lines(name, identity.new_token(engine, name))


@users.command("revoke")
@click.argument("ref", metavar="NAME|TOKEN_ID")
def revoke(ref: str) -> None:
    """Revoke every token of user NAME, or the one token TOKEN_ID; effective at once."""
    engine = open_state_db(get_settings())
    ids = identity.revoke(engine, ref)
    click.echo(f"revoked {len(ids)} token(s): {', '.join(ids) or '-'}")


@users.command("list")
@json_option
def list_(as_json: bool) -> None:
    """List users, roles and their tokens' ids (never a secret)."""
    data = identity.list_users(open_state_db(get_settings()))
    if as_json:
        echo_json(data)
        return
    cols = [Column("name", "user"), Column("role", "role"), Column("tokens", "live tokens"),
            Column("used", "last used", 1), Column("disabled", "disabled", 2)]
    rows = []
    for u in data:
        live = [t for t in u["tokens"] if t["revoked_at"] is None]
        used = max((t["last_used_at"] for t in live if t["last_used_at"]), default=None)
        rows.append({"name": u["name"], "role": u["role"],
                     "tokens": ", ".join(t["id"] for t in live) or "-",
                     "used": used.strftime("%Y-%m-%d %H:%M") if used else "-",
                     "disabled": "yes" if u["disabled"] else "no"})
    print_table(Console(), "users", cols, rows)

"""`spotrun login URL` / `spotrun logout`: store or forget the team server this CLI uses."""

from __future__ import annotations

import click

from spotrun.backends.remote_config import Remote, forget_remote, save_remote
from spotrun.errors import BadInputError


@click.command()
@click.argument("url")
@click.option("--token", default=None, help="The API token (default: asked for, not echoed).")
def login(url: str, token: str | None) -> None:
    """Check TOKEN against the server at URL (whoami), then store both (mode 0600)."""
    if not url.startswith(("http://", "https://")):
        raise BadInputError("allowed: an http:// or https:// URL", field="URL", value=url)
    if token is None:
        token = click.prompt("token", hide_input=True)
    token = token.strip()
    # lazy: start-up cost (httpx)
    from spotrun.backends.remote import RemoteBackend
    who = RemoteBackend(url, token).whoami()
    path = save_remote(Remote(url=url.rstrip("/"), token=token))
    click.echo(f"logged in to {url.rstrip('/')} as {who['user']} ({who['role']}); "
               f"token stored in {path}")


@click.command()
def logout() -> None:
    """Forget the stored server; verbs act on the local home again."""
    click.echo("logged out" if forget_remote() else "not logged in")

"""`spotrun server`: the team API (FastAPI under uvicorn) beside the daemon (docs/server.md)."""

from __future__ import annotations

import click

from spotrun.cli.common import get_settings, open_state_db
from spotrun.errors import BadInputError


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0: every interface; use TLS then).")
@click.option("--port", type=click.IntRange(0, 65535), default=8780, show_default=True)
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), default=None,
              help="PEM certificate: serve HTTPS (with --tls-key).")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), default=None,
              help="PEM private key of --tls-cert.")
def server(host: str, port: int, tls_cert: str | None, tls_key: str | None) -> None:
    """Serve the API on HOST:PORT for `spotrun login` users (tokens: `spotrun users`)."""
    if bool(tls_cert) != bool(tls_key):
        raise BadInputError("give --tls-cert and --tls-key together",
                            field="--tls-key" if tls_cert else "--tls-cert")
    # lazy: start-up cost (uvicorn and FastAPI load only for this verb)
    import uvicorn

    from spotrun.logsetup import configure_logging
    from spotrun.server.app import create_app
    settings = get_settings()
    app = create_app(settings, engine=open_state_db(settings))
    configure_logging(json=False)
    click.echo(f"spotrun server on {'https' if tls_cert else 'http'}://{host}:{port} "
               f"(state: {settings.home_path})", err=True)
    uvicorn.run(app, host=host, port=port, ssl_certfile=tls_cert, ssl_keyfile=tls_key,
                log_config=None, server_header=False)

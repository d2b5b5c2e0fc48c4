"""`spotrun server`: the team API (FastAPI under uvicorn) beside the daemon (docs/server.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from spotrun.cli.common import get_settings, open_state_db
from spotrun.errors import BadInputError
from spotrun.heap import settle_startup_heap

# On SIGTERM open responses (a `logs -f` stream) get this long before they are cut, so
# the daemon inside stops and releases its lease well within systemd's TimeoutStopSec.
GRACEFUL_STOP_S = 10

if TYPE_CHECKING:
    from spotrun.config import Settings
    from spotrun.daemon.standby import StandbyDaemon


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0: every interface; use TLS then).")
@click.option("--port", type=click.IntRange(0, 65535), default=8780, show_default=True)
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), default=None,
              help="PEM certificate: serve HTTPS (with --tls-key).")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), default=None,
              help="PEM private key of --tls-cert.")
@click.option("--with-daemon", is_flag=True,
              help="Also run the daemon's loops in this process, acting only while it "
                   "holds the database's lease (several servers on one PostgreSQL: one "
                   "leads, the others take over when its lease lapses).")
def server(host: str, port: int, tls_cert: str | None, tls_key: str | None,
           with_daemon: bool) -> None:
    """Serve the API on HOST:PORT for `spotrun login` users (tokens: `spotrun users`).

    With --with-daemon the daemon runs inside the server: SIGHUP reloads its settings,
    SIGTERM stops the API and then the loops, releasing the lease.
    """
    if bool(tls_cert) != bool(tls_key):
        raise BadInputError("give --tls-cert and --tls-key together",
                            field="--tls-key" if tls_cert else "--tls-cert")
    # lazy: start-up cost (uvicorn and FastAPI load only for this verb)
    import uvicorn

    from spotrun.logsetup import configure_logging
    from spotrun.server.app import create_app
    settings = get_settings()
    standby = _standby(settings) if with_daemon else None
    app = create_app(settings, engine=open_state_db(settings), daemon=standby)
    # With the daemon inside, its JSON lines (journald) as `spotrun daemon` writes them.
    configure_logging(json=with_daemon)
    click.echo(f"spotrun server on {'https' if tls_cert else 'http'}://{host}:{port} "
               f"(state: {settings.home_path}"
               f"{'; daemon: waits for the lease' if with_daemon else ''})", err=True)
    settle_startup_heap()   # imports and the app: kept for the process's life
    try:
        uvicorn.run(app, host=host, port=port, ssl_certfile=tls_cert, ssl_keyfile=tls_key,
                    log_config=None, server_header=False,
                    timeout_graceful_shutdown=GRACEFUL_STOP_S)
    finally:
        # The app's shutdown stopped it already; this covers a start-up that failed.
        if standby is not None:
            standby.stop()


def _standby(settings: "Settings") -> "StandbyDaemon":
    """The daemon's loops for the app to start, guarded by the lease; SIGHUP reloads them."""
    import signal

    from spotrun.daemon.standby import StandbyDaemon
    standby = StandbyDaemon(settings)
    # uvicorn takes SIGINT and SIGTERM only; SIGHUP is the daemon's reload, as standalone.
    signal.signal(signal.SIGHUP, lambda _signum, _frame: standby.reload())
    return standby

"""`spotrun ui`: serve the dashboard until Ctrl-C / SIGTERM."""

from __future__ import annotations

import os
import signal
import threading

import click

from spotrun.cli.common import get_settings
from spotrun.ui.server import make_server


@click.command()
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="TCP port (0 = any free port; the address is printed).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; anything but loopback needs --token.")
@click.option("--token", default=None,
              help="Secret a browser must present (?token=... once, or a Bearer header); "
                   "default $SPOTRUN_UI_TOKEN.")
def ui(port: int, host: str, token: str | None) -> None:
    """Serve a read-only web dashboard of every job, its JSON and /metrics.

    The page lists jobs (state, progress, spend, saving against on-demand, deadline and
    budget headroom); a job's page shows its attempts by pool, cumulative spend against
    the on-demand baseline, where the money went, events and the log tail, and follows
    a running job live. JSON: /api/status, /api/audit (the same as the CLI's --json).
    """
    token = token or os.environ.get("SPOTRUN_UI_TOKEN") or None
    server = make_server(get_settings(), host=host, port=port, token=token)
    bound_host, bound_port = server.server_address[:2]
    shown = f"[{bound_host}]" if ":" in str(bound_host) else bound_host
    click.echo(f"spotrun ui on http://{shown}:{bound_port}/", err=True)

    def stop(signum, frame):
        threading.Thread(target=server.shutdown, daemon=True).start()
    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()

"""`spotrun daemon`: run the loops that launch, watch and book jobs."""

from __future__ import annotations

import click

from spotrun.cli.common import echo_json, get_settings


@click.command()
@click.option("--once", is_flag=True, help="Run every loop one time and exit.")
@click.option("--check", is_flag=True,
              help="Health check: the database opens and the provider answers; exit 0/1.")
def daemon(once: bool, check: bool) -> None:
    """Run the daemon in the foreground (logs: JSON lines on stdout).

    SIGTERM or Ctrl-C stops it cleanly after the loop in progress; SIGHUP reloads.
    Killing it never kills an instance: a restarted daemon reconciles and carries on.
    """
    from spotrun.daemon.app import build_context, build_runner, configure_logging

    settings = get_settings()
    configure_logging()
    ctx = build_context(settings)
    if check:
        ok = {"database": True, "provider": ctx.provider.name, "zones": ctx.provider.zones()}
        echo_json(ok)
        return
    runner = build_runner(ctx)
    if once:
        runner.run_once()
        return
    runner.serve_forever()

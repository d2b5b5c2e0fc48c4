"""`spotrun daemon`: run the loops that launch, watch and book jobs."""

from __future__ import annotations

import sys

import click

from spotrun.cli.common import echo_json, get_settings


@click.command()
@click.option("--once", is_flag=True, help="Run every loop one time and exit.")
@click.option("--json", "as_json", is_flag=True, help="--check: print one JSON object.")
@click.option("--check", is_flag=True,
              help="Health check: a daemon holds this database's lease now; exit 0/1 "
                   "with the reason (also: database unreadable, locked, newer schema). "
                   "Writes nothing.")
def daemon(once: bool, as_json: bool, check: bool) -> None:
    """Run the daemon in the foreground (logs: JSON lines on stderr).

    One daemon per database: a second one waits for the lease. SIGTERM or Ctrl-C
    stops it cleanly after the loop in progress; SIGHUP reloads the [daemon] and
    [agent] settings of spotrun.toml. Killing it never kills an instance: a
    restarted daemon reconciles and carries on.
    """
    settings = get_settings()
    if check:
        from spotrun.daemon.service import health
        ok, reason, detail = health(settings)
        if as_json:
            echo_json({"ok": ok, "reason": reason, **detail})
        else:
            extra = "  ".join(f"{k}={v}" for k, v in detail.items() if v is not None)
            click.echo(f"{'ok' if ok else 'not ok'}: {reason}" + (f"  ({extra})" if extra else ""))
        sys.exit(0 if ok else 1)
    from spotrun.daemon.app import build_context, build_runner, configure_logging
    configure_logging()
    if once:
        from spotrun.daemon.lease import Lease
        ctx = build_context(settings)
        lease = Lease(ctx.engine, ttl_s=settings.daemon.lease_ttl_s)
        if not lease.try_acquire():
            holder = lease.holder()
            click.echo(f"error: daemon {holder.owner if holder else '?'} holds the lease; "
                       "--once would race it", err=True)
            sys.exit(1)
        try:
            build_runner(ctx, lease=lease).run_once()
        finally:
            lease.release()
        return
    from spotrun.daemon.service import serve
    sys.exit(serve(settings))

"""`spotrun daemon`: run the loops that launch, watch and book jobs."""

from __future__ import annotations

import sys

import click

from spotrun.cli.common import echo_json, get_settings
from spotrun.cli.tables import Column, cells, print_table
from spotrun.daemon.app import build_context, build_runner, configure_logging
from spotrun.daemon.lease import Lease
from spotrun.daemon.service import serve, health


@click.command()
@click.option("--once", is_flag=True, help="Run every loop one time and exit.")
@click.option("--json", "as_json", is_flag=True, help="--check: print one JSON object.")
@click.option("--check", is_flag=True,
              help="Health check: a daemon holds this database's lease now; exit 0/1 "
                   "with the reason (also: database unreadable, locked, newer schema), "
                   "and each loop's tick p50/p99 over the last minute and lag. "
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
        ok, reason, detail = health(settings)
        if as_json:
            echo_json({"ok": ok, "reason": reason, **detail})
        else:
            extra = "  ".join(f"{k}={v}" for k, v in detail.items()
                              if v is not None and not k.startswith("loops"))
            click.echo(f"{'ok' if ok else 'not ok'}: {reason}" + (f"  ({extra})" if extra else ""))
            if detail.get("loops"):
                _print_loops(detail["loops"], detail.get("loops_window_s"))
        sys.exit(0 if ok else 1)
    configure_logging()
    if once:
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
    sys.exit(serve(settings))


def _print_loops(loops: dict, window_s: float | None) -> None:
    """The loops' figures as a table (seconds; '-' where a loop has not ticked yet)."""
    from rich.console import Console


    def ms(v: float | None) -> str | None:
        return None if v is None else f"{v * 1000:.1f}"
    rows = [cells({"loop": name, "every": f"{f['interval_s']:g}", "ticks": f["ticks"],
                   "p50": ms(f["p50_s"]), "p99": ms(f["p99_s"]), "lag": ms(f["lag_s"]),
                   "lag_max": ms(f["lag_max_s"]), "overdue": ms(f["overdue_s"]),
                   "errors": f["errors"]})
            for name, f in sorted(loops.items())]
    cols = [Column("loop", "loop"), Column("every", "every s", 2, "right"),
            Column("ticks", "ticks", 1, "right"), Column("p50", "p50 ms", 0, "right"),
            Column("p99", "p99 ms", 0, "right"), Column("lag", "lag ms", 0, "right"),
            Column("lag_max", "max lag ms", 1, "right"),
            Column("overdue", "overdue ms", 2, "right"), Column("errors", "errors", 1, "right")]
    print_table(Console(), f"loops over the last {window_s or 60:g} s", cols, rows)

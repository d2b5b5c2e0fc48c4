"""`spotrun demo`: train a small real PyTorch job through reclaims, end to end."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from spotrun import demo as d
from spotrun.cli.audit import audit as audit_cmd
from spotrun.cli.jobs import status as status_cmd
from spotrun.ui.views import audit_view, status_view



@click.command()
@click.option("--time-scale", type=float, default=None,
              help="Market seconds per wall second (default: the demo's tuned value).")
@click.option("--start-tick", type=int, default=None, help="Trace tick the market starts at.")
@click.option("--stall-s", type=float, default=300.0, show_default=True,
              help="Give up (exit 1) when the job has not moved (no step, attempt or state "
                   "change) for this many wall seconds.")
@click.option("--pacing", type=click.Choice(["rehearsal", "fixed"]), default="rehearsal",
              show_default=True,
              help="The market's clock (docs/local-provider.md); fixed = x60 throughout, as "
                   "before the rehearsal pacing (for comparison).")
@click.option("--home", "home_opt", type=click.Path(file_okay=False), default=None,
              help="Demo state directory (default: $SPOTRUN_HOME if set, else ./.demo).")
@click.option("--spec", "spec_path", type=click.Path(dir_okay=False), default=None,
              help="Job spec to run instead of configs/demo/job.yaml.")
def demo(time_scale: float | None, start_tick: int | None, stall_s: float, pacing: str,
         home_opt: str | None, spec_path: str | None) -> None:
    """Train a small real PyTorch model on the local provider, through >= 2 reclaims.

    Uses --home, else $SPOTRUN_HOME, else ./.demo, which it resets first (only if the
    demo created it); afterwards `SPOTRUN_HOME=<that dir> spotrun status --json` and
    `spotrun audit --json` read the finished job.
    """
    import os


    home = Path(home_opt or os.environ.get("SPOTRUN_HOME") or ".demo").resolve()
    os.environ["SPOTRUN_HOME"] = str(home)   # status and audit below read the demo's home
    settings = d.prepare_home(home, time_scale=time_scale or d.DEFAULT_TIME_SCALE,
                              start_tick=d.DEFAULT_START_TICK if start_tick is None else start_tick,
                              pacing=pacing)
    spec = Path(spec_path) if spec_path else d.DEMO_DIR / "job.yaml"
    console = Console()
    console.print(f"[bold]spotrun demo[/bold]  home {home}  market x{settings.local.time_scale:g}"
                  f" from tick {settings.local.start_tick}")
    with console.status("starting") as status:
        def update(snap: dict) -> None:
            total = snap["total"] or "?"
            status.update(f"{snap['state']:<11} step {snap['step']}/{total}  attempt "
                          f"{snap['attempts']} ({snap['attempt_state']}, {snap['pool']})  "
                          f"reclaims {snap['reclaims']}  spend ${snap['spend_usd']:.2f}")
        try:
            result = d.run_demo(settings, spec_path=spec, stall_s=stall_s, on_update=update)
        finally:
            d.stop_market(home)
    console.print(f"job {result.job_id} {result.state} after {result.attempts} attempt(s), "
                  f"{result.reclaims} reclaim(s), {result.wall_s:.0f} s wall")
    ctx = click.get_current_context()
    ctx.invoke(status_cmd, job_ref=result.job_id, show_events=False, as_json=False)
    ctx.invoke(audit_cmd, jobs=(result.job_id,))
    proved = d.proof(status_view(settings, result.job_id),
                     audit_view(settings, [result.job_id])[0].to_dict())
    _print_proof(console, proved)
    if proved["failures"]:
        raise SystemExit(1)


def _print_proof(console: Console, proved: dict) -> None:
    """The demo's last words: what it showed, or which promise it did not keep."""
    lost = ", ".join("?" if n is None else str(n) for n in proved["steps_lost_per_reclaim"]) \
        or "-"
    console.print(f"[bold]proved[/bold]: {proved['reclaims']} reclaim(s) survived, each attempt "
                  f"resumed from its predecessor's checkpoint; steps lost per reclaim: {lost}; "
                  f"spent ${proved['spent_usd']:.4f} vs ${proved['on_demand_usd']:.4f} "
                  f"on-demand (saved {proved['saved_fraction']:.0%})")
    for failure in proved["failures"]:
        console.print(f"[red]not proved[/red]: {failure}")

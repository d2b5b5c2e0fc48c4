"""`spotrun demo`: a real PyTorch job through the daemon on the local provider, end to end.

The demo's state lives in its own SPOTRUN_HOME (`.demo/` under `make demo`), so
`spotrun status --json` and `spotrun audit --json` can read the finished job afterwards.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import structlog
from sqlmodel import select

from spotrun.config import Settings, load_settings
from spotrun.db import Attempt, Job, SpendEntry, attempts_of, session
from spotrun.errors import BadInputError
from spotrun.jobs import submit, validate_submission
from spotrun.states import EndReason
from spotrun.daemon.app import build_context, build_runner, configure_logging
from spotrun.providers.local.market import client as market_client

MARKER = ".spotrun-demo"
DEMO_DIR = Path(__file__).resolve().parent.parent / "configs" / "demo"

# Market seconds per wall second, and where in the trace the demo starts: from tick 24 the
# packaged extract offers short stretches in three pools, so a job that trains for more than
# about 25 market minutes meets at least two reclaims. The market is paced (start-up in real
# time, notices at their own rate), so a slow or loaded machine only makes it meet more.
DEMO_TOML = """\
# Written by `spotrun demo`: a fast local market and a daemon with short loops.
[local]
time_scale = {time_scale}
start_tick = {start_tick}
pacing = "{pacing}"

[daemon]
schedule_interval_s = 0.5
reconcile_interval_s = 0.5
heartbeat_interval_s = 0.5
spend_interval_s = 1.0
liveness_interval_s = 1.0
heartbeat_timeout_s = 60.0
deadman_timeout_s = 120.0

[agent]
heartbeat_interval_s = 0.5
log_flush_interval_s = 1.0
"""


@dataclass
class DemoResult:
    """What the demo ended with."""

    job_id: str
    state: str
    reclaims: int
    attempts: int
    wall_s: float


def prepare_home(home: Path, *, time_scale: float, start_tick: int,
                 pacing: str = "rehearsal") -> Settings:
    """Reset a demo home (never a non-demo one) and write its spotrun.toml."""
    if home.exists() and any(home.iterdir()):
        if not (home / MARKER).exists():
            raise BadInputError("refusing to reset a SPOTRUN_HOME the demo did not create",
                                field="SPOTRUN_HOME", value=str(home),
                                hint="point SPOTRUN_HOME at an empty or demo directory")
        stop_market(home)
        shutil.rmtree(home)
    home.mkdir(parents=True, exist_ok=True)
    (home / MARKER).write_text("state of `spotrun demo`; safe to delete\n")
    (home / "spotrun.toml").write_text(DEMO_TOML.format(time_scale=time_scale,
                                                        start_tick=start_tick, pacing=pacing))
    return load_settings(str(home))


def stop_market(home: Path) -> None:
    """Stop the demo's market (and so its instances), if one runs."""
    market_client.stop_market(home / "market")


def run_demo(settings: Settings, *, spec_path: Path, stall_s: float,
             on_update: Callable[[dict[str, Any]], None] | None = None,
             poll_s: float = 0.5) -> DemoResult:
    """Submit the demo job, run the daemon until it ends, return the outcome.

    It waits as long as the job moves (a step, an attempt, a state): a loaded machine makes
    the job slower, never wrong. Only stall_s wall seconds without any move give up.
    """
    sub = validate_submission(spec_path, settings)
    ctx = build_context(settings)
    ctx.log = _file_logger(settings.home_path / "daemon.log")
    job = submit(sub, ctx.engine)
    runner = build_runner(ctx)
    started = moved = time.monotonic()
    seen: tuple[Any, ...] = ()
    runner.start()
    try:
        while True:
            snap = snapshot(ctx.engine, job.id)
            if on_update:
                on_update(snap)
            mark = (snap["state"], snap["step"], snap["attempts"], snap["attempt_state"])
            if mark != seen:
                seen, moved = mark, time.monotonic()
            if snap["terminal"] or time.monotonic() - moved > stall_s:
                break
            time.sleep(poll_s)  # the demo's own pacing of its status line
    finally:
        runner.stop(wait=True)
    # One last pass books the final seconds and settles the job.
    runner.run_once()
    snap = snapshot(ctx.engine, job.id)
    return DemoResult(job_id=job.id, state=snap["state"], reclaims=snap["reclaims"],
                      attempts=snap["attempts"], wall_s=time.monotonic() - started)


def proof(status: dict[str, Any], audit: dict[str, Any]) -> dict[str, Any]:
    """What the demo proved, from `status --json` and `audit --json` of its job.

    `failures` lists each promise not kept: at least two reclaims; every attempt after the
    first resumed from a step > 0 that the previous attempt reached, and trained past it;
    the job succeeded; the audit's causes add up to what was spent. `steps_lost_per_reclaim`
    is each reclaimed attempt's `lost_steps` from the status: None where no report gave its
    last step (unknown, not 0).
    """
    atts = status["attempts"]
    failures: list[str] = []
    lost: list[int | None] = [a["lost_steps"] for a in atts if a["end_reason"] == "reclaimed"]
    for prev, att in zip(atts, atts[1:]):
        start, prev_to = att["resumed_from"] or 0, prev["ran_to"] or 0
        if not (prev["resumed_from"] or 0) < start <= prev_to:
            failures.append(f"attempt {att['number']} resumed from {start}, not from a step "
                            f"attempt {prev['number']} saved past its start")
        finished_before = status["total_steps"] is not None and start >= status["total_steps"]
        if att["end_reason"] in ("reclaimed", "completed") and (att["ran_to"] or 0) <= start \
                and not finished_before:   # a job reclaimed after its last step only exits
            failures.append(f"attempt {att['number']} did not train past step {start}")
    reclaims = sum(1 for a in atts if a["end_reason"] == "reclaimed")
    if reclaims < 2:
        failures.append(f"{reclaims} reclaim(s), fewer than 2")
    if status["state"] != "succeeded":
        failures.append(f"job ended {status['state']}")
    if abs(audit["causes_total_usd"] - audit["actual_usd"]) > 1e-6:
        failures.append(f"audit causes ${audit['causes_total_usd']:.6f} != spent "
                        f"${audit['actual_usd']:.6f}")
    return {"reclaims": reclaims, "steps_lost_per_reclaim": lost,
            "spent_usd": audit["actual_usd"], "on_demand_usd": audit["baseline_on_demand_usd"],
            "saved_usd": audit["saved_usd"], "saved_fraction": audit["saved_fraction"],
            "failures": failures}


def _file_logger(path: Path) -> Any:
    """The daemon's JSON log goes to a file, so the demo's screen shows only its status."""
    configure_logging(stream=open(path, "a", buffering=1))
    return structlog.get_logger("spotrun.daemon")


def snapshot(engine: Any, job_id: str) -> dict[str, Any]:
    """A small view of the job for the live status line."""
    with session(engine) as s:
        job = s.get(Job, job_id)
        atts = attempts_of(s, job_id)
        spend = sum(e.usd for e in s.exec(select(SpendEntry).where(
            SpendEntry.job_id == job_id)))
    cur: Attempt | None = atts[-1] if atts else None
    return {
        "job_id": job_id, "state": job.state.value, "terminal": job.state.is_terminal(),
        "step": max([job.last_step] + [a.last_step for a in atts]), "total": job.total_steps,
        "attempts": len(atts),
        "reclaims": sum(1 for a in atts if a.end_reason is EndReason.RECLAIMED),
        "pool": f"{cur.instance_type} {cur.zone} {cur.market.value}" if cur else "-",
        "attempt_state": cur.state.value if cur else "-", "spend_usd": spend,
    }

DEFAULT_TIME_SCALE = 60.0
# Row 24 of the packaged extract (2023-03-02, us-east-1): short available stretches in
# us-east-1a, 1d and 1c (reclaims), a gap, then a long stretch in 1c to finish on.
DEFAULT_START_TICK = 24

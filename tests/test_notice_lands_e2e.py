"""Issue 23, point 5, end to end: a notice during a long validation saves the last finished step.

The user's case: a plain loop (tests/torch_jobs/plain_val_loop.py, patched as
docs/checkpointing.md says, `every_steps=40`) trains 100 steps, then validates slowly
without calling the library. `spotrun interrupt JOB` comes a few seconds into that
validation on the local provider (a 12-wall-second notice, the agent polling IMDS once a
wall second), on a loaded machine. The next attempt must resume from step 100, and the
reclaimed attempt's notice report must record the emergency checkpoint of step 100.
Everything is real: daemon loops, market process, agent, torch job, store, SQLite, CLI.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import kill_leftovers, write_trace
from polling import wait_for
from spotrun import layout
from spotrun.cli import cli
from spotrun.config import load_settings
from spotrun.daemon.app import build_context, build_runner
from spotrun.db import attempts_of, session
from spotrun.jobs import submit, validate_submission
from spotrun.reports import Notice, read_report
from spotrun.states import EndReason

pytest.importorskip("torch")
pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
JOB = REPO / "tests" / "torch_jobs" / "plain_val_loop.py"
STEPS = 100
# 30 validation batches of 1.5 s: about 45 s of validation after step 100.
JOB_ARGS = f"--steps {STEPS} --every-steps 40 --val-batches 30 --val-sleep-s 1.5"
NOTICE_WALL_S = 12.0
# The agent polls every notice_poll_interval_s market seconds / time_scale: 12 / 12 = 1 wall s.
TOML = """
[local]
trace = "{trace}"
time_scale = 12.0
notice_s = 120.0
notice_wall_s = {notice_wall_s}
boot_s = 12.0
[daemon]
schedule_interval_s = 0.2
reconcile_interval_s = 0.2
heartbeat_interval_s = 0.2
spend_interval_s = 1.0
liveness_interval_s = 1.0
heartbeat_timeout_s = 120.0
[agent]
heartbeat_interval_s = 0.2
log_flush_interval_s = 0.3
notice_poll_interval_s = 12.0
"""


@pytest.fixture
def daemon(tmp_home: Path, tmp_path: Path, cpu_load):
    """The daemon's loops in-process on a market that always has capacity, the machine loaded."""
    trace = write_trace(tmp_path / "trace.csv", {"zone-a": [1] * 50, "zone-b": [1] * 50},
                        tick_s=600.0)
    (tmp_home / "spotrun.toml").write_text(TOML.format(trace=trace, notice_wall_s=NOTICE_WALL_S))
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(JOB.read_text())
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: plain-val\ncommand: python train.py {JOB_ARGS}\nworkdir: code\n"
                    f"work: {{total_steps: {STEPS}}}\npolicy: {{market: spot}}\n")
    ctx = build_context(load_settings(str(tmp_home)))
    runner = build_runner(ctx)
    yield ctx, runner, spec
    runner.stop(wait=True)
    kill_leftovers(tmp_home / "market")


def _log(ctx, job, number: int) -> str:
    """The job's output of attempt `number` as shipped to the store so far."""
    store = ctx.store_for(job.store_uri)
    keys = [o.key for o in store.list(layout.log_prefix(job.id, number) + "/")]
    return "".join(store.get_bytes(k).decode(errors="replace") for k in sorted(keys))


def _attempt(ctx, job_id: str, number: int):
    with session(ctx.engine) as s:
        return next((a for a in attempts_of(s, job_id) if a.number == number), None)


def test_notice_during_a_long_validation_saves_the_last_step(daemon):
    ctx, runner, spec = daemon
    job = submit(validate_submission(spec, ctx.settings), ctx.engine)
    runner.start()
    # A few seconds into the validation that follows step 100 (the job prints each batch).
    wait_for(lambda: "validation-batch: 3" in _log(ctx, job, 1), 240,
             "attempt 1 to train 100 steps and validate three batches")
    assert f"trained-steps: {STEPS}" in _log(ctx, job, 1)
    # The daemon sees step 100 too (the heartbeat's step, while the job validates).
    wait_for(lambda: _attempt(ctx, job.id, 1).last_step == STEPS, 30, "step 100 in the database")
    out = CliRunner().invoke(cli, ["interrupt", job.id])
    assert out.exit_code == 0, out.output
    # The reclaim comes NOTICE_WALL_S later; then attempt 2 starts from the newest checkpoint.
    second = wait_for(lambda: (a := _attempt(ctx, job.id, 2)) is not None
                      and "resumed-at:" in _log(ctx, job, 2) and a, 240,
                      "attempt 2 to start its job")
    first = _attempt(ctx, job.id, 1)
    assert first.end_reason is EndReason.RECLAIMED and first.notice_at is not None
    notice = read_report(ctx.store_for(job.store_uri), layout.notice_key(job.id, 1), Notice)
    assert notice is not None and notice.signalled_at is not None
    assert notice.emergency_checkpoint_step == STEPS, (notice, _log(ctx, job, 1)[-2000:])
    assert f"resumed-at: {STEPS}" in _log(ctx, job, 2), _log(ctx, job, 2)[-2000:]
    # The daemon's record of where attempt 2 resumed (from the agent's heartbeat).
    start = wait_for(lambda: _attempt(ctx, job.id, 2).start_step, 60, "attempt 2's start step")
    assert second.number == 2 and start == STEPS

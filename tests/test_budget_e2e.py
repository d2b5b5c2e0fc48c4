"""A job with a small budget stops (checkpointed, budget_exhausted) before spend passes it;
`spotrun resume --budget-usd` carries on from the checkpoint to the end."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlmodel import select

from spotrun.cli import cli
from spotrun.config import load_settings
from spotrun.daemon.app import build_context, build_runner
from spotrun.db import Job, SpendEntry, attempts_of, session
from spotrun.jobs import submit, validate_submission
from spotrun.states import EndReason, JobState

from conftest import kill_leftovers, write_trace
from daemon_helpers import FAST_TOML
from polling import wait_for

pytestmark = pytest.mark.slow

# Saves on SIGUSR1 and says so (emergency_checkpoint_step), like spotrun.torch does.
WORKLOAD = r'''
import json, os, signal, time
from spotrun.checkpoints import put_checkpoint_files, latest_verified
from spotrun.store import open_store
flag = {"save": False}
signal.signal(signal.SIGUSR1, lambda s, f: flag.__setitem__("save", True))
store = open_store(os.environ["SPOTRUN_CHECKPOINT_URI"])
total = int(os.environ["SPOTRUN_TOTAL_STEPS"])
resume = os.environ.get("SPOTRUN_RESUME_CHECKPOINT", "")
start = int(resume.split("-")[1]) if resume else 0
last, emergency = (start or None), None
for step in range(start + 1, total + 1):
    time.sleep(0.01)
    if flag["save"] or step % 100 == 0 or step == total:
        put_checkpoint_files(store, step, {"s.json": b"{}"})
        last = step
        if flag["save"]:
            emergency, flag["save"] = step, False
    with open("p.tmp", "w") as f:
        json.dump({"step": step, "total_steps": total, "steps_per_s": 100.0,
                   "last_checkpoint_step": last, "checkpoint_save_s": 0.001,
                   "emergency_checkpoint_step": emergency}, f)
    os.replace("p.tmp", os.environ["SPOTRUN_PROGRESS_FILE"])
'''


def spend(ctx, job_id: str) -> float:
    with session(ctx.engine) as s:
        return sum(e.usd for e in s.exec(select(SpendEntry).where(SpendEntry.job_id == job_id)))


def state(ctx, job_id: str) -> JobState:
    with session(ctx.engine) as s:
        return s.get(Job, job_id).state


def test_budget_stop_then_resume(tmp_home: Path, tmp_path: Path, monkeypatch):
    trace = write_trace(tmp_path / "t.csv", {"za": [1] * 200}, tick_s=600.0)
    toml = FAST_TOML.format(trace=trace, scale=360.0, hb_timeout=60.0, lease_ttl=5.0)
    (tmp_home / "spotrun.toml").write_text(toml.replace("notice_s = 120.0",
                                                        "spot_price_usd_per_hour = 1.0"))
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(WORKLOAD)
    spec = tmp_path / "job.yaml"
    # 3000 steps of 10 ms = 30 wall s = 3 market hours at $1/h: a $3 budget cannot cover it.
    # A running job commits the stop margin's prior before any stop is measured: 25.9 wall
    # s (0.5 s check, 0.2 + 20 + 0.2 s of reconcile ticks and save window, the market's 5 s
    # terminate) at x360, $2.59: the stop comes after about $0.41 of spend.
    spec.write_text("name: budget\ncommand: python train.py\nworkdir: code\n"
                    "work: {total_steps: 3000}\ncheckpoint: {interval_minutes: 5}\n"
                    "policy: {market: spot, budget_usd: 3.0}\n")
    ctx = build_context(load_settings(str(tmp_home)))
    runner = build_runner(ctx)
    try:
        job = submit(validate_submission(spec, ctx.settings), ctx.engine)
        runner.start()
        wait_for(lambda: state(ctx, job.id).is_terminal(), 120, "the budget stop")
        runner.stop(wait=True)
        runner.run_once()  # book the final seconds
        assert state(ctx, job.id) is JobState.BUDGET_EXHAUSTED
        spent = spend(ctx, job.id)
        assert 0.3 < spent <= 3.0, spent
        with session(ctx.engine) as s:
            first = attempts_of(s, job.id)
            saved = s.get(Job, job.id).last_step
        assert first[-1].end_reason is EndReason.BUDGET
        assert 0 < saved < 3000

        monkeypatch.setenv("SPOTRUN_HOME", str(tmp_home))
        low = CliRunner().invoke(cli, ["resume", job.id, "--budget-usd", "0.1"])
        assert low.exit_code == 2 and "--budget-usd" in low.output
        # Ample: the market runs x360 whatever the CPU does, so a loaded machine spends more.
        ok = CliRunner().invoke(cli, ["resume", job.id, "--budget-usd", "50"])
        assert ok.exit_code == 0, ok.output

        runner = build_runner(ctx)
        runner.start()
        wait_for(lambda: state(ctx, job.id).is_terminal(), 120, "the resumed job to finish")
        runner.stop(wait=True)
        runner.run_once()
        assert state(ctx, job.id) is JobState.SUCCEEDED
        with session(ctx.engine) as s:
            later = attempts_of(s, job.id)[len(first):]
        assert later and later[0].start_step == saved   # resumed from the checkpoint
        assert spend(ctx, job.id) <= 50.0
    finally:
        runner.stop(wait=True)
        kill_leftovers(tmp_home / "market")

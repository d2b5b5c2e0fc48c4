"""A deadline counts on the provider's clock: on the x60 local market, 10 h are 10 market hours."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from spotrun.config import load_settings
from spotrun.daemon.app import build_context
from spotrun.daemon.scheduler import SchedulerLoop
from spotrun.db import Job, session
from spotrun.jobs import request_cancel, submit, validate_submission
from spotrun.spec import job_spec

from conftest import kill_leftovers, write_trace


def test_deadline_hours_are_provider_hours(tmp_home: Path, tmp_path: Path):
    trace = write_trace(tmp_path / "t.csv", {"za": [0] * 20}, tick_s=600.0)  # no spot at all
    (tmp_home / "spotrun.toml").write_text(f'[local]\ntrace = "{trace}"\ntime_scale = 60.0\n')
    spec = tmp_path / "job.yaml"
    spec.write_text("name: dl\ncommand: 'true'\npolicy: {market: spot, deadline_hours: 10}\n")
    settings = load_settings(str(tmp_home))
    ctx = build_context(settings)
    try:
        job = submit(validate_submission(spec, settings), ctx.engine)
        SchedulerLoop(ctx).tick(ctx.clock.now())
        market_now = ctx.provider.now()
        with session(ctx.engine) as s:
            stored = s.get(Job, job.id)
        assert stored.deadline_at is not None
        # Submitted moments ago: the deadline is ~10 market hours ahead, not 10 wall hours.
        left = stored.deadline_at - market_now
        assert timedelta(hours=9.9) < left <= timedelta(hours=10)
        assert job_spec(stored).policy.deadline == stored.deadline_at.isoformat()
        request_cancel(ctx.engine, job.id)
    finally:
        kill_leftovers(tmp_home / "market")

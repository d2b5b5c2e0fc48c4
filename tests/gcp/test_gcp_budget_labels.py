"""GCP: a job's Spot VM carries `spotrun_project` and `spotrun_owner` labels (the GCP form of
the `spotrun:project` / `spotrun:owner` tags), so the cloud's own bill groups the way
spotrun's budgets and `audit --by` do (docs/budgets.md, docs/gcp.md)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from spotrun.daemon.app import build_context
from spotrun.daemon.scheduler import SchedulerLoop
from spotrun.db import attempts_of, session
from spotrun.jobs import submit, validate_submission
from spotrun.providers.gcp.provider import GcpProvider

from .gce_fixtures import gce, gcp_settings  # noqa: F401  (fixture)

TYPE = "g2-standard-4"


def test_a_jobs_vm_is_labelled_with_its_project_and_owner(gce, tmp_home: Path,  # noqa: F811
                                                          tmp_path: Path):
    settings = gcp_settings(gce, str(tmp_home), {"budgets.allow_owner_override": True})
    ctx = build_context(settings, provider=GcpProvider.from_settings(settings))
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: labelled\ncommand: 'true'\nproject: vision\n"
                    f"resources: {{instance_types: [{TYPE}]}}\npolicy: {{market: spot}}\n")
    try:
        job = submit(validate_submission(spec, settings, owner="alice"), ctx.engine)
        SchedulerLoop(ctx).tick(datetime.now(timezone.utc))
        with session(ctx.engine) as s:
            [attempt] = attempts_of(s, job.id)
        assert attempt.instance_id, attempt.detail
        [inserted] = [c for c in gce.calls("POST") if c.path.endswith("/instances")]
        labels = inserted.body["labels"]
        assert labels["spotrun_project"] == "vision" and labels["spotrun_owner"] == "alice"
        assert labels["spotrun_job"] == job.id.lower()
        # Read back as spotrun's tags, as `audit --reconcile` and the orphan sweeper see them.
        [info] = ctx.provider.describe(instance_ids=[attempt.instance_id])
        assert info.tags["spotrun:project"] == "vision" and info.tags["spotrun:owner"] == "alice"
    finally:
        ctx.engine.dispose()

"""AWS (moto): a job's instance and its root volume carry `spotrun:project` and
`spotrun:owner`, so Cost Explorer can group the cloud's own bill the way spotrun's budgets
and `audit --by` do (docs/budgets.md). GCP labels come with the GCP provider."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from spotrun.daemon.app import build_context
from spotrun.daemon.scheduler import SchedulerLoop
from spotrun.db import attempts_of, session
from spotrun.jobs import submit, validate_submission
from spotrun.providers.aws.provider import AwsProvider

from .moto_fixtures import MotoServer, moto_settings

TYPE = "g5.xlarge"
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")


def _tags(resource: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in resource.get("Tags", [])}


def test_instances_and_volumes_carry_the_project_and_owner(moto: MotoServer, ec2: Any,
                                                           tmp_home: Path, tmp_path: Path):
    now = datetime.now(timezone.utc)
    moto.layer.set_prices([(TYPE, z, now - timedelta(hours=1), 0.43) for z in ZONES])
    settings = moto_settings(moto, ec2, str(tmp_home), {"budgets.allow_owner_override": True})
    ctx = build_context(settings, provider=AwsProvider.from_settings(settings))
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: tagged\ncommand: 'true'\nproject: vision\n"
                    f"resources: {{instance_types: [{TYPE}]}}\npolicy: {{market: spot}}\n")
    try:
        job = submit(validate_submission(spec, settings, owner="alice"), ctx.engine)
        SchedulerLoop(ctx).tick(datetime.now(timezone.utc))
        with session(ctx.engine) as s:
            [attempt] = attempts_of(s, job.id)
        assert attempt.instance_id, attempt.detail
        [inst] = [i for r in ec2.describe_instances(InstanceIds=[attempt.instance_id])
                  ["Reservations"] for i in r["Instances"]]
        tags = _tags(inst)
        assert (tags["spotrun:project"], tags["spotrun:owner"]) == ("vision", "alice")
        assert tags["spotrun:job"] == job.id
        vols = ec2.describe_volumes(Filters=[
            {"Name": "attachment.instance-id", "Values": [attempt.instance_id]}])["Volumes"]
        assert vols and all(_tags(v).get("spotrun:project") == "vision"
                            and _tags(v).get("spotrun:owner") == "alice" for v in vols)
    finally:
        ctx.engine.dispose()

"""End to end on AWS (moto): daemon + aws provider + S3 store + agents + real torch.

moto plays EC2 and S3 on 127.0.0.1; InstanceHost plays the machines: every instance
moto reports running gets a local agent started from that instance's user data, with
its own IMDSv2 server. The test serves the interruption notice through that server,
waits for the emergency checkpoint in S3, then EC2 reclaims the instance
(Server.SpotInstanceTermination). The daemon must launch a replacement that resumes
from S3 and finishes with the same weights, bit for bit, as an uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

import pytest
from test_e2e_local import TOTAL_STEPS, TRAIN_ARGS, _sha, job_log, wait_for

from spotrun import layout
from spotrun.agent.config import AgentConfig
from spotrun.aws_clients import make_client
from spotrun.daemon.app import build_context, build_runner
from spotrun.db import Attempt, Job, attempts_of, session
from spotrun.errors import ObjectNotFound, ProviderError, StoreError
from spotrun.jobs import submit, validate_submission
from spotrun.providers.aws.provider import AwsProvider
from spotrun.providers.aws.userdata import (AGENT_UNIT, SHUTDOWN_COMMAND,
                                            agent_json_from_user_data, render_user_data)
from spotrun.providers.base import LaunchRequest, Pool
from spotrun.states import AttemptState, EndReason, JobState, Market
from spotrun.store import open_store

from cloud_host import FAST_AGENT as AGENT, FAST_DAEMON as DAEMON

from .harness import POWEROFF_FILE, InstanceHost
from .moto_fixtures import FAKE_ENV, MotoServer, moto_settings

REPO = Path(__file__).resolve().parents[2]
BUCKET = "spotrun-e2e"
TYPE = "g5.xlarge"


@pytest.fixture
def aws_e2e(moto: MotoServer, ec2: Any, tmp_home: Path, tmp_path: Path) -> Iterator[tuple]:
    """A daemon on the aws provider and an S3 store in moto, and the host playing instances."""
    make_client("s3", region="us-east-1", endpoint_url=moto.url).create_bucket(Bucket=BUCKET)
    now = datetime.now(timezone.utc)
    moto.layer.set_prices([(TYPE, z, now - timedelta(hours=1), p) for z, p in
                           (("us-east-1a", 0.43), ("us-east-1b", 0.44), ("us-east-1c", 0.45))])
    settings = moto_settings(moto, ec2, str(tmp_home), {"store_uri": f"s3://{BUCKET}/spotrun"})
    settings = dataclasses.replace(settings, daemon=DAEMON, agent=AGENT)
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text((REPO / "configs" / "demo" / "train.py").read_text())
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: e2e-aws\ncommand: python train.py {TRAIN_ARGS}\nworkdir: code\n"
                    f"resources: {{instance_types: [{TYPE}]}}\n"
                    f"work: {{total_steps: {TOTAL_STEPS}}}\ncheckpoint: {{interval_minutes: 1}}\n"
                    "policy: {market: spot}\n")
    ctx = build_context(settings, provider=AwsProvider.from_settings(settings),
                        store=open_store(f"s3://{BUCKET}/spotrun"))
    runner = build_runner(ctx)
    host = InstanceHost(ec2, moto, tmp_path / "instances",
                        env={**FAKE_ENV, "AWS_ENDPOINT_URL": moto.url}).start()
    try:
        yield ctx, runner, host, spec
    finally:
        runner.stop(wait=True)
        host.stop()


def _attempt(ctx, job_id: str, number: int, min_progress: int) -> Attempt | None:
    with session(ctx.engine) as s:
        for a in attempts_of(s, job_id):
            if a.number == number and a.last_step >= a.start_step + min_progress:
                assert a.state is AttemptState.RUNNING, f"attempt {number} already {a.state}"
                return a
    return None


def _notice_saved(store, job_id: str, number: int) -> dict | None:
    try:
        notice = json.loads(store.get_bytes(layout.notice_key(job_id, number)))
    except (ObjectNotFound, StoreError, ValueError):   # not written yet
        return None
    return notice if notice.get("emergency_checkpoint_step") is not None else None


def _noticed(ctx, attempt_id: int) -> bool:
    with session(ctx.engine) as s:
        return s.get(Attempt, attempt_id).notice_at is not None


def _finished(ctx, job_id: str) -> Job | None:
    with session(ctx.engine) as s:
        job = s.get(Job, job_id)
        return job if job.state.is_terminal() else None


@pytest.mark.slow
def test_reclaim_with_notice_resumes_from_s3_bitwise_identical(reference_runs, aws_e2e, ec2):
    ctx, runner, host, spec = aws_e2e
    reference_runs.start(TRAIN_ARGS)   # overlaps the daemon's run; shared with other tests
    job = submit(validate_submission(spec, ctx.settings), ctx.engine)
    runner.start()
    first = wait_for(lambda: _attempt(ctx, job.id, 1, min_progress=60), 120,
                     "attempt 1 to run and make progress")
    machine = host.machine(first.instance_id)
    assert machine is not None
    # Cost allocation: the instance's root volume carries the job and attempt tags.
    vols = ec2.describe_volumes(Filters=[
        {"Name": "attachment.instance-id", "Values": [first.instance_id]}])["Volumes"]
    assert vols and all({"Key": "spotrun:job", "Value": job.id} in v["Tags"]
                        and {"Key": "spotrun:attempt", "Value": "1"} in v["Tags"] for v in vols)
    # EC2's two-minute warning, served by the instance's own metadata service.
    warn_at = datetime.now(timezone.utc) + timedelta(minutes=2)
    machine.imds.notice("terminate", warn_at.strftime("%Y-%m-%dT%H:%M:%SZ"))
    notice = wait_for(lambda: _notice_saved(ctx.store, job.id, 1), 60,
                      "the emergency checkpoint the notice asked for")
    saved_step = notice["emergency_checkpoint_step"]
    wait_for(lambda: _noticed(ctx, first.id), 30, "the daemon to record the notice")
    host.reclaim(first.instance_id)

    done = wait_for(lambda: _finished(ctx, job.id), 120, "the job to finish")
    runner.stop(wait=True)
    assert done.state is JobState.SUCCEEDED, done.reason
    assert not host.errors, host.errors
    with session(ctx.engine) as s:
        atts = attempts_of(s, job.id)
    assert [a.end_reason for a in atts] == [EndReason.RECLAIMED, EndReason.COMPLETED]
    # The replacement is a new instance that resumed from the notice's checkpoint in S3.
    assert atts[1].instance_id != atts[0].instance_id
    assert atts[1].start_step == saved_step > 0
    # The finished agent powered its instance off (shutdown behaviour terminate).
    second = host.machine(atts[1].instance_id)
    assert (second.disk / POWEROFF_FILE).read_text().strip() == SHUTDOWN_COMMAND
    state = ec2.describe_instances(InstanceIds=[atts[1].instance_id])[
        "Reservations"][0]["Instances"][0]
    assert state["State"]["Name"] == "terminated"
    assert state["StateReason"]["Code"] == "Client.InstanceInitiatedShutdown"
    assert _sha(job_log(ctx, done)) == reference_runs.sha(TRAIN_ARGS)


def _has_cost_tags(tags: list[dict[str, str]], job_id: str, attempt: int) -> bool:
    seen = {t["Key"]: t["Value"] for t in tags}
    return seen.get("spotrun:job") == job_id and seen.get("spotrun:attempt") == str(attempt)


def test_every_resource_a_launch_creates_carries_cost_tags(aws_settings, moto, ec2):
    cfg = AgentConfig(job_id="job-t", attempt=3, store_uri="s3://b/s",
                      checkpoint_uri="s3://b/s/ck", command="true")
    req = LaunchRequest(job_id="job-t", attempt_number=3, client_token="tok-t",
                        candidates=(Pool(TYPE, "us-east-1a", Market.SPOT),),
                        user_data=cfg.to_json())
    provider = AwsProvider.from_settings(aws_settings)
    info = provider.launch(provider.plan_launch(req))
    [inst] = ec2.describe_instances(InstanceIds=[info.instance_id])["Reservations"][0][
        "Instances"]
    assert _has_cost_tags(inst["Tags"], "job-t", 3)
    vols = ec2.describe_volumes(Filters=[
        {"Name": "attachment.instance-id", "Values": [info.instance_id]}])["Volumes"]
    assert vols and all(_has_cost_tags(v["Tags"], "job-t", 3) for v in vols)
    [fleet] = ec2.describe_fleets()["Fleets"]
    assert _has_cost_tags(fleet["Tags"], "job-t", 3)
    # The launch template lives only for the launch (it is deleted after); it was tagged.
    sent = moto.layer.calls("CreateLaunchTemplate")[0].params
    assert sent["TagSpecification.1.ResourceType"] == "launch-template"
    assert _has_cost_tags([{"Key": sent[k], "Value": sent[k[:-3] + "Value"]}
                           for k in sent if k.startswith("TagSpecification.1.Tag.")
                           and k.endswith(".Key")], "job-t", 3)
    # RunInstances (the other launch API) tags the spot request as well.
    ri = AwsProvider.from_settings(dataclasses.replace(
        aws_settings, aws=dataclasses.replace(aws_settings.aws, launch_api="run_instances")))
    specs = ri.plan_launch(req).calls[0]["params"]["TagSpecifications"]
    assert [s["ResourceType"] for s in specs] == ["instance", "volume", "spot-instances-request"]
    assert all(_has_cost_tags(s["Tags"], "job-t", 3) for s in specs)


def test_user_data_makes_the_agent_power_off_and_keeps_a_chosen_command():
    cfg = AgentConfig(job_id="j", attempt=1, store_uri="s3://b/s", checkpoint_uri="s3://b/c",
                      command="true")
    text = render_user_data(cfg.to_json())
    assert AgentConfig.from_json(agent_json_from_user_data(text)).shutdown_command == \
        SHUTDOWN_COMMAND
    mine = AgentConfig(**{**json.loads(cfg.to_json()), "shutdown_command": "halt -p"})
    assert AgentConfig.from_json(agent_json_from_user_data(
        render_user_data(mine.to_json()))).shutdown_command == "halt -p"
    with pytest.raises(ProviderError):
        render_user_data("not json")


def test_agent_unit_restarts_only_abnormal_exits_and_verifies(tmp_path):
    unit = dict(line.split("=", 1) for line in AGENT_UNIT.splitlines()
                if "=" in line and not line.startswith("#"))
    assert unit["Restart"] == "on-abnormal"     # a failed command is the daemon's to rerun
    assert unit["StateDirectory"] == "spotrun"
    assert unit["ExecStart"].endswith("--dir /var/lib/spotrun")
    assert "User" not in unit                   # root: the agent powers the instance off
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed")
    # verify insists the binary exists; the instance's venv does not exist here.
    path = tmp_path / "spotrun-agent.service"
    path.write_text(AGENT_UNIT.replace("/opt/spotrun/bin/spotrun", sys.executable))
    out = subprocess.run([tool, "verify", str(path)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr

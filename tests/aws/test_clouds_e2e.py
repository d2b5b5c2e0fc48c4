"""One daemon, two clouds, end to end on 127.0.0.1 (docs/clouds.md): moto plays AWS (EC2, S3),
the fake Compute Engine and fake-gcs-server play GCP, InstanceHost and GceHost the machines.

A job starts on AWS spot (the cheapest progress); its instance is reclaimed and AWS then has no
capacity for it. The daemon moves it: the resume checkpoint is copied from s3:// into gs://
(manifest last, every file checked), the egress booked, and the job resumes on a GCP Spot VM
and finishes with the same weights, bit for bit, as an uninterrupted run. The ledger holds each
cloud's instance seconds by its own billing rules and one egress row; the audit's causes sum
to the bill; status and the audit name the cloud of each attempt.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

import pytest
from click.testing import CliRunner
from sqlmodel import select
from daemon_helpers import all_booked
from test_e2e_local import TOTAL_STEPS, TRAIN_ARGS, _sha, wait_for

from spotrun import layout
from spotrun.aws_clients import make_client
from spotrun.checkpoints import resume_point
from spotrun.cli import cli
from spotrun.config import load_settings
from spotrun.daemon.app import build_context, build_runner
from spotrun.db import Attempt, CheckpointMove, Job, SpendEntry, attempts_of, session
from spotrun.errors import ObjectNotFound, StoreError
from spotrun.jobs import submit, validate_submission
from spotrun.providers.billing_rules import SpendKind
from spotrun.providers.facts import rules_for
from spotrun.states import EndReason, JobState, Market
from spotrun.store import open_store
from spotrun.ui.views import audit_view

from cloud_host import FAST_AGENT as AGENT, FAST_DAEMON as DAEMON
from gcp.compute_state import ComputeState
from gcp.fake_compute import FakeCompute
from gcp.gcs_emulator import gcs_emulator  # noqa: F401  (fixture)
from gcp.harness import GceHost
from gcp.gce_fixtures import IMAGE

from .harness import InstanceHost
from .moto_fixtures import FAKE_ENV, MotoServer

REPO = Path(__file__).resolve().parents[2]
AWS_TYPE, GCP_TYPE = "g5.xlarge", "g2-standard-4"
AWS_ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")


@pytest.fixture
def two_clouds(moto: MotoServer, ec2: Any, gcs_emulator, tmp_home: Path,  # noqa: F811
               tmp_path: Path, monkeypatch, cpu_load) -> Iterator[tuple]:
    """A daemon with providers = [aws, gcp]: each cloud its store, each its machines."""
    bucket = f"clouds-{uuid.uuid4().hex[:8]}"
    make_client("s3", region="us-east-1", endpoint_url=moto.url).create_bucket(Bucket=bucket)
    gcs_bucket = gcs_emulator.make_bucket(bucket)
    for key, value in gcs_emulator.env.items():   # the daemon's gs:// client, in this process
        monkeypatch.setenv(key, value)
    # AWS's spot price well below GCP's catalog price for a like GPU: AWS is the first choice.
    now = datetime.now(timezone.utc)
    moto.layer.set_prices([(AWS_TYPE, z, now - timedelta(hours=1), 0.12) for z in AWS_ZONES])
    fake = FakeCompute(ComputeState()).start()
    subnets = [f"{s['AvailabilityZone']}={s['SubnetId']}"
               for s in ec2.describe_subnets()["Subnets"] if s["AvailabilityZone"] in AWS_ZONES]
    ami = ec2.describe_images(Owners=["amazon"], Filters=[
        {"Name": "name", "Values": ["Deep Learning AMI*"]}])["Images"][0]["ImageId"]
    sg = ec2.describe_security_groups()["SecurityGroups"][0]["GroupId"]
    # As docs/clouds.md says: the clouds in use, each section as for one provider, each a store.
    (tmp_home / "spotrun.toml").write_text(
        'providers = ["aws", "gcp"]\n'
        f'[aws]\nendpoint_url = "{moto.url}"\nami_id = "{ami}"\n'
        f'subnets = {json.dumps(subnets)}\nsecurity_group_ids = ["{sg}"]\n'
        'spotrun_install = "spotrun==0.1.0"\nvolume_size_gb = 50\nretry_base_s = 0.001\n'
        'retry_max_s = 0.01\nretry_attempts = 4\nspot_advisor_url = ""\n'
        'capacity_cooldown_s = 3600.0\n'
        f'store_uri = "s3://{bucket}/spotrun"\n'
        f'[gcp]\nproject = "{fake.state.project}"\nregion = "{fake.state.region}"\n'
        f'zones = {json.dumps(list(fake.state.zones))}\nendpoint_url = "{fake.url}"\n'
        f'image = "{IMAGE}"\nspotrun_install = "spotrun==0.1.0"\noperation_timeout_s = 20.0\n'
        f'store_uri = "gs://{gcs_bucket}/spotrun"\n')
    settings = dataclasses.replace(load_settings(str(tmp_home)), daemon=DAEMON, agent=AGENT)
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text((REPO / "configs" / "demo" / "train.py").read_text())
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: e2e-clouds\ncommand: python train.py {TRAIN_ARGS}\nworkdir: code\n"
                    f"resources: {{instance_types: [{AWS_TYPE}, {GCP_TYPE}]}}\n"
                    f"work: {{total_steps: {TOTAL_STEPS}}}\ncheckpoint: {{interval_minutes: 1}}\n"
                    "policy: {market: spot}\n")
    ctx = build_context(settings)
    runner = build_runner(ctx)
    env = {**FAKE_ENV, "AWS_ENDPOINT_URL": moto.url, **gcs_emulator.env}
    aws_host = InstanceHost(ec2, moto, tmp_path / "instances", env=env).start()
    gcp_host = GceHost(fake.state, tmp_path / "vms", env=env).start()
    try:
        yield ctx, settings, runner, aws_host, gcp_host, moto, spec
    finally:
        runner.stop(wait=True)
        aws_host.stop()
        gcp_host.stop()
        fake.stop()


def _running(ctx: Any, job_id: str, number: int, min_progress: int) -> Attempt | None:
    with session(ctx.engine) as s:
        for a in attempts_of(s, job_id):
            if a.number == number and a.last_step >= a.start_step + min_progress:
                return a
    return None


def _notice_saved(store: Any, job_id: str, number: int) -> dict | None:
    try:
        notice = json.loads(store.get_bytes(layout.notice_key(job_id, number)))
    except (ObjectNotFound, StoreError, ValueError):   # not written yet
        return None
    return notice if notice.get("emergency_checkpoint_step") is not None else None


def _running_on(ctx: Any, job_id: str, cloud: str) -> Attempt | None:
    with session(ctx.engine) as s:
        for a in attempts_of(s, job_id):
            if a.cloud == cloud and a.running_at is not None and a.last_step > a.start_step:
                return a
    return None


def _finished(ctx: Any, job_id: str) -> Job | None:
    with session(ctx.engine) as s:
        job = s.get(Job, job_id)
        return job if job.state.is_terminal() else None


@pytest.mark.slow
def test_a_job_reclaimed_on_aws_resumes_on_gcp_from_its_checkpoint_copied_into_gs(
        reference_runs, two_clouds):
    ctx, settings, runner, aws_host, gcp_host, moto, spec = two_clouds
    reference_runs.start(TRAIN_ARGS)   # overlaps the daemon's run; shared with other tests
    job = submit(validate_submission(spec, settings), ctx.engine)
    runner.start()
    first = wait_for(lambda: _running(ctx, job.id, 1, min_progress=60), 120,
                     "attempt 1 to run on AWS and make progress")
    assert first.cloud == "aws" and first.instance_type == AWS_TYPE
    aws = ctx.peers["aws"]
    # AWS reclaims it with its two-minute warning, and then has no room for the type.
    machine = aws_host.machine(first.instance_id)
    warn_at = datetime.now(timezone.utc) + timedelta(minutes=2)
    machine.imds.notice("terminate", warn_at.strftime("%Y-%m-%dT%H:%M:%SZ"))
    notice = wait_for(lambda: _notice_saved(aws.store, job.id, 1), 60,
                      "the emergency checkpoint in s3://")
    saved_step = notice["emergency_checkpoint_step"]
    for zone in AWS_ZONES:
        moto.layer.set_no_capacity(AWS_TYPE, zone)
    aws_host.reclaim(first.instance_id)

    moved = wait_for(lambda: _running_on(ctx, job.id, "gcp"), 180,
                     "an attempt on a GCP Spot VM to run")
    assert moved.instance_type == GCP_TYPE and moved.market is Market.SPOT
    assert moved.start_step == saved_step > 0
    done = wait_for(lambda: _finished(ctx, job.id), 180, "the job to finish on GCP")
    wait_for(lambda: all_booked(ctx.engine), 60, "every instance's ledger closed")
    runner.stop(wait=True)
    assert done.state is JobState.SUCCEEDED, done.reason
    assert not aws_host.errors and not gcp_host.errors, (aws_host.errors, gcp_host.errors)
    # The finishing attempt's log is in GCP's store, under the job's own keys.
    gcs = ctx.peers["gcp"].store
    log = "".join(gcs.get_bytes(o.key).decode() for o in gcs.list(f"jobs/{job.id}/logs/"))
    assert _sha(log) == reference_runs.sha(TRAIN_ARGS)

    with session(ctx.engine) as s:
        atts = attempts_of(s, job.id)
        rows = list(s.exec(select(SpendEntry).where(SpendEntry.job_id == job.id)))
        [move] = list(s.exec(select(CheckpointMove).where(CheckpointMove.job_id == job.id)))
    assert atts[0].end_reason is EndReason.RECLAIMED and atts[-1].end_reason is \
        EndReason.COMPLETED and atts[-1].cloud == "gcp"
    # The copy in gs:// is the checkpoint the GCP attempt resumed from, complete and verified.
    assert (move.src_cloud, move.dst_cloud) == ("aws", "gcp")
    gs = open_store(f"{ctx.peers['gcp'].store.uri}/{layout.default_checkpoint_prefix(job.id)}")
    assert resume_point(gs) is not None
    # Each cloud's instance seconds by its own rules; one egress row at AWS's rate.
    for att in atts:
        if att.started_at is None or att.ended_at is None:
            continue   # a launch AWS refused for capacity: no instance, no bill
        rules = rules_for(att.cloud)
        compute = [r for r in rows if r.attempt_id == att.id
                   and r.kind in SpendKind.instance_kinds()]
        used_s = (att.ended_at - att.started_at).total_seconds()
        billed = rules.billed_seconds(used_s, market=Market.SPOT,
                                      reclaimed_by_provider=att.end_reason is EndReason.RECLAIMED)
        assert abs(sum(r.billed_seconds for r in compute) - billed) < 1.5, (att.cloud, used_s)
    [egress] = [r for r in rows if r.kind == SpendKind.EGRESS.value]
    assert move.nbytes > 0 and egress.usd == pytest.approx(move.nbytes / 1e9 * 0.09)
    [audit] = audit_view(settings, [job.id])
    assert audit.causes["egress"].usd == pytest.approx(egress.usd)
    assert abs(audit.causes_total_usd() - audit.actual_usd) < 1e-4
    assert {a.cloud for a in audit.attempts} >= {"aws", "gcp"}
    # status names the cloud of each attempt.
    res = CliRunner().invoke(cli, ["status", job.id, "--json"],
                             env={"SPOTRUN_HOME": settings.home, "COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    clouds = [a["cloud"] for a in json.loads(res.output)["attempts"]]
    assert clouds[0] == "aws" and clouds[-1] == "gcp"

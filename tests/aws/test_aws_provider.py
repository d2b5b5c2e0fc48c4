"""The aws provider against moto on 127.0.0.1: launch, tags, user data, describe, terminate."""

from __future__ import annotations

import base64
import dataclasses
import json

import pytest

from spotrun.agent.config import AgentConfig
from spotrun.aws_clients import make_client
from spotrun.config import load_settings
from spotrun.errors import CapacityError, ConfigError, ProviderError
from spotrun.providers import make_provider
from spotrun.providers.aws.provider import AwsProvider
from spotrun.providers.aws.userdata import agent_json_from_user_data
from spotrun.providers.base import TAG_ATTEMPT, TAG_JOB, LaunchRequest, Pool
from spotrun.states import InstanceState, Market, TerminationCause

from .conftest import make_instance_profile


def agent_json(job: str = "job-a", attempt: int = 1) -> str:
    return AgentConfig(job_id=job, attempt=attempt, store_uri="s3://bkt/store",
                       checkpoint_uri="s3://bkt/store/jobs/job-a/checkpoints",
                       command="python train.py").to_json()


def request(token: str = "tok-1", job: str = "job-a", attempt: int = 1,
            pools: tuple[tuple[str, str, Market], ...] = (
                ("g5.xlarge", "us-east-1b", Market.SPOT),
                ("g4dn.xlarge", "us-east-1c", Market.SPOT),
                ("g5.xlarge", "us-east-1a", Market.ON_DEMAND)),
            max_price: float | None = None) -> LaunchRequest:
    return LaunchRequest(job_id=job, attempt_number=attempt, client_token=token,
                         candidates=tuple(Pool(t, z, m) for t, z, m in pools),
                         user_data=agent_json(job, attempt), tags={"team": "ml"},
                         max_price_usd_per_hour=max_price)


def run_instances_provider(settings) -> AwsProvider:
    aws = dataclasses.replace(settings.aws, launch_api="run_instances")
    return AwsProvider.from_settings(dataclasses.replace(settings, aws=aws))


def test_make_provider_finds_aws(aws_settings):
    assert isinstance(make_provider(aws_settings), AwsProvider)


def test_plan_is_pure_and_printable(provider, moto):
    before = len(moto.layer.calls())
    plan = provider.plan_launch(request())
    assert len(moto.layer.calls()) == before
    d = plan.to_dict()
    text = json.dumps(d)
    assert "<user data>" in text and "python train.py" not in text
    apis = [c["api"] for c in d["calls"]]
    assert apis == ["ec2.create_launch_template", "ec2.create_fleet", "ec2.create_fleet"]
    spot_fleet = d["calls"][1]["params"]
    assert spot_fleet["Type"] == "instant"
    assert spot_fleet["SpotOptions"]["AllocationStrategy"] == "price-capacity-optimized"
    assert [o["InstanceType"] for o in spot_fleet["LaunchTemplateConfigs"][0]["Overrides"]] == [
        "g5.xlarge", "g4dn.xlarge"]
    assert d["calls"][2]["params"]["TargetCapacitySpecification"][
        "DefaultTargetCapacityType"] == "on-demand"


def test_launch_by_fleet_tags_userdata_describe(provider, moto, ec2):
    info = provider.launch(provider.plan_launch(request()))
    assert (info.instance_type, info.zone, info.market) == ("g5.xlarge", "us-east-1b",
                                                            Market.SPOT)
    assert info.state in (InstanceState.PENDING, InstanceState.RUNNING)
    assert info.tags[TAG_JOB] == "job-a" and info.tags[TAG_ATTEMPT] == "1"
    assert info.tags["team"] == "ml" and info.client_token == "tok-1"
    raw = ec2.describe_instance_attribute(InstanceId=info.instance_id, Attribute="userData")
    text = base64.b64decode(raw["UserData"]["Value"]).decode()
    assert text.startswith("#cloud-config")
    assert "spotrun==0.1.0" in text and "spotrun-agent.service" in text
    cfg = AgentConfig.from_json(agent_json_from_user_data(text))
    assert (cfg.job_id, cfg.attempt, cfg.command) == ("job-a", 1, "python train.py")
    lt = moto.layer.calls("CreateLaunchTemplate")[0].params
    assert lt["LaunchTemplateData.InstanceInitiatedShutdownBehavior"] == "terminate"
    assert lt["LaunchTemplateData.MetadataOptions.HttpTokens"] == "required"
    # The template is removed once the fleet has answered.
    assert ec2.describe_launch_templates()["LaunchTemplates"] == []
    [seen] = provider.describe(job_id="job-a")
    assert seen.instance_id == info.instance_id
    assert provider.describe(job_id="other") == []
    assert provider.describe(instance_ids=[info.instance_id])[0].zone == "us-east-1b"


def test_launch_by_run_instances(aws_settings, moto, ec2):
    arn = make_instance_profile(moto)
    p = run_instances_provider(dataclasses.replace(
        aws_settings, aws=dataclasses.replace(aws_settings.aws, instance_profile_arn=arn)))
    plan = p.plan_launch(request(max_price=0.9))
    assert [c["api"] for c in plan.calls] == ["ec2.run_instances"] * 3
    info = p.launch(plan)
    assert (info.instance_type, info.zone, info.market) == ("g5.xlarge", "us-east-1b",
                                                            Market.SPOT)
    attr = ec2.describe_instance_attribute(InstanceId=info.instance_id,
                                           Attribute="instanceInitiatedShutdownBehavior")
    assert attr["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
    vols = ec2.describe_volumes(Filters=[{"Name": "attachment.instance-id",
                                          "Values": [info.instance_id]}])["Volumes"]
    assert vols and all({"Key": TAG_JOB, "Value": "job-a"} in v["Tags"] for v in vols)
    sent = moto.layer.calls("RunInstances")[0].params
    assert sent["InstanceMarketOptions.SpotOptions.MaxPrice"] == "0.9000"
    assert sent["IamInstanceProfile.Arn"] == arn


def test_on_demand_candidate_launches_on_demand(provider):
    req = request(pools=(("g4dn.xlarge", "us-east-1a", Market.ON_DEMAND),))
    info = provider.launch(provider.plan_launch(req))
    assert info.market is Market.ON_DEMAND
    assert info.price_usd_per_hour == pytest.approx(0.526)


def test_capacity_error_moves_to_next_candidate_fleet(provider, moto):
    moto.layer.set_no_capacity("g5.xlarge", "us-east-1b")
    info = provider.launch(provider.plan_launch(request()))
    assert (info.instance_type, info.zone) == ("g4dn.xlarge", "us-east-1c")
    assert "g5.xlarge/us-east-1b/spot" in provider.pools_cooling()


def test_capacity_error_moves_to_next_candidate_run_instances(aws_settings, moto):
    p = run_instances_provider(aws_settings)
    moto.layer.set_no_capacity("g5.xlarge", "us-east-1b")
    moto.layer.set_no_capacity("g4dn.xlarge", "us-east-1c", code="MaxSpotInstanceCountExceeded")
    info = p.launch(p.plan_launch(request()))
    assert (info.instance_type, info.zone, info.market) == ("g5.xlarge", "us-east-1a",
                                                            Market.ON_DEMAND)
    assert p.pools_cooling() == {"g5.xlarge/us-east-1b/spot", "g4dn.xlarge/us-east-1c/spot"}
    # Capacity errors are not retried: one call per pool.
    assert len(moto.layer.calls("RunInstances")) == 3


def test_all_candidates_full_raises_capacity_error(provider, moto):
    for t, z in (("g5.xlarge", "us-east-1b"), ("g4dn.xlarge", "us-east-1c"),
                 ("g5.xlarge", "us-east-1a")):
        moto.layer.set_no_capacity(t, z)
    with pytest.raises(CapacityError) as ei:
        provider.launch(provider.plan_launch(request()))
    assert len(ei.value.failures) == 3
    assert provider.describe(job_id="job-a") == []


def test_throttling_is_retried_then_succeeds(provider, moto):
    moto.layer.fail("CreateFleet", "RequestLimitExceeded", status=503, times=2)
    info = provider.launch(provider.plan_launch(request()))
    assert info.instance_type == "g5.xlarge"
    assert [c.status for c in moto.layer.calls("CreateFleet")] == [503, 503, 200]
    assert len(provider.describe(job_id="job-a")) == 1


def test_throttling_gives_up_after_the_retry_budget(provider, moto):
    moto.layer.fail("DescribeInstances", "RequestLimitExceeded", status=503, times=None)
    with pytest.raises(ProviderError):
        provider.describe(job_id="job-a")
    assert len(moto.layer.calls("DescribeInstances")) == 4


def test_crash_after_launch_call_does_not_start_a_second_instance(aws_settings, moto):
    plan_req = request(token="tok-crash")
    first = AwsProvider.from_settings(aws_settings)
    info = first.launch(first.plan_launch(plan_req))
    # The daemon died before writing the instance id; a new process retries the same attempt.
    again = AwsProvider.from_settings(aws_settings)
    info2 = again.launch(again.plan_launch(plan_req))
    assert info2.instance_id == info.instance_id
    assert len(again.describe(job_id="job-a")) == 1


def test_client_token_emulation_answers_like_aws(aws_settings, moto, ec2):
    ami = aws_settings.aws.ami_id
    args = dict(ImageId=ami, MinCount=1, MaxCount=1, InstanceType="g5.xlarge", ClientToken="t1")
    a = ec2.run_instances(**args)["Instances"][0]["InstanceId"]
    b = ec2.run_instances(**args)["Instances"][0]["InstanceId"]
    assert a == b
    with pytest.raises(Exception) as ei:
        ec2.run_instances(**{**args, "InstanceType": "g4dn.xlarge"})
    assert "IdempotentParameterMismatch" in str(ei.value)


def test_terminate_is_idempotent_and_cause_is_user(provider):
    info = provider.launch(provider.plan_launch(request()))
    provider.terminate(info.instance_id)
    provider.terminate(info.instance_id)
    provider.terminate("i-0123456789abcdef0")
    [gone] = provider.describe(instance_ids=[info.instance_id])
    assert gone.state is InstanceState.TERMINATED
    assert gone.cause is TerminationCause.USER and gone.ended_at is not None


def test_reclaim_and_instance_shutdown_are_recognised(provider, moto):
    a = provider.launch(provider.plan_launch(request(token="ta", attempt=1)))
    b = provider.launch(provider.plan_launch(request(token="tb", attempt=2)))
    moto.reclaim(a.instance_id)
    moto.shutdown_from_inside(b.instance_id)
    by_id = {i.instance_id: i for i in provider.describe(job_id="job-a")}
    assert by_id[a.instance_id].cause is TerminationCause.SPOT_RECLAIM
    assert by_id[b.instance_id].cause is TerminationCause.INSTANCE_SHUTDOWN
    assert all(i.state is InstanceState.TERMINATED for i in by_id.values())


def test_bad_subnet_setting_is_a_config_error(tmp_path):
    s = load_settings(str(tmp_path), {"provider": "aws", "aws.subnets": ["us-east-1a"]})
    with pytest.raises(ConfigError) as ei:
        AwsProvider.from_settings(s, ec2=object())
    assert ei.value.field == "aws.subnets"


def test_launch_without_ami_is_a_config_error(tmp_path):
    # No endpoint is ever called: planning is pure (the client points at a closed port).
    s = load_settings(str(tmp_path), {"provider": "aws"})
    ec2 = make_client("ec2", region="us-east-1", endpoint_url="http://127.0.0.1:9")
    p = AwsProvider.from_settings(s, ec2=ec2)
    with pytest.raises(ConfigError) as ei:
        p.plan_launch(request())
    assert ei.value.field == "aws.ami_id"


def test_describe_reads_every_page(provider, moto, ec2, monkeypatch):
    # Five reservations a page (EC2's least): seven managed instances take two pages.
    import spotrun.providers.aws.provider as aws_provider
    monkeypatch.setattr(aws_provider, "DESCRIBE_PAGE_SIZE", 5)
    ami = provider.cfg.ami_id
    for k in range(7):
        ec2.run_instances(ImageId=ami, InstanceType="g5.xlarge", MinCount=1, MaxCount=1,
                          TagSpecifications=[{"ResourceType": "instance", "Tags": [
                              {"Key": "spotrun:managed", "Value": "true"},
                              {"Key": TAG_JOB, "Value": "job-pages"},
                              {"Key": TAG_ATTEMPT, "Value": str(k)}]}])
    found = provider.describe(job_id="job-pages")
    assert sorted(i.tags[TAG_ATTEMPT] for i in found) == [str(k) for k in range(7)]
    calls = moto.layer.calls("DescribeInstances")
    assert len(calls) == 2 and calls[0].params["MaxResults"] == "5"
    assert calls[1].params["NextToken"]

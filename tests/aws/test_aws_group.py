"""Multi-node on the aws provider against moto: one instant fleet for a group, placement groups,
all-or-nothing, idempotent retries, and a reclaim rehearsed through FIS."""

from __future__ import annotations

import json

import pytest

from polling import wait_for
from spotrun.errors import BadInputError, CapacityError, ConfigError
from spotrun.providers.aws.provider import AwsProvider
from spotrun.providers.base import TAG_NODE, LaunchRequest, Pool
from spotrun.states import InstanceState, Market, TerminationCause

from .test_aws_provider import agent_json

A = Pool("g5.xlarge", "us-east-1a", Market.SPOT)          # no EFA
B = Pool("g5.xlarge", "us-east-1b", Market.SPOT)
EFA = Pool("p4d.24xlarge", "us-east-1c", Market.SPOT)     # EFA: a cluster placement group


def group(token: str = "grp-1", *pools: Pool, count: int = 2, ranks: tuple[int, ...] = (0, 1),
          job: str = "job-g") -> LaunchRequest:
    return LaunchRequest(job_id=job, attempt_number=1, client_token=token,
                         candidates=tuple(pools or (A,)), user_data=agent_json(job, 1),
                         tags={"team": "ml"}, count=count, node_ranks=ranks)


def test_group_plan_is_one_fleet_for_all_nodes_and_pure(provider, moto):
    before = len(moto.layer.calls())
    plan = provider.plan_launch(group("grp-plan", A, EFA))
    assert len(moto.layer.calls()) == before
    d = plan.to_dict()
    assert [c["api"] for c in d["calls"]] == [
        "ec2.create_launch_template", "ec2.create_fleet", "ec2.create_placement_group",
        "ec2.create_fleet"]
    first, efa = d["calls"][1]["params"], d["calls"][3]["params"]
    assert first["Type"] == "instant"
    assert first["TargetCapacitySpecification"]["TotalTargetCapacity"] == 2
    assert first["SpotOptions"]["MinTargetCapacity"] == 2
    assert len(first["LaunchTemplateConfigs"][0]["Overrides"]) == 1
    assert "Placement" not in first["LaunchTemplateConfigs"][0]["Overrides"][0]
    group_name = d["calls"][2]["params"]["GroupName"]
    assert d["calls"][2]["params"]["Strategy"] == "cluster"
    assert efa["LaunchTemplateConfigs"][0]["Overrides"][0]["Placement"] == {
        "GroupName": group_name}
    assert first["ClientToken"] != efa["ClientToken"]
    json.dumps(d)


def test_group_launch_is_one_fleet_call_tags_ranks_and_private_ips(provider, moto, ec2):
    infos = provider.launch_group(provider.plan_launch(group()))
    assert [i.tags[TAG_NODE] for i in infos] == ["0", "1"]
    assert len({i.instance_id for i in infos}) == 2
    assert {(i.instance_type, i.zone, i.market) for i in infos} == {
        ("g5.xlarge", "us-east-1a", Market.SPOT)}
    assert all(i.private_ip and i.private_ip.count(".") == 3 for i in infos)
    assert len(moto.layer.calls("CreateFleet")) == 1
    assert moto.layer.calls("CreateFleet")[0].params[
        "TargetCapacitySpecification.TotalTargetCapacity"] == "2"
    seen = {i.instance_id: i.tags[TAG_NODE] for i in provider.describe(job_id="job-g")}
    assert seen == {i.instance_id: i.tags[TAG_NODE] for i in infos}
    assert ec2.describe_launch_templates()["LaunchTemplates"] == []


def test_group_retry_with_the_same_token_returns_the_same_instances(aws_settings, moto):
    first = AwsProvider.from_settings(aws_settings)
    a = first.launch_group(first.plan_launch(group("grp-crash")))
    again = AwsProvider.from_settings(aws_settings)
    b = again.launch_group(again.plan_launch(group("grp-crash")))
    assert [i.instance_id for i in a] == [i.instance_id for i in b]
    assert len(again.describe(job_id="job-g")) == 2


def test_efa_type_launches_into_the_jobs_cluster_placement_group(provider, moto):
    infos = provider.launch_group(provider.plan_launch(group("grp-efa", EFA)))
    assert len(infos) == 2 and infos[0].instance_type == "p4d.24xlarge"
    [name] = moto.layer.placement_groups()
    assert moto.layer.placement_groups()[name] == "cluster" and "job-g" in name
    sent = moto.layer.calls("CreateFleet")[0].params
    assert sent["LaunchTemplateConfigs.1.Overrides.1.Placement.GroupName"] == name
    # A replacement node of the same job goes into the same group (created once).
    [rep] = provider.launch_group(provider.plan_launch(group("grp-efa-r", EFA, count=1,
                                                             ranks=(1,))))
    assert rep.tags[TAG_NODE] == "1"
    assert len(moto.layer.placement_groups()) == 1
    assert moto.layer.calls("CreateFleet")[1].params[
        "LaunchTemplateConfigs.1.Overrides.1.Placement.GroupName"] == name


def test_partial_fleet_is_terminated_and_the_next_pool_gets_the_group(provider, moto):
    moto.layer.set_capacity("g5.xlarge", "us-east-1a", 1)
    infos = provider.launch_group(provider.plan_launch(group("grp-part", A, B)))
    assert {i.zone for i in infos} == {"us-east-1b"} and len(infos) == 2
    by_zone = {}
    for i in provider.describe(job_id="job-g"):
        by_zone.setdefault(i.zone, []).append(i)
    [partial] = by_zone["us-east-1a"]
    assert partial.state is InstanceState.TERMINATED       # never left running
    assert "g5.xlarge/us-east-1a/spot" in provider.pools_cooling()


def test_no_pool_with_room_for_all_raises_and_leaves_nothing_running(provider, moto):
    moto.layer.set_capacity("g5.xlarge", "us-east-1a", 1)
    moto.layer.set_no_capacity("g5.xlarge", "us-east-1b")
    with pytest.raises(CapacityError) as ei:
        provider.launch_group(provider.plan_launch(group("grp-none", A, B)))
    assert "all 2 instances" in str(ei.value)
    assert all(i.state is InstanceState.TERMINATED for i in provider.describe(job_id="job-g"))


def test_interrupt_through_fis_notices_then_reclaims(provider, moto):
    a, b = provider.launch_group(provider.plan_launch(group("grp-fis")))
    heard: list[tuple[str, str]] = []
    moto.layer.on_notice(lambda iid, when: heard.append((iid, when)))
    moto.layer.set_fis_time_scale(0.01)        # 120 s of notice pass in 1.2 s
    provider.interrupt([b.instance_id], notice_s=120)
    assert [iid for iid, _ in heard] == [b.instance_id]
    start = moto.layer.calls("fis:POST /experimentTemplates")[0]
    assert start.status == 200
    gone = wait_for(lambda: [i for i in provider.describe(instance_ids=[b.instance_id])
                             if i.state is InstanceState.TERMINATED], 30, "the FIS reclaim")
    assert gone[0].cause is TerminationCause.SPOT_RECLAIM
    [alive] = provider.describe(instance_ids=[a.instance_id])
    assert alive.state is not InstanceState.TERMINATED       # the other node stays


def test_interrupt_refuses_on_demand_and_unknown_instances(provider, moto):
    od = Pool("g5.xlarge", "us-east-1c", Market.ON_DEMAND)
    [info] = provider.launch_group(provider.plan_launch(group("grp-od", od, count=1,
                                                              ranks=(0,))))
    with pytest.raises(BadInputError) as ei:
        provider.interrupt([info.instance_id])
    assert ei.value.field == "instance_id" and "on-demand" in str(ei.value)
    with pytest.raises(BadInputError):
        provider.interrupt(["i-0123456789abcdef0"])
    assert moto.layer.calls("fis:POST /experiments") == []


def test_fis_notice_reaches_the_instance_metadata(provider, moto):
    from .harness import ImdsServer
    [info] = provider.launch_group(provider.plan_launch(group("grp-imds", count=1, ranks=(0,))))
    imds = ImdsServer(info.instance_id)
    try:
        moto.layer.on_notice(lambda iid, when: iid == info.instance_id
                             and imds.notice("terminate", when))
        assert _instance_action(imds.url) is None
        provider.interrupt([info.instance_id], notice_s=120)
        action = _instance_action(imds.url)
        assert action == {"action": "terminate", "time": moto.layer.notices()[info.instance_id]}
    finally:
        imds.stop()


def _instance_action(url: str) -> dict | None:
    """IMDSv2 as an agent asks it: a token, then spot/instance-action (404: no notice)."""
    import urllib.error
    import urllib.request
    put = urllib.request.Request(f"{url}/latest/api/token", method="PUT",
                                 headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
    with urllib.request.urlopen(put, timeout=10) as resp:
        token = resp.read().decode()
    get = urllib.request.Request(f"{url}/latest/meta-data/spot/instance-action",
                                 headers={"X-aws-ec2-metadata-token": token})
    try:
        with urllib.request.urlopen(get, timeout=10) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def test_single_launch_refuses_a_group_request(provider, moto):
    with pytest.raises(ConfigError) as ei:
        provider.launch(provider.plan_launch(group("grp-single")))
    assert ei.value.field == "count"
    assert moto.layer.calls("CreateFleet") == []


def test_a_node_tag_in_the_request_does_not_give_every_node_one_rank(provider, moto):
    req = group("grp-tagged")
    req = LaunchRequest(**{**req.__dict__, "tags": {**req.tags, TAG_NODE: "0"}})
    infos = provider.launch_group(provider.plan_launch(req))
    assert sorted(i.tags[TAG_NODE] for i in provider.describe(job_id="job-g")) == ["0", "1"]
    assert [i.tags[TAG_NODE] for i in infos] == ["0", "1"]

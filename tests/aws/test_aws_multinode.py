"""Issue 16's AWS acceptance on moto: a 2-node fleet launch, one node reclaimed through FIS
(terminated with Server.SpotInstanceTermination), one replacement launch with its own client
token, and the ledger books three instances, each on its own.

The ledger side books the attempt as the daemon records it: one multi-node Attempt with an
AttemptNode row per instance (replacements included), each booked on its own mark.
"""

from __future__ import annotations

import json
from datetime import timedelta

from sqlmodel import select

from polling import wait_for
from spotrun.aws_clients import make_client
from spotrun.daemon.spend import SpendLoop
from spotrun.db import Attempt, AttemptNode, Job, SpendEntry, open_db, session
from spotrun.providers.base import TAG_NODE, LaunchRequest, Pool
from spotrun.states import (AttemptState, InstanceState, JobState, Market, NodeState,
                            TerminationCause)

from .test_aws_provider import agent_json

POOL = Pool("g5.xlarge", "us-east-1a", Market.SPOT)
JOB = "job-mn"


def _request(token: str, count: int, ranks: tuple[int, ...]) -> LaunchRequest:
    return LaunchRequest(job_id=JOB, attempt_number=1, client_token=token, candidates=(POOL,),
                         user_data=agent_json(JOB, 1), count=count, node_ranks=ranks)


def _book(tmp_path, moto, provider, infos) -> list[SpendEntry]:
    make_client("s3", region="us-east-1", endpoint_url=moto.url).create_bucket(Bucket="mn-bucket")
    eng = open_db(f"sqlite:///{tmp_path / 'spotrun.db'}")
    with session(eng) as s:
        s.add(Job(id=JOB, name=JOB, state=JobState.SUCCEEDED, spec_json=json.dumps({}),
                  store_uri="s3://mn-bucket/x", checkpoint_uri="s3://mn-bucket/x/c"))
        s.flush()
        first = min(infos, key=lambda i: i.launched_at)
        att = Attempt(job_id=JOB, number=1, market=first.market,
                      instance_type=first.instance_type, zone=first.zone,
                      price_usd_per_hour=first.price_usd_per_hour or 0.43,
                      client_token="mn-att1", started_at=first.launched_at,
                      state=AttemptState.RUNNING, nodes=2)
        s.add(att)
        s.flush()
        for info in infos:
            s.add(AttemptNode(attempt_id=att.id, job_id=JOB, node_rank=int(info.tags[TAG_NODE]),
                              state=NodeState.RUNNING, client_token=f"tok-{info.instance_id}",
                              instance_id=info.instance_id, market=info.market,
                              instance_type=info.instance_type, zone=info.zone,
                              price_usd_per_hour=info.price_usd_per_hour or 0.43,
                              launched_at=info.launched_at))
        s.commit()
    tick = SpendLoop(eng, provider, min_book_s=0.0).tick()
    assert not tick.errors, tick.errors
    with session(eng) as s:
        return list(s.exec(select(SpendEntry)))


def test_two_node_fleet_one_reclaim_one_replacement_books_three_instances(provider, moto,
                                                                         tmp_path):
    now = provider.now()
    moto.layer.set_prices([("g5.xlarge", "us-east-1a", now - timedelta(hours=1), 0.43)])
    a, b = provider.launch_group(provider.plan_launch(_request("mn-att1", 2, (0, 1))))
    assert (a.tags[TAG_NODE], b.tags[TAG_NODE]) == ("0", "1")
    for info in (a, b):
        moto.backdate_launch(info.instance_id, 1800)      # both nodes ran half an hour
    [fleet] = moto.layer.calls("CreateFleet")
    assert fleet.params["TargetCapacitySpecification.TotalTargetCapacity"] == "2"

    # Node 1 is reclaimed: FIS sends the notice, then EC2 takes the instance back.
    provider.interrupt([b.instance_id], notice_s=120)
    assert b.instance_id in moto.layer.notices()
    gone = wait_for(lambda: next((i for i in provider.describe(instance_ids=[b.instance_id])
                                  if i.state is InstanceState.TERMINATED), None),
                    30, "node 1 reclaimed")
    assert gone.cause is TerminationCause.SPOT_RECLAIM
    raw = provider.ec2.describe_instances(InstanceIds=[b.instance_id])
    assert raw["Reservations"][0]["Instances"][0]["StateReason"]["Code"] == \
        "Server.SpotInstanceTermination"

    # One replacement for rank 1, in the same pool, with its own client token.
    [c] = provider.launch_group(provider.plan_launch(_request("mn-att1-r1", 1, (1,))))
    assert c.instance_id not in (a.instance_id, b.instance_id)
    moto.backdate_launch(c.instance_id, 600)
    assert (c.instance_type, c.zone, c.tags[TAG_NODE]) == (POOL.instance_type, POOL.zone, "1")
    fleets = moto.layer.calls("CreateFleet")
    assert len(fleets) == 2 and fleets[0].params["ClientToken"] != fleets[1].params["ClientToken"]
    [survivor] = provider.describe(instance_ids=[a.instance_id])
    assert survivor.state is not InstanceState.TERMINATED     # the survivor was never touched
    assert len(provider.describe(job_id=JOB)) == 3

    provider.terminate(a.instance_id)
    provider.terminate(c.instance_id)
    rows = _book(tmp_path, moto, provider, provider.describe(job_id=JOB))
    assert {r.instance_id for r in rows if r.kind == "compute"} == {
        a.instance_id, b.instance_id, c.instance_id}
    usd = {iid: sum(r.usd for r in rows if r.instance_id == iid)
           for iid in (a.instance_id, b.instance_id, c.instance_id)}
    secs = {iid: sum(r.billed_seconds for r in rows if r.instance_id == iid) for iid in usd}
    # AWS does not charge a spot instance it reclaims in its first hour: booked, then reversed.
    assert abs(usd[b.instance_id]) < 1e-9
    assert any(r.kind == "correction" and r.instance_id == b.instance_id for r in rows)
    assert secs[a.instance_id] >= 1800 and secs[c.instance_id] >= 600
    assert usd[a.instance_id] > usd[c.instance_id] > 0

"""Issue 16's multi-node acceptance on GCP (the fake Compute Engine): a 2-node group launch in
one pool under the job's compact placement policy, one node preempted through
simulateMaintenanceEvent, one replacement launch with its own client token; the ledger books
the three VMs each on its own, by GCP's rules (a Spot VM preempted after its first minute is
charged: no free first hour as on AWS)."""

from __future__ import annotations

import json
from datetime import timedelta

from sqlmodel import select

from polling import wait_for
from spotrun.daemon.spend import SpendLoop
from spotrun.db import Attempt, AttemptNode, Job, SpendEntry, open_db, session
from spotrun.providers.base import TAG_NODE, LaunchRequest, Pool
from spotrun.providers.gcp.launch import zone_of
from spotrun.providers.gcp.provider import GcpProvider
from spotrun.states import (AttemptState, InstanceState, JobState, Market, NodeState,
                            TerminationCause)

from .gce_fixtures import gce, gcp_settings  # noqa: F401  (fixture)

POOL = Pool("a2-highgpu-8g", "us-central1-a", Market.SPOT)
JOB = "job-mn"


def _request(token: str, count: int, ranks: tuple[int, ...]) -> LaunchRequest:
    cfg = {"job_id": JOB, "attempt": 1, "store_uri": "gs://b/s", "checkpoint_uri": "gs://b/c",
           "command": "true", "nodes": 2}
    return LaunchRequest(job_id=JOB, attempt_number=1, client_token=token, candidates=(POOL,),
                         user_data=json.dumps(cfg), count=count, node_ranks=ranks)


def _inserts(fake) -> list:
    return [c for c in fake.calls("POST") if c.path.endswith("/instances")]


def _book(tmp_path, provider, infos) -> list[SpendEntry]:
    eng = open_db(f"sqlite:///{tmp_path / 'spotrun.db'}")
    with session(eng) as s:
        store = (tmp_path / "store").as_uri()   # the ledger's storage side is not this test's
        s.add(Job(id=JOB, name=JOB, state=JobState.SUCCEEDED, spec_json=json.dumps({}),
                  store_uri=store, checkpoint_uri=f"{store}/c"))
        s.flush()
        first = min(infos, key=lambda i: i.launched_at)
        att = Attempt(job_id=JOB, number=1, market=first.market,
                      instance_type=first.instance_type, zone=first.zone,
                      price_usd_per_hour=first.price_usd_per_hour, client_token="mn-att1",
                      started_at=first.launched_at, state=AttemptState.RUNNING, nodes=2)
        s.add(att)
        s.flush()
        for info in infos:
            s.add(AttemptNode(attempt_id=att.id, job_id=JOB, node_rank=int(info.tags[TAG_NODE]),
                              state=NodeState.RUNNING, client_token=f"tok-{info.instance_id}",
                              instance_id=info.instance_id, market=info.market,
                              instance_type=info.instance_type, zone=info.zone,
                              price_usd_per_hour=info.price_usd_per_hour,
                              launched_at=info.launched_at))
        s.commit()
    tick = SpendLoop(eng, provider, min_book_s=0.0).tick()
    assert not tick.errors, tick.errors
    with session(eng) as s:
        return list(s.exec(select(SpendEntry)))


def test_two_node_group_one_preemption_one_replacement_books_three_vms(gce, tmp_path):  # noqa: F811
    provider = GcpProvider.from_settings(gcp_settings(gce, str(tmp_path / "home")))
    a, b = provider.launch_group(provider.plan_launch(_request("mn-att1", 2, (0, 1))))
    assert (a.tags[TAG_NODE], b.tags[TAG_NODE]) == ("0", "1")
    assert a.instance_type == b.instance_type == POOL.instance_type and a.zone == b.zone
    # Both nodes sit under the job's compact placement policy (a2 has one).
    [policy] = gce.state.policies.values()
    assert policy["groupPlacementPolicy"]["collocation"] == "COLLOCATED"
    for info in (a, b):
        vm = gce.state.get_instance(info.zone, info.instance_id)
        assert vm["resourcePolicies"][0].endswith(f"/resourcePolicies/{policy['name']}")
        gce.state.backdate(info.zone, info.instance_id, 1800)   # both ran half an hour
    assert len(_inserts(gce)) == 2

    # Node 1 is preempted: soft-off, then (after the fake's 1 s window) deleted.
    provider.interrupt([b.instance_id])
    gone = wait_for(lambda: next((i for i in provider.describe(instance_ids=[b.instance_id])
                                  if i.state is InstanceState.TERMINATED), None),
                    30, "node 1 preempted")
    assert gone.cause is TerminationCause.SPOT_RECLAIM and gone.tags[TAG_NODE] == "1"
    assert gce.calls("POST", f"/instances/{b.instance_id}/simulateMaintenanceEvent")

    # One replacement for rank 1, in the same pool, with its own client token.
    [c] = provider.launch_group(provider.plan_launch(_request("mn-att1-r1", 1, (1,))))
    assert c.instance_id not in (a.instance_id, b.instance_id)
    gce.state.backdate(zone_of(c.instance_id), c.instance_id, 600)
    assert (c.instance_type, c.zone, c.tags[TAG_NODE]) == (POOL.instance_type, POOL.zone, "1")
    inserts = _inserts(gce)
    assert len(inserts) == 3 and len({i.query["requestId"] for i in inserts}) == 3
    [survivor] = provider.describe(instance_ids=[a.instance_id])
    assert survivor.state is InstanceState.RUNNING       # the survivor was never touched
    assert len(provider.describe(job_id=JOB)) == 3

    provider.terminate(a.instance_id)
    provider.terminate(c.instance_id)
    wait_for(lambda: all(i.state is InstanceState.TERMINATED
                         for i in provider.describe(job_id=JOB)), 10, "every VM ended")
    rows = _book(tmp_path, provider, provider.describe(job_id=JOB))
    assert {r.instance_id for r in rows if r.kind == "compute"} == {
        a.instance_id, b.instance_id, c.instance_id}
    usd = {iid: sum(r.usd for r in rows if r.instance_id == iid and r.kind != "volume")
           for iid in (a.instance_id, b.instance_id, c.instance_id)}
    secs = {iid: sum(r.billed_seconds for r in rows if r.instance_id == iid
                     and r.kind == "compute") for iid in usd}
    # GCP charges a Spot VM it preempts after its first minute: node 1's half hour is billed.
    assert not any(r.kind == "correction" and r.instance_id == b.instance_id for r in rows)
    assert secs[b.instance_id] >= 1800 and usd[b.instance_id] > 0
    assert secs[a.instance_id] >= 1800 and secs[c.instance_id] >= 600
    price = provider.spot_price(POOL.instance_type, POOL.zone)
    assert abs(usd[b.instance_id] - price * secs[b.instance_id] / 3600) < 0.05
    assert usd[a.instance_id] > usd[c.instance_id] > 0
    assert timedelta(seconds=secs[c.instance_id]) < timedelta(seconds=secs[a.instance_id])

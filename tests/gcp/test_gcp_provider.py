"""The gcp provider against the fake Compute Engine: what the contract suite does not pin down.

Idempotent inserts (requestId, names from the client token), capacity and quota refusals per
pool, Spot-only types, N1 with attached GPUs, a guest power-off (stopped VM deleted), a
preempted VM read back from the zone's operations by a fresh provider, and bad settings."""

from __future__ import annotations

import json
import re
import uuid

import pytest

from polling import wait_for
from spotrun.errors import BadInputError, CapacityError, ConfigError, ProviderError
from spotrun.providers.base import LaunchRequest, Pool
from spotrun.providers.gcp.launch import instance_name, label_key, tag_of, zone_of
from spotrun.providers.gcp.provider import GcpProvider
from spotrun.states import InstanceState, Market, TerminationCause

from .gce_fixtures import gce, gcp_settings  # noqa: F401  (fixture)

SPOT_A = Pool("g2-standard-4", "us-central1-a", Market.SPOT)
SPOT_B = Pool("g2-standard-4", "us-central1-b", Market.SPOT)
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def _provider(fake, tmp_path, **extra) -> GcpProvider:
    return GcpProvider.from_settings(gcp_settings(fake, str(tmp_path / "home"), extra))


def _request(*pools: Pool, token: str | None = None, job: str = "job-g1") -> LaunchRequest:
    cfg = {"job_id": job, "attempt": 1, "store_uri": "gs://b/s", "checkpoint_uri": "gs://b/c",
           "command": "true"}
    return LaunchRequest(job_id=job, attempt_number=1, client_token=token or uuid.uuid4().hex,
                         candidates=tuple(pools), user_data=json.dumps(cfg))


def _inserts(fake) -> list:
    return [c for c in fake.calls("POST") if c.path.endswith("/instances")]


def test_a_retried_launch_gets_the_same_vm_even_from_a_fresh_provider(gce, tmp_path):  # noqa: F811
    req = _request(SPOT_A, token="tok-retry")
    first = _provider(gce, tmp_path).launch(_provider(gce, tmp_path).plan_launch(req))
    # The daemon crashed after the insert: a new process retries with the same token.
    again = _provider(gce, tmp_path).launch(_provider(gce, tmp_path).plan_launch(req))
    assert again.instance_id == first.instance_id == instance_name("tok-retry", SPOT_A.zone, "c0")
    assert zone_of(first.instance_id) == SPOT_A.zone and first.client_token == "tok-retry"
    [call] = _inserts(gce)                       # found by its labels: no second insert
    assert UUID_RE.match(call.query["requestId"])
    # Even an insert that slips through (the label lookup lost) is the same operation.
    replay = gce.state.insert(SPOT_A.zone, call.body, call.query["requestId"])
    assert replay["targetLink"].endswith(first.instance_id)
    assert len(gce.state.instances) == 1


def test_capacity_and_quota_refusals_move_on_per_pool(gce, tmp_path):  # noqa: F811
    gce.state.set_no_capacity("g2-standard-4", "us-central1-a")
    gce.state.set_quota_exceeded("a2-highgpu-1g")
    p = _provider(gce, tmp_path)
    a2 = Pool("a2-highgpu-1g", "us-central1-b", Market.SPOT)
    info = p.launch(p.plan_launch(_request(SPOT_A, a2, SPOT_B)))
    assert (info.instance_type, info.zone, info.market) == ("g2-standard-4", "us-central1-b",
                                                            Market.SPOT)
    assert p.pools_cooling() == {SPOT_A.key(), a2.key()}
    codes = {f.pool: f.code for f in p.capacity_failures}
    assert codes == {SPOT_A.key(): "ZONE_RESOURCE_POOL_EXHAUSTED", a2.key(): "QUOTA_EXCEEDED"}
    with pytest.raises(CapacityError) as err:
        p.launch(p.plan_launch(_request(SPOT_A, a2)))
    assert err.value.code == "QUOTA_EXCEEDED" and err.value.zone == "us-central1-b"


def test_a_spot_only_type_is_never_launched_on_demand(gce, tmp_path):  # noqa: F811
    p = _provider(gce, tmp_path)
    od = Pool("a3-highgpu-1g", "us-central1-a", Market.ON_DEMAND)
    with pytest.raises(CapacityError, match="SPOT_ONLY"):
        p.launch(p.plan_launch(_request(od)))
    assert _inserts(gce) == []


def test_n1_gets_its_gpus_attached_and_is_described_as_its_catalog_type(gce,  # noqa: F811
                                                                         tmp_path):
    p = _provider(gce, tmp_path)
    pool = Pool("n1-standard-8+t4x1", "us-central1-a", Market.SPOT)
    info = p.launch(p.plan_launch(_request(pool)))
    body = _inserts(gce)[0].body
    assert body["machineType"] == "zones/us-central1-a/machineTypes/n1-standard-8"
    assert body["guestAccelerators"] == [{
        "acceleratorType": "zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4",
        "acceleratorCount": 1}]
    assert info.instance_type == "n1-standard-8+t4x1" and info.price_usd_per_hour == \
        p.spot_price("n1-standard-8+t4x1", "us-central1-a")


def test_a_vm_the_guest_powered_off_is_ended_by_the_guest_and_deleted(gce, tmp_path):  # noqa: F811
    p = _provider(gce, tmp_path)
    info = p.launch(p.plan_launch(_request(SPOT_A)))
    wait_for(lambda: p.describe(instance_ids=[info.instance_id])[0].state
             is InstanceState.RUNNING, 10, "the VM to run")
    gce.state.guest_shutdown(SPOT_A.zone, info.instance_id)   # the agent's `shutdown -h now`
    [done] = p.describe(instance_ids=[info.instance_id])
    assert done.state is InstanceState.TERMINATED
    assert done.cause is TerminationCause.INSTANCE_SHUTDOWN and done.ended_at is not None
    # A stopped VM keeps its disk (billed): the provider deleted it on sight.
    assert any(c.method == "DELETE" and c.path.endswith(info.instance_id) for c in gce.calls())
    wait_for(lambda: info.instance_id not in gce.state.names(), 10,
             "the stopped VM to be deleted")
    [later] = p.describe(instance_ids=[info.instance_id])
    assert later.cause is TerminationCause.INSTANCE_SHUTDOWN and later.ended_at == done.ended_at


def test_a_fresh_provider_reads_a_preemption_from_the_zone_operations(gce, tmp_path):  # noqa: F811
    info = _provider(gce, tmp_path).launch(_provider(gce, tmp_path).plan_launch(
        _request(SPOT_A)))
    gce.state.preempt(SPOT_A.zone, info.instance_id, window_s=0)
    assert info.instance_id not in gce.state.names()   # deleted: no trace left in the list
    [seen] = _provider(gce, tmp_path).describe(instance_ids=[info.instance_id])
    assert seen.state is InstanceState.TERMINATED and seen.cause is TerminationCause.SPOT_RECLAIM
    assert seen.ended_at is not None
    # An id that is not one of spotrun's VM names is simply unknown.
    assert _provider(gce, tmp_path).describe(instance_ids=["i-0123456789abcdef0"]) == []


def test_interrupt_refuses_an_on_demand_vm(gce, tmp_path):  # noqa: F811
    p = _provider(gce, tmp_path)
    info = p.launch(p.plan_launch(_request(Pool("g2-standard-4", "us-central1-c",
                                                Market.ON_DEMAND))))
    with pytest.raises(BadInputError) as err:
        p.interrupt([info.instance_id])
    assert err.value.field == "instance_id" and "on-demand" in str(err.value)
    assert not [c for c in gce.calls("POST") if "simulateMaintenanceEvent" in c.path]


def test_group_plan_asks_for_compact_placement_only_where_the_series_has_one(gce,  # noqa: F811
                                                                             tmp_path):
    from dataclasses import replace
    p = _provider(gce, tmp_path)
    for itype, compact in (("a2-highgpu-8g", True), ("n1-standard-64+v100x8", False)):
        req = replace(_request(Pool(itype, "us-central1-a", Market.SPOT)), count=2,
                      node_ranks=(0, 1))
        apis = [c["api"] for c in p.plan_launch(req).calls]
        assert apis.count("compute.instances.insert") == 2
        assert ("compute.resourcePolicies.insert" in apis) is compact


def test_labels_round_trip_tags():
    assert label_key("spotrun:job") == "spotrun_job" and tag_of("spotrun_job") == "spotrun:job"
    assert label_key("Team Name") == "team_name" and label_key("9lives").startswith("t_")


def test_settings_name_the_field_at_fault(gce, tmp_path):  # noqa: F811
    # Prices need no project (plan works before one is set up); every call does.
    no_project = GcpProvider.from_settings(gcp_settings(gce, str(tmp_path / "h1"),
                                                        {"gcp.project": ""}))
    assert no_project.spot_price(SPOT_A.instance_type, SPOT_A.zone) is not None
    for act in (lambda: no_project.plan_launch(_request(SPOT_A)),
                lambda: no_project.describe(job_id="j"),
                lambda: no_project.terminate("sr-us-central1-a-0123456789ab")):
        with pytest.raises(ConfigError) as err:
            act()
        assert err.value.field == "gcp.project"
    p = _provider(gce, tmp_path, **{"gcp.image": ""})
    with pytest.raises(ConfigError) as err:
        p.plan_launch(_request(SPOT_A))
    assert err.value.field == "gcp.image"
    with pytest.raises(ConfigError) as err:
        _provider(gce, tmp_path, **{"gcp.boot_disk_type": "floppy"})
    assert err.value.field == "gcp.boot_disk_type"


def test_an_api_error_is_one_provider_error_naming_gcp(gce, tmp_path):  # noqa: F811
    p = _provider(gce, tmp_path, **{"gcp.zones": ["us-central1-z"]})
    with pytest.raises(ProviderError) as err:
        p.launch(p.plan_launch(_request(Pool("g2-standard-4", "us-central1-z", Market.SPOT))))
    assert err.value.field == "gcp" and not isinstance(err.value, CapacityError)


def test_spotrun_interrupt_preempts_the_jobs_spot_vm_with_gcps_window(gce, tmp_path):  # noqa: F811
    from click.testing import CliRunner

    from spotrun.cli import cli
    from spotrun.config import load_settings
    from spotrun.db import Attempt, Job, open_db, session
    from spotrun.states import AttemptState, JobState
    home = tmp_path / "home"
    home.mkdir()
    (home / "spotrun.toml").write_text(
        f'provider = "gcp"\n[gcp]\nproject = "{gce.state.project}"\nregion = "us-central1"\n'
        f'zones = ["us-central1-a", "us-central1-b"]\nendpoint_url = "{gce.url}"\n'
        'image = "projects/p/global/images/i"\n')
    settings = load_settings(str(home))
    p = GcpProvider.from_settings(settings)
    info = p.launch(p.plan_launch(_request(SPOT_A, job="job-int")))
    with session(open_db(settings.database_url)) as s:
        s.add(Job(id="job-int", name="job-int", state=JobState.RUNNING, spec_json="{}",
                  store_uri="file:///x", checkpoint_uri="file:///x/c"))
        s.flush()
        s.add(Attempt(job_id="job-int", number=1, market=Market.SPOT, instance_type=SPOT_A.
                      instance_type, zone=SPOT_A.zone, price_usd_per_hour=0.4,
                      client_token="t", instance_id=info.instance_id,
                      state=AttemptState.RUNNING))
        s.commit()
    res = CliRunner().invoke(cli, ["interrupt", "job-int", "--json"],
                             env={"SPOTRUN_HOME": str(home)})
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["provider"] == "gcp" and out["notice_s"] == 30.0
    assert out["instances"] == [{"node_rank": 0, "instance_id": info.instance_id,
                                 "reclaim_in_s": 30.0, "reclaim_at": None,
                                 "already_noticed": False, "at_most": True, "note": None}]
    assert [c for c in gce.calls("POST") if c.path.endswith(
        f"/instances/{info.instance_id}/simulateMaintenanceEvent")]
    done = wait_for(lambda: (i := p.describe(instance_ids=[info.instance_id])[0]).state
                    is InstanceState.TERMINATED and i, 10, "the preemption to end")
    assert done.cause is TerminationCause.SPOT_RECLAIM

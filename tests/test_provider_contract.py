"""The Provider contract, run against every implementation in HARNESSES.

Adding a provider = one line in HARNESSES: a function returning a Harness (the
provider, pools it can and cannot fill, and a way to force a reclaim). `local` runs a
market process; `aws` runs real boto3 against moto on 127.0.0.1 (tests/aws); `gcp` runs google-cloud-compute's
REST client against a fake Compute Engine on 127.0.0.1 (tests/gcp).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable, Iterator

import pytest
from aws.moto_fixtures import MotoServer, moto, moto_server, moto_settings  # noqa: F401
from conftest import MarketFactory, write_trace
from gcp.fake_compute import FakeCompute
from gcp.gce_fixtures import gce, gcp_settings  # noqa: F401
from polling import wait_for

from spotrun.aws_clients import make_client
from spotrun.decide.market import peek_snapshot
from spotrun.errors import CapacityError
from spotrun.providers import FACTS, InstanceInfo, LaunchRequest, Pool, Provider
from spotrun.providers.aws.provider import AwsProvider
from spotrun.providers.base import TAG_NODE, Interruption, ProviderFeature
from spotrun.providers.gcp.launch import zone_of
from spotrun.providers.gcp.provider import GcpProvider
from spotrun.providers.local.provider import LocalProvider
from spotrun.states import InstanceState, Market, TerminationCause


@dataclass
class Harness:
    """A provider under test and what the contract needs to know about its world."""

    provider: Provider
    spot_ok: Pool                 # a spot pool with capacity
    spot_full: Pool               # a spot pool without capacity
    on_demand: Pool
    force_reclaim: Callable[[str], None]   # reclaim this spot instance now (with notice)


def _local(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    factory: MarketFactory = request.getfixturevalue("market_factory")
    trace = write_trace(tmp_path / "contract.csv", {"us-east-1a": [1] * 8,
                                                    "us-east-1b": [0] * 8}, 60.0)
    client = factory(trace=trace, spot_price_usd_per_hour=0.9, time_scale=20.0)
    return Harness(provider=LocalProvider(client),
                   spot_ok=Pool("p3.2xlarge", "us-east-1a", Market.SPOT),
                   spot_full=Pool("p3.2xlarge", "us-east-1b", Market.SPOT),
                   on_demand=Pool("p3.2xlarge", "us-east-1b", Market.ON_DEMAND),
                   force_reclaim=lambda iid: client.interrupt(iid, in_s=0, notice=False) and None)


def _aws(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    # moto behind the fault layer on 127.0.0.1: 1b has no g5 spot capacity, prices injected.
    server: MotoServer = request.getfixturevalue("moto")
    ec2 = make_client("ec2", region="us-east-1", endpoint_url=server.url)
    server.layer.set_no_capacity("g5.xlarge", "us-east-1b")
    now = datetime.now(timezone.utc)
    server.layer.set_prices([("g5.xlarge", "us-east-1a", now - timedelta(minutes=40), 0.41),
                             ("g5.xlarge", "us-east-1a", now - timedelta(minutes=5), 0.43)])
    provider = AwsProvider.from_settings(moto_settings(server, ec2, str(tmp_path / "home")))
    return Harness(provider=provider,
                   spot_ok=Pool("g5.xlarge", "us-east-1a", Market.SPOT),
                   spot_full=Pool("g5.xlarge", "us-east-1b", Market.SPOT),
                   on_demand=Pool("g5.xlarge", "us-east-1c", Market.ON_DEMAND),
                   force_reclaim=server.reclaim)


def _gcp(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    # The fake Compute Engine on 127.0.0.1: us-central1-b has no g2 Spot capacity.
    fake: FakeCompute = request.getfixturevalue("gce")
    fake.state.set_no_capacity("g2-standard-4", "us-central1-b")
    provider = GcpProvider.from_settings(gcp_settings(fake, str(tmp_path / "home")))
    return Harness(provider=provider,
                   spot_ok=Pool("g2-standard-4", "us-central1-a", Market.SPOT),
                   spot_full=Pool("g2-standard-4", "us-central1-b", Market.SPOT),
                   on_demand=Pool("g2-standard-4", "us-central1-c", Market.ON_DEMAND),
                   force_reclaim=lambda iid: fake.state.preempt(zone_of(iid), iid, window_s=0))


HARNESSES: dict[str, Callable[[pytest.FixtureRequest, Path], Harness]] = {
    "local": _local,
    "aws": _aws,
    "gcp": _gcp,
}


@pytest.fixture(params=sorted(HARNESSES))
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    """One Harness per provider implementation."""
    yield HARNESSES[request.param](request, tmp_path)


def _request(*pools: Pool, token: str | None = None) -> LaunchRequest:
    job = "job-" + uuid.uuid4().hex[:8]
    return LaunchRequest(job_id=job, attempt_number=1, client_token=token or uuid.uuid4().hex,
                         candidates=tuple(pools), user_data='{"contract": true}',
                         tags={"suite": "contract"})


def _launch(h: Harness, *pools: Pool, token: str | None = None) -> InstanceInfo:
    return h.provider.launch(h.provider.plan_launch(_request(*pools, token=token)))


def _one(h: Harness, iid: str) -> InstanceInfo:
    [info] = h.provider.describe(instance_ids=[iid])
    return info


def test_is_a_provider_with_zones_and_an_aware_clock(harness: Harness) -> None:
    p = harness.provider
    assert isinstance(p, Provider) and p.name
    assert harness.spot_ok.zone in p.zones() and harness.spot_full.zone in p.zones()
    a = p.now()
    assert a.tzinfo is not None and wait_for(lambda: p.now() > a, what="clock moves")


def test_plan_is_a_description_and_repeatable(harness: Harness) -> None:
    req = _request(harness.spot_ok)
    plan = harness.provider.plan_launch(req)
    assert plan == harness.provider.plan_launch(req)
    assert plan.provider == harness.provider.name and plan.calls
    assert "contract" not in str(plan.to_dict()["request"]["user_data"])
    assert harness.provider.describe(job_id=req.job_id) == []    # planning launched nothing


def test_spot_launch_describe_by_job_and_tags(harness: Harness) -> None:
    req = _request(harness.spot_full, harness.spot_ok)
    info = harness.provider.launch(harness.provider.plan_launch(req))
    assert (info.instance_type, info.zone, info.market) == (harness.spot_ok.instance_type,
                                                             harness.spot_ok.zone, Market.SPOT)
    assert info.state in (InstanceState.PENDING, InstanceState.RUNNING)
    assert info.launched_at.tzinfo is not None and info.price_usd_per_hour
    [seen] = harness.provider.describe(job_id=req.job_id)
    assert seen.instance_id == info.instance_id and seen.tags["suite"] == "contract"
    # Cost allocation: every instance says which job and attempt it belongs to.
    assert seen.tags["spotrun:job"] == req.job_id and seen.tags["spotrun:attempt"] == "1"
    assert abs((seen.launched_at - harness.provider.now()).total_seconds()) < 300


def test_capacity_error_when_no_candidate_has_room(harness: Harness) -> None:
    req = _request(harness.spot_full)
    with pytest.raises(CapacityError):
        harness.provider.launch(harness.provider.plan_launch(req))
    assert harness.provider.describe(job_id=req.job_id) == []


def test_on_demand_launches_where_spot_is_full(harness: Harness) -> None:
    info = _launch(harness, harness.on_demand)
    assert info.market is Market.ON_DEMAND and info.zone == harness.on_demand.zone
    assert info.price_usd_per_hour == harness.provider.on_demand_price(
        harness.on_demand.instance_type)


def test_client_token_never_starts_two(harness: Harness) -> None:
    req = _request(harness.spot_ok)
    plan = harness.provider.plan_launch(req)
    a = harness.provider.launch(plan)
    b = harness.provider.launch(plan)
    assert a.instance_id == b.instance_id
    assert len(harness.provider.describe(job_id=req.job_id)) == 1


def test_terminate_is_idempotent_and_books_user(harness: Harness) -> None:
    info = _launch(harness, harness.on_demand)
    harness.provider.terminate(info.instance_id)
    harness.provider.terminate(info.instance_id)
    harness.provider.terminate("i-0123456789abcdef0")        # unknown: not an error
    done = wait_for(lambda: _one(harness, info.instance_id).state.is_terminal() and
                    _one(harness, info.instance_id), what="terminated")
    assert done.cause is TerminationCause.USER and done.ended_at is not None
    assert done.ended_at >= done.launched_at


def test_reclaim_is_reported_as_spot_reclaim(harness: Harness) -> None:
    info = _launch(harness, harness.spot_ok)
    harness.force_reclaim(info.instance_id)
    done = wait_for(lambda: _one(harness, info.instance_id).state.is_terminal() and
                    _one(harness, info.instance_id), what="reclaimed")
    assert done.cause is TerminationCause.SPOT_RECLAIM and done.ended_at is not None


def test_prices(harness: Harness) -> None:
    p = harness.provider
    spot = p.spot_price(harness.spot_ok.instance_type, harness.spot_ok.zone)
    od = p.on_demand_price(harness.on_demand.instance_type)
    assert spot is not None and 0 < spot < od
    now = p.now()
    hist = p.price_history(harness.spot_ok.instance_type, [harness.spot_ok.zone],
                           now - timedelta(hours=1), now)
    assert hist and all(pt.zone == harness.spot_ok.zone for pt in hist)
    assert [pt.ts for pt in hist] == sorted(pt.ts for pt in hist)
    assert all(pt.ts <= now + timedelta(seconds=1) for pt in hist)
    assert datetime(2000, 1, 1, tzinfo=timezone.utc) < hist[0].ts


# ---------------------------------------------------------------- declared features

# What each provider declares beyond the protocol (spotrun.providers.base.ProviderFeature).
DECLARED = {"local": {ProviderFeature.MARKET_VIEW, ProviderFeature.DECISION_GRID,
                      ProviderFeature.RESTING_MARKET},
            "aws": {ProviderFeature.CAPACITY_COOLDOWN}, "gcp": {ProviderFeature.CAPACITY_COOLDOWN}}


def test_declares_its_features_as_its_facts_do(harness: Harness) -> None:
    p = harness.provider
    assert p.features == DECLARED[p.name] == FACTS[p.name].features
    # Each feature is the method of its name: there exactly where declared, never probed.
    for feature in ProviderFeature:
        assert hasattr(type(p), feature.value) == (feature in p.features), feature
    assert isinstance(p.snapshot_source, str) and p.snapshot_source   # how plan labels it


def test_declared_features_serve_the_market_decide_reads(harness: Harness) -> None:
    p, ok, full = harness.provider, harness.spot_ok, harness.spot_full
    if ProviderFeature.MARKET_VIEW in p.features:
        rows = {(r.instance_type, r.zone): r for r in p.market_view([ok.instance_type])}
        assert rows[(ok.instance_type, ok.zone)].available
        assert not rows[(full.instance_type, full.zone)].available
    if ProviderFeature.DECISION_GRID in p.features:
        _origin_s, tick_s = p.decision_grid()
        assert tick_s > 0
    if ProviderFeature.RESTING_MARKET in p.features:
        assert p.resting_market([ok.instance_type]) is None      # it runs: read it live
    if ProviderFeature.CAPACITY_COOLDOWN in p.features:
        # A pool that refused a launch for capacity is one a decision sees without it, so
        # the next launch goes to another pool (or cloud) instead of the same refusal.
        assert peek_snapshot(p, [full.instance_type]).is_available(full.instance_type, full.zone)
        with pytest.raises(CapacityError):
            _launch(harness, full)
        assert full.key() in p.pools_cooling()
        later = peek_snapshot(p, [ok.instance_type, full.instance_type])
        assert not later.is_available(full.instance_type, full.zone)
        assert later.is_available(ok.instance_type, ok.zone)
    # decide builds its snapshot from what the provider serves, whatever it declares.
    market = peek_snapshot(p, [ok.instance_type, full.instance_type])
    assert market.source == p.snapshot_source and {ok.zone, full.zone} <= set(market.zones)
    assert market.spot_price(ok.instance_type, ok.zone) == p.spot_price(ok.instance_type,
                                                                         ok.zone)
    # Availability is known from a market view, or from a refused launch (the cooldown above);
    # otherwise every pool may be tried.
    assert market.is_available(full.instance_type, full.zone) == (
        ProviderFeature.MARKET_VIEW not in p.features
        and ProviderFeature.CAPACITY_COOLDOWN not in p.features)


# ---------------------------------------------------------------- multi-node (issue 16)

def _group(*pools: Pool, count: int = 2, token: str | None = None) -> LaunchRequest:
    return replace(_request(*pools, token=token), count=count,
                   node_ranks=tuple(range(count)))


def _launch_group(h: Harness, req: LaunchRequest) -> list[InstanceInfo]:
    return h.provider.launch_group(h.provider.plan_launch(req))


def _interrupt(h: Harness, ids: list[str], notice_s: float) -> list[Interruption]:
    return h.provider.interrupt(ids, notice_s=notice_s)


def _live(h: Harness, job_id: str) -> list[InstanceInfo]:
    return [i for i in h.provider.describe(job_id=job_id) if not i.state.is_terminal()]


def test_group_launch_puts_every_node_in_one_pool_with_its_rank(harness: Harness) -> None:
    req = _group(harness.spot_full, harness.spot_ok)
    infos = _launch_group(harness, req)
    assert len(infos) == 2 and len({i.instance_id for i in infos}) == 2
    assert {(i.instance_type, i.zone, i.market) for i in infos} == {
        (harness.spot_ok.instance_type, harness.spot_ok.zone, Market.SPOT)}
    assert all(i.private_ip for i in infos)
    seen = {i.instance_id: i for i in harness.provider.describe(job_id=req.job_id)}
    assert set(seen) == {i.instance_id for i in infos}
    assert [seen[i.instance_id].tags[TAG_NODE] for i in infos] == ["0", "1"]
    assert all(seen[i.instance_id].tags["spotrun:attempt"] == "1" for i in infos)


def test_group_launch_is_idempotent_by_client_token(harness: Harness) -> None:
    req = _group(harness.spot_ok)
    first = _launch_group(harness, req)
    again = _launch_group(harness, req)
    assert [i.instance_id for i in again] == [i.instance_id for i in first]
    assert len(harness.provider.describe(job_id=req.job_id)) == 2


def test_group_launch_without_room_leaves_nothing_running(harness: Harness) -> None:
    req = _group(harness.spot_full)
    with pytest.raises(CapacityError):
        _launch_group(harness, req)
    assert _live(harness, req.job_id) == []


def test_one_node_replacement_is_a_count_one_launch_with_its_own_token(harness: Harness) -> None:
    req = _group(harness.spot_ok)
    group = _launch_group(harness, req)
    again = replace(req, count=1, node_ranks=(1,), candidates=(harness.spot_ok,),
                    client_token=req.client_token + "-r1", tags={**req.tags, TAG_NODE: "1"})
    new = harness.provider.launch(harness.provider.plan_launch(again))
    assert new.instance_id not in {i.instance_id for i in group}
    assert new.zone == harness.spot_ok.zone and _one(harness, new.instance_id).tags[TAG_NODE] == "1"


def test_interrupt_says_what_it_did_and_never_moves_a_reclaim_later(harness: Harness) -> None:
    info = _launch(harness, harness.spot_ok)
    [first] = _interrupt(harness, [info.instance_id], notice_s=60.0)
    assert first.instance_id == info.instance_id and first.reclaim_in_s >= 0
    if first.at_most:
        # The cloud shows no reclaim it already has in mind: "within" its own window, and a
        # note whenever that window is not the one asked for.
        assert bool(first.note) == (first.reclaim_in_s != 60.0)
        return
    assert first.reclaim_in_s <= 60.0 and first.reclaim_at is not None and not first.note
    [again] = _interrupt(harness, [info.instance_id], notice_s=6000.0)
    assert again.already_noticed and again.reclaim_at == first.reclaim_at
    assert _one(harness, info.instance_id).notice_at is not None


def test_interrupt_reclaims_after_the_notice(harness: Harness) -> None:
    info = _launch(harness, harness.spot_ok)
    _interrupt(harness, [info.instance_id], notice_s=1.0)
    done = wait_for(lambda: _one(harness, info.instance_id).state.is_terminal() and
                    _one(harness, info.instance_id), what="interrupted")
    assert done.cause is TerminationCause.SPOT_RECLAIM and done.ended_at is not None


def test_a_type_the_catalog_does_not_price_is_bad_input_on_every_provider(
        harness: Harness) -> None:
    # One implementation serves every provider (spotrun/providers/pricing.py).
    from spotrun.errors import ConfigError
    with pytest.raises(ConfigError) as err:
        harness.provider.on_demand_price("no-such-type.xlarge")
    assert err.value.field == "instance_type" and err.value.exit_code == 2

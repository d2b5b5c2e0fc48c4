"""The provider contract, run against the aws provider on moto.

Written as a factory-fixture suite (`contract` yields a ProviderHarness) so the same
tests can join tests/test_provider_contract.py's parametrisation over providers
once that file exists; only the `aws` factory lives here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Callable

import pytest

from spotrun.agent.config import AgentConfig
from spotrun.errors import CapacityError
from spotrun.providers.base import (TAG_ATTEMPT, TAG_JOB, LaunchPlan, LaunchRequest, Pool,
                                    Provider)
from spotrun.states import InstanceState, Market, TerminationCause


@dataclass
class ProviderHarness:
    """A provider plus what the contract needs from its world."""

    provider: Provider
    pools: tuple[Pool, ...]                    # candidates that have capacity
    reclaim: Callable[[str], None]             # the cloud takes an instance back
    fill: Callable[[Pool], None]               # the pool has no capacity from now on


@pytest.fixture
def contract(provider, moto) -> ProviderHarness:
    """The aws provider on moto."""
    return ProviderHarness(
        provider=provider,
        pools=(Pool("g5.xlarge", "us-east-1a", Market.SPOT),
               Pool("g4dn.xlarge", "us-east-1b", Market.SPOT)),
        reclaim=moto.reclaim,
        fill=lambda p: moto.layer.set_no_capacity(p.instance_type, p.zone))


def _request(h: ProviderHarness, token: str, attempt: int = 1) -> LaunchRequest:
    cfg = AgentConfig(job_id="job-c", attempt=attempt, store_uri="file:///tmp/x",
                      checkpoint_uri="file:///tmp/x/ck", command="true")
    return LaunchRequest(job_id="job-c", attempt_number=attempt, client_token=token,
                         candidates=h.pools, user_data=cfg.to_json())


def test_is_a_provider(contract):
    assert isinstance(contract.provider, Provider)
    assert contract.provider.zones()


def test_plan_is_deterministic(contract):
    req = _request(contract, "t-plan")
    a, b = contract.provider.plan_launch(req), contract.provider.plan_launch(req)
    assert isinstance(a, LaunchPlan) and a.to_dict() == b.to_dict()


def test_launch_describe_terminate(contract):
    p = contract.provider
    info = p.launch(p.plan_launch(_request(contract, "t-1")))
    assert (info.instance_type, info.zone, info.market) == (
        contract.pools[0].instance_type, contract.pools[0].zone, contract.pools[0].market)
    assert info.tags[TAG_JOB] == "job-c" and info.tags[TAG_ATTEMPT] == "1"
    assert abs((info.launched_at - p.now()).total_seconds()) < 300
    assert [i.instance_id for i in p.describe(job_id="job-c")] == [info.instance_id]
    p.terminate(info.instance_id)
    p.terminate(info.instance_id)
    [gone] = p.describe(instance_ids=[info.instance_id])
    assert gone.state is InstanceState.TERMINATED and gone.cause is TerminationCause.USER


def test_launch_is_idempotent_by_token(contract):
    p = contract.provider
    plan = p.plan_launch(_request(contract, "t-same"))
    assert p.launch(plan).instance_id == p.launch(plan).instance_id
    assert len(p.describe(job_id="job-c")) == 1


def test_first_full_pool_is_skipped(contract):
    contract.fill(contract.pools[0])
    p = contract.provider
    info = p.launch(p.plan_launch(_request(contract, "t-skip")))
    assert (info.instance_type, info.zone) == (contract.pools[1].instance_type,
                                               contract.pools[1].zone)


def test_no_capacity_anywhere_raises(contract):
    for pool in contract.pools:
        contract.fill(pool)
    p = contract.provider
    with pytest.raises(CapacityError):
        p.launch(p.plan_launch(_request(contract, "t-full")))


def test_reclaim_is_reported(contract):
    p = contract.provider
    info = p.launch(p.plan_launch(_request(contract, "t-rec")))
    contract.reclaim(info.instance_id)
    [gone] = p.describe(instance_ids=[info.instance_id])
    assert gone.state is InstanceState.TERMINATED
    assert gone.cause is TerminationCause.SPOT_RECLAIM and gone.ended_at is not None


def test_prices(contract, moto):
    p = contract.provider
    pool = contract.pools[0]
    now = datetime.now(timezone.utc)
    moto.layer.set_prices([(pool.instance_type, pool.zone, now - timedelta(hours=2), 0.40),
                           (pool.instance_type, pool.zone, now - timedelta(minutes=5), 0.43)])
    assert p.spot_price(pool.instance_type, pool.zone) == pytest.approx(0.43)
    assert p.on_demand_price(pool.instance_type) > 0.43
    hist = p.price_history(pool.instance_type, [pool.zone], now - timedelta(hours=1), now)
    assert [h.price_usd_per_hour for h in hist] == [0.40, 0.43]

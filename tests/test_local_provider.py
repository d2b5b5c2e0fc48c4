"""LocalProvider specifics: settings, the lazily started market, market time, views, recovery."""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from conftest import kill_leftovers, write_prices, write_trace
from polling import wait_for

from spotrun.config import load_settings
from spotrun.errors import CapacityError, ConfigError, ProviderError
from spotrun.providers.local.market.client import MarketClient, read_live_info, stop_market
from spotrun.providers.local.market.clock import ManualClock
from spotrun.providers import LaunchRequest, Pool, make_provider
from spotrun.providers.local.provider import LocalProvider
from spotrun.states import InstanceState, Market


@pytest.fixture
def provider(tmp_home: Path, tmp_path: Path, instance_command: str):
    trace = write_trace(tmp_path / "t.csv", {"za": [1, 1, 1, 1], "zb": [0, 0, 0, 0]}, 100.0)
    prices = write_prices(tmp_path / "p.csv", [("za", 0, 1.5), ("za", 2, 1.8), ("zb", 0, 1.2)])
    (tmp_home / "spotrun.toml").write_text(
        f'[local]\ntrace = "{trace}"\nprices = "{prices}"\ntime_scale = 20.0\n')
    settings = load_settings()
    prov = make_provider(settings)
    assert isinstance(prov, LocalProvider)
    assert prov.options is not None   # tests run a stand-in for the agent
    prov.options = replace(prov.options, instance_command=instance_command, grace_s=1.0)
    yield prov
    state_dir = settings.home_path / "market"
    try:
        stop_market(state_dir, timeout_s=10)
    finally:
        kill_leftovers(state_dir)


def _req(token: str, *pools: Pool) -> LaunchRequest:
    return LaunchRequest(job_id="job-a", attempt_number=1, client_token=token,
                         candidates=tuple(pools), user_data='{"k": 1}', tags={"team": "ml"})


def test_from_settings_starts_the_market_lazily_in_home(provider: LocalProvider,
                                                        tmp_home: Path) -> None:
    assert read_live_info(tmp_home / "market") is None       # nothing started yet
    assert provider.zones() == ["za", "zb"]
    info = read_live_info(tmp_home / "market")
    assert info is not None and info["url"] == provider.client.url


def test_plan_is_pure_and_launch_tags_and_prices(provider: LocalProvider, tmp_home: Path) -> None:
    req = _req("tok", Pool("p3.2xlarge", "zb", Market.SPOT), Pool("p3.2xlarge", "za", Market.SPOT))
    plan = provider.plan_launch(req)
    assert read_live_info(tmp_home / "market") is None        # planning made no call
    assert plan == provider.plan_launch(req)
    assert plan.calls[0]["body"]["user_data"] == "<8 bytes>"
    info = provider.launch(plan)
    assert (info.zone, info.market, info.state) == ("za", Market.SPOT, InstanceState.RUNNING)
    assert info.tags == {"team": "ml", "spotrun:job": "job-a", "spotrun:attempt": "1",
                         "spotrun:managed": "true"}
    assert info.price_usd_per_hour == 1.5 and info.notice_at is None     # za never goes down
    assert provider.describe(job_id="job-a")[0].instance_id == info.instance_id
    assert provider.describe(job_id="other") == []
    with pytest.raises(CapacityError) as err:
        provider.launch(provider.plan_launch(_req("t2", Pool("p3.2xlarge", "zb", Market.SPOT))))
    assert err.value.zone == "zb" and "p3.2xlarge/zb/spot" in str(err.value)


def test_now_is_market_time_and_price_history_maps_ticks(provider: LocalProvider) -> None:
    t = provider.client.time()
    wall = ManualClock(t["epoch_wall_s"] + 10.0)
    prov = LocalProvider(provider.client, wall=wall)
    assert prov.now().timestamp() == pytest.approx(t["epoch_wall_s"] + 10.0 * 20.0)
    start = prov.now() - timedelta(seconds=200)               # the epoch: row 0
    points = prov.price_history("p3.2xlarge", ["za"], start, start + timedelta(seconds=450))
    assert [(p.ts - start).total_seconds() for p in points] == [0.0, 200.0, 400.0]
    assert [p.price_usd_per_hour for p in points] == [1.5, 1.8, 1.5]   # row 4 wraps to row 0


def test_market_view_and_prices(provider: LocalProvider) -> None:
    view = {(v.instance_type, v.zone): v for v in provider.market_view(["p3.2xlarge",
                                                                         "g5.xlarge"])}
    assert view[("p3.2xlarge", "za")].available and not view[("p3.2xlarge", "zb")].available
    assert view[("g5.xlarge", "zb")].on_demand_price_usd_per_hour == 1.006
    assert provider.spot_price("p3.2xlarge", "zb") == 1.2
    assert provider.spot_price("p3.2xlarge", "nowhere") is None
    assert provider.on_demand_price("p3.2xlarge") == 3.06
    with pytest.raises(ConfigError):      # as on every provider (providers/pricing.py)
        provider.on_demand_price("p5e.48xlarge")
    every = provider.market_view()
    assert len(every) == 2 * 21 and all(v.on_demand_price_usd_per_hour for v in every)


def test_provider_restarts_a_dead_market_and_finds_its_instances(provider: LocalProvider,
                                                                 tmp_home: Path) -> None:
    info = provider.launch(provider.plan_launch(_req("r1", Pool("p3.2xlarge", "za",
                                                                Market.ON_DEMAND))))
    market = read_live_info(tmp_home / "market")
    assert market is not None
    os.kill(market["pid"], signal.SIGKILL)
    wait_for(lambda: read_live_info(tmp_home / "market") is None, what="market dead")
    [again] = provider.describe(instance_ids=[info.instance_id])
    assert again.state is InstanceState.RUNNING
    assert read_live_info(tmp_home / "market")["pid"] != market["pid"]  # type: ignore[index]


def test_unreachable_market_without_state_dir_is_a_provider_error() -> None:
    prov = LocalProvider(MarketClient("http://127.0.0.1:9", timeout_s=1))
    plan = prov.plan_launch(_req("x", Pool("p3.2xlarge", "za", Market.SPOT)))
    with pytest.raises(ProviderError) as err:
        prov.launch(plan)
    assert "not reachable" in str(err.value)


def test_group_launch_refused_midway_terminates_the_started_nodes(provider: LocalProvider) -> None:
    # Seed 1 at one half: the first two launches pass, the third is refused for capacity.
    provider.client.faults(capacity_fraction=0.5, seed=1)
    req = replace(_req("grp", Pool("p3.2xlarge", "za", Market.SPOT)), count=3,
                  node_ranks=(0, 1, 2))
    with pytest.raises(CapacityError):
        provider.launch_group(provider.plan_launch(req))
    seen = provider.describe(job_id="job-a")
    assert len(seen) == 2 and [i.client_token for i in seen] == ["grp-0", "grp-1"]
    assert wait_for(lambda: all(i.state.is_terminal() for i in provider.describe(job_id="job-a")),
                    what="partial group terminated")
    assert provider.client.fault_counts()["refused"] == 1


def test_interrupt_notices_first(provider: LocalProvider) -> None:
    info = provider.launch(provider.plan_launch(_req("int", Pool("p3.2xlarge", "za",
                                                                  Market.SPOT))))
    provider.interrupt([info.instance_id], notice_s=600.0)
    [seen] = provider.describe(instance_ids=[info.instance_id])
    assert seen.notice_at is not None and not seen.state.is_terminal()

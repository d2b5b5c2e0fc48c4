"""A paced (rehearsal) market: real time while an instance starts up or answers its notice,
the fast rate otherwise, and the trace's reclaim times kept exactly (docs/local-provider.md).

The market runs in-process on a hand-moved wall clock; instances are real processes and the
agent's phase reports go over HTTP to the market's IMDS, as the agent sends them.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
from conftest import kill_leftovers, write_trace

from spotrun.agent.imds import PHASE, ImdsClient
from spotrun.errors import BadInputError, ProviderError
from spotrun.providers.local.market.client import MarketClient
from spotrun.providers.local.market.clock import (CLOCK_FILE, ManualClock, MarketClock,
                                                 read_clock_file)
from spotrun.providers.local.market.core import Market
from spotrun.providers.local.market.options import MarketOptions
from spotrun.providers.local.market.server import MarketHTTPServer, _Flags
from spotrun.providers.local.provider import LocalProvider
from spotrun.providers.local.truth import LocalMarketTruth

TICK_S = 60.0
SCALE = 60.0


class PacedRig:
    """A paced market, its HTTP server and its manual wall clock."""

    def __init__(self, market: Market, url: str, clock: ManualClock) -> None:
        self.market, self.url, self.clock = market, url, clock
        self.client = MarketClient(url)

    def launch(self, zone: str = "za") -> dict:
        body = {"client_token": None, "user_data": "{}", "tags": {"spotrun:job": "j"},
                "candidates": [{"instance_type": "p3.2xlarge", "zone": zone, "market": "spot"}]}
        return self.client.launch(body)

    def wait(self, wall_s: float) -> None:
        """Let wall_s pass and run one watcher pass."""
        self.clock.advance(wall_s)
        self.market.step()

    def imds(self, iid: str) -> ImdsClient:
        return ImdsClient(f"{self.url}/imds/{iid}", monotonic=self.clock.monotonic)


@pytest.fixture
def rig(tmp_path: Path, instance_command: str) -> Iterator[PacedRig]:
    # za: up for 10 rows, then down (the reclaim at row 10 = 600 market seconds).
    trace = write_trace(tmp_path / "t.csv", {"za": [1] * 10 + [0] * 5, "zb": [0] * 15}, TICK_S)
    clock = ManualClock()
    opts = MarketOptions(trace=str(trace), time_scale=SCALE, notice_s=120.0,
                         spot_price_usd_per_hour=1.0, instance_command=instance_command,
                         grace_s=0.5, pacing="rehearsal", startup_max_s=90.0)
    market = Market(tmp_path / "market", opts, wall=clock)
    server = MarketHTTPServer(market, _Flags())
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield PacedRig(market, f"http://127.0.0.1:{server.port}", clock)
    finally:
        server.shutdown()
        server.server_close()
        market.close()
        kill_leftovers(tmp_path / "market")


def test_clock_segments_keep_market_time_continuous_and_invertible() -> None:
    wall = ManualClock(1000.0)
    clock = MarketClock(1000.0, 60.0, 0, 60.0, wall)
    assert clock.market_s(1010.0) == 1000.0 + 600.0
    assert clock.set_rate(1.0, 1010.0) and not clock.set_rate(1.0, 1011.0)
    assert clock.market_s(1010.0) == 1600.0          # no jump at the change
    assert clock.market_s(1040.0) == 1630.0          # real time from there on
    assert clock.set_rate(60.0, 1040.0)
    assert clock.market_s(1041.0) == 1690.0
    for m in (1300.0, 1615.0, 1690.0):
        assert clock.market_s(clock.wall_s(m)) == pytest.approx(m)
    again = MarketClock.from_json(json.loads(json.dumps(clock.to_json())), wall)
    assert again.market_s(1025.0) == clock.market_s(1025.0) == 1615.0


def test_start_up_runs_in_real_time_until_the_job_trains(rig: PacedRig) -> None:
    before = rig.market.now_s()
    inst = rig.launch()
    assert rig.market.clock.rate() == 1.0
    rig.wait(45.0)   # 45 s of start-up cost 45 market seconds, not 45 minutes
    assert rig.market.now_s() - before == pytest.approx(45.0)
    rig.imds(inst["instance_id"]).put(PHASE, {"phase": "training"})
    assert rig.market.clock.rate() == SCALE
    rig.wait(1.0)
    assert rig.market.now_s() - before == pytest.approx(45.0 + SCALE)


def test_start_up_that_never_reports_holds_real_time_at_most_startup_max_s(
        rig: PacedRig) -> None:
    rig.launch()
    rig.wait(89.0)
    assert rig.market.clock.rate() == 1.0
    rig.wait(1.0)
    assert rig.market.clock.rate() == SCALE


def test_a_notice_lasts_notice_wall_s_and_the_reclaim_keeps_its_trace_time(
        rig: PacedRig) -> None:
    inst = rig.launch()
    iid = inst["instance_id"]
    agent = rig.imds(iid)
    agent.put(PHASE, {"phase": "training"})
    reclaim_at = inst["reclaim_at"]
    rec = rig.market.state.get(iid)
    assert reclaim_at is not None and rec is not None and rec.notice_at is not None
    # Fast until the notice: the watcher's wait never carries it past the notice time.
    assert rig.market.step() <= rig.market.clock.wall_s(rec.notice_at) - rig.clock.time() + 1e-9
    rig.clock.now_s = rig.market.clock.wall_s(rec.notice_at)
    rig.market.step()
    assert rig.market.clock.rate() == 120.0 / 20.0   # notice_s over the default notice_wall_s
    assert agent.get("meta-data/spot/instance-action") is not None
    rig.wait(19.9)   # the job has the notice's 20 wall seconds for its saves
    assert rig.client.instances(ids=[iid])[0]["state"] == "running"
    rig.wait(0.1)
    [after] = rig.client.instances(ids=[iid])
    assert (after["state"], after["cause"]) == ("terminated", "spot-reclaim")
    assert after["ended_at"] == reclaim_at   # the trace's time, whatever the pacing did
    assert rig.market.clock.rate() == SCALE   # nothing runs: fast again


def test_every_reader_sees_the_paced_clock(rig: PacedRig, tmp_path: Path) -> None:
    inst = rig.launch()
    rig.wait(30.0)
    rig.imds(inst["instance_id"]).put(PHASE, {"phase": "training"})
    rig.wait(2.0)
    now = rig.market.now_s()
    stored = read_clock_file(rig.market.dir / CLOCK_FILE, rig.clock)
    assert stored is not None and stored.market_s(rig.clock.time()) == pytest.approx(now)
    provider = LocalProvider(client=rig.client, state_dir=rig.market.dir,
                             options=rig.market.options, wall=rig.clock)
    assert provider.now().timestamp() == pytest.approx(now, abs=1e-3)
    truth = LocalMarketTruth.from_state_dir(rig.market.dir)
    assert truth is not None
    # The truth's wall clock is the system's; compare at one wall instant instead.
    assert truth.clock.market_s(rig.clock.time()) == pytest.approx(now)


def test_phase_report_needs_a_token_and_a_known_phase(rig: PacedRig) -> None:
    iid = rig.launch()["instance_id"]
    req = urllib.request.Request(f"{rig.url}/imds/{iid}/latest/{PHASE}", method="PUT",
                                 data=b'{"phase": "training"}')
    with pytest.raises(urllib.error.HTTPError) as no_token:
        urllib.request.urlopen(req, timeout=5)
    assert no_token.value.code == 401
    with pytest.raises(ProviderError):
        rig.imds(iid).put(PHASE, {"phase": "lunch"})
    assert rig.market.clock.rate() == 1.0
    with pytest.raises(BadInputError):
        rig.market.report_phase(iid, "lunch")


def test_fixed_pacing_keeps_the_linear_clock(tmp_path: Path, instance_command: str) -> None:
    trace = write_trace(tmp_path / "t.csv", {"za": [1] * 10}, TICK_S)
    clock = ManualClock()
    market = Market(tmp_path / "m", MarketOptions(
        trace=str(trace), time_scale=SCALE, spot_price_usd_per_hour=1.0,
        instance_command=instance_command, grace_s=0.5, pacing="fixed"), wall=clock)
    try:
        before = market.now_s()
        market.launch(client_token=None, candidates=[_pool("za")], user_data="{}", tags={})
        clock.advance(1.0)
        market.step()
        assert market.now_s() - before == pytest.approx(SCALE)
    finally:
        market.close()
        kill_leftovers(tmp_path / "m")


def _pool(zone: str):
    from spotrun.providers.base import Pool
    from spotrun.states import Market as Kind
    return Pool(instance_type="p3.2xlarge", zone=zone, market=Kind.SPOT)


def test_boot_costs_boot_s_market_seconds_then_start_up_runs_in_real_time(
        tmp_path: Path, instance_command: str) -> None:
    trace = write_trace(tmp_path / "t.csv", {"za": [1] * 20}, TICK_S)
    clock = ManualClock()
    market = Market(tmp_path / "m", MarketOptions(
        trace=str(trace), time_scale=SCALE, spot_price_usd_per_hour=1.0,
        instance_command=instance_command, grace_s=0.5, pacing="rehearsal",
        boot_s=30.0, boot_s_by_type=(("p3.2xlarge", 90.0),)), wall=clock)
    try:
        before = market.now_s()
        market.launch(client_token=None, candidates=[_pool("za")], user_data="{}", tags={})
        assert market.clock.rate() == SCALE        # booting: no real work to wait for
        clock.advance(90.0 / SCALE)
        market.step()
        assert market.now_s() - before == pytest.approx(90.0)   # p3.2xlarge's own boot time
        assert market.clock.rate() == 1.0          # then the job's start-up, in real time
    finally:
        market.close()
        kill_leftovers(tmp_path / "m")


def test_market_cli_reads_per_type_boot_times(tmp_home: Path) -> None:
    from click.testing import CliRunner

    from spotrun.cli import cli
    bad = CliRunner().invoke(cli, ["market", "start", "--boot-s-for", "p3.2xlarge:90"])
    assert bad.exit_code == 2 and "boot_s_for" in bad.output
    assert not (tmp_home / "market").exists()

"""The market in-process with a hand-moved wall clock: notices, reclaims, launches, IMDSv2.

Instances are real processes; the market's HTTP server runs on 127.0.0.1 in a thread.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest
from conftest import kill_leftovers, write_trace
from polling import wait_for

from spotrun.providers.local.market import procs
from spotrun.providers.local.market.client import MarketClient, MarketRefused
from spotrun.providers.local.market.clock import ManualClock, aws_time
from spotrun.providers.local.market.core import Market
from spotrun.providers.local.market.options import MarketOptions
from spotrun.providers.local.market.server import MarketHTTPServer, _Flags
from spotrun.states import InstanceState, TerminationCause

TICK_S = 60.0


class Rig:
    """An in-process market, its HTTP client and its manual clock."""

    def __init__(self, market: Market, client: MarketClient, clock: ManualClock) -> None:
        self.market = market
        self.client = client
        self.clock = clock

    def launch(self, zone: str = "za", market: str = "spot", token: str | None = None,
               itype: str = "p3.2xlarge", **extra: Any) -> dict[str, Any]:
        body = {"client_token": token, "user_data": '{"hello": 1}', "tags": {"spotrun:job": "j"},
                "candidates": [{"instance_type": itype, "zone": zone, "market": market}], **extra}
        return self.client.launch(body)

    def at(self, market_offset_s: float) -> None:
        """Move the wall clock so market time is epoch + market_offset_s, then run the watcher."""
        epoch = self.market.clock.epoch_wall_s
        self.clock.now_s = epoch + market_offset_s / self.market.clock.time_scale
        self.market.step()

    def imds(self, iid: str, path: str, token: str | None = None, method: str = "GET",
             headers: dict[str, str] | None = None) -> tuple[int, str]:
        req = urllib.request.Request(f"{self.client.url}/imds/{iid}/latest/{path}",
                                     method=method, headers=dict(headers or {}))
        if token:
            req.add_header("X-aws-ec2-metadata-token", token)
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def token(self, iid: str, ttl: str = "60") -> str:
        code, body = self.imds(iid, "api/token", method="PUT",
                               headers={"X-aws-ec2-metadata-token-ttl-seconds": ttl})
        assert code == 200
        return body


@pytest.fixture
def rig(tmp_path: Path, instance_command: str) -> Iterator[Rig]:
    trace = write_trace(tmp_path / "t.csv", {"za": [1, 1, 1, 1, 0, 1, 1, 1],
                                             "zb": [0, 0, 1, 0, 0, 0, 0, 0]}, TICK_S)
    clock = ManualClock()
    opts = MarketOptions(trace=str(trace), time_scale=10.0, notice_s=120.0,
                         spot_price_usd_per_hour=1.0, instance_command=instance_command,
                         grace_s=0.5)
    state_dir = tmp_path / "market"
    market = Market(state_dir, opts, wall=clock)
    server = MarketHTTPServer(market, _Flags())
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield Rig(market, MarketClient(f"http://127.0.0.1:{server.port}"), clock)
    finally:
        server.shutdown()
        server.server_close()
        market.close()
        kill_leftovers(state_dir)


def _disk(rig: Rig, iid: str) -> Path:
    return rig.market.dir / "instances" / iid


def _children(rig: Rig, iid: str) -> list[int]:
    path = _disk(rig, iid) / "children.json"
    return wait_for(lambda: path.exists() and json.loads(path.read_text()) is not None
                    and json.loads(path.read_text()), what="children.json") or []


def test_notice_appears_notice_s_before_the_reclaim_and_the_group_dies_at_it(rig: Rig) -> None:
    inst = rig.launch()
    iid = inst["instance_id"]
    epoch = rig.market.clock.epoch_wall_s
    # za goes down at row 4: reclaim at 4 ticks; the notice 120 market seconds earlier.
    assert inst["reclaim_at"] is not None
    reclaim = epoch + 4 * TICK_S
    tok = rig.token(iid)
    rig.at(4 * TICK_S - 120 - 0.01)
    assert rig.imds(iid, "meta-data/spot/instance-action", tok)[0] == 404
    assert rig.imds(iid, "meta-data/events/recommendations/rebalance", tok)[0] == 404
    rig.at(4 * TICK_S - 120)
    code, body = rig.imds(iid, "meta-data/spot/instance-action", tok)
    assert code == 200
    assert json.loads(body) == {"action": "terminate", "time": aws_time(reclaim)}
    assert rig.imds(iid, "meta-data/events/recommendations/rebalance", tok)[0] == 200
    rec = rig.market.state.get(iid)
    assert rec is not None and procs.is_alive(rec.pid, rec.pid_start_ticks)
    rig.at(4 * TICK_S - 0.01)
    assert procs.is_alive(rec.pid, rec.pid_start_ticks)
    assert rig.client.instances(ids=[iid])[0]["state"] == "running"
    rig.at(4 * TICK_S)
    [after] = rig.client.instances(ids=[iid])
    assert (after["state"], after["cause"]) == ("terminated", "spot-reclaim")
    assert after["ended_at"] == inst["reclaim_at"]
    wait_for(lambda: not procs.is_alive(rec.pid, rec.pid_start_ticks), what="leader killed")


def test_reclaim_kills_every_process_of_the_instance(rig: Rig, monkeypatch: Any) -> None:
    monkeypatch.setenv("TEST_INSTANCE_CHILDREN", "1")
    iid = rig.launch()["instance_id"]
    kids = _children(rig, iid)
    assert len(kids) == 2 and all(procs.is_alive(k, None) for k in kids)
    rig.at(4 * TICK_S)
    wait_for(lambda: not any(procs.is_alive(k, None) for k in kids), what="children killed")


def _ended(rig: Rig, iid: str) -> bool:
    rig.market.step()
    return rig.market.state.get(iid).state is InstanceState.TERMINATED  # type: ignore


@contextmanager
def _orphan(rig: Rig, monkeypatch: Any, **launch: Any) -> Iterator[tuple[str, int, int | None]]:
    """An instance with a daemonised helper (conftest: TEST_INSTANCE_ORPHAN); the helper is
    killed afterwards whatever the test saw, so an escaped one does not outlive it."""
    monkeypatch.setenv("TEST_INSTANCE_ORPHAN", "1")
    iid = rig.launch(**launch)["instance_id"]
    [pid] = _children(rig, iid)
    ticks = procs.start_ticks(pid)
    try:
        assert procs.is_alive(pid, ticks)
        yield iid, pid, ticks
    finally:
        if procs.is_alive(pid, ticks):
            os.kill(pid, signal.SIGKILL)


def test_reclaim_kills_a_daemonised_helper_that_dropped_the_instance_env(
        rig: Rig, monkeypatch: Any) -> None:
    with _orphan(rig, monkeypatch) as (_, pid, ticks):
        rig.at(4 * TICK_S)
        wait_for(lambda: not procs.is_alive(pid, ticks), what="the helper killed")


def test_terminate_kills_a_daemonised_helper_that_dropped_the_instance_env(
        rig: Rig, monkeypatch: Any) -> None:
    # The workload dies of the SIGTERM at once: the rest goes with it, as in a VM's shutdown.
    with _orphan(rig, monkeypatch, market="on-demand") as (iid, pid, ticks):
        rig.client.terminate(iid)
        wait_for(lambda: _ended(rig, iid) and not procs.is_alive(pid, ticks),
                 what="the instance ended, the helper killed")
        assert rig.market.state.get(iid).cause is TerminationCause.USER  # type: ignore


def test_an_instance_that_shuts_down_leaves_no_daemonised_helper(rig: Rig,
                                                                 monkeypatch: Any) -> None:
    with _orphan(rig, monkeypatch, market="on-demand") as (iid, pid, ticks):
        (_disk(rig, iid) / "stop").write_text("")
        wait_for(lambda: _ended(rig, iid) and not procs.is_alive(pid, ticks),
                 what="the instance ended, the helper killed")
        assert rig.market.state.get(iid).cause is TerminationCause.INSTANCE_SHUTDOWN  # type: ignore


def test_spot_refused_in_unavailable_pool_first_candidate_with_capacity_wins(rig: Rig) -> None:
    with pytest.raises(MarketRefused) as err:
        rig.launch(zone="zb")
    assert "p3.2xlarge/zb/spot" in err.value.reasons
    assert rig.client.instances() == []
    body = {"client_token": "c1", "user_data": "", "candidates": [
        {"instance_type": "p3.2xlarge", "zone": "zb", "market": "spot"},
        {"instance_type": "g5.xlarge", "zone": "za", "market": "spot"}]}
    inst = rig.client.launch(body)
    assert (inst["zone"], inst["instance_type"]) == ("za", "g5.xlarge")
    # Spot price scales with the type's on-demand price: 1.0 * 1.006 / 3.06.
    assert inst["price_usd_per_hour"] == pytest.approx(1.006 / 3.06, rel=1e-4)


def test_spot_refused_above_max_price_and_unknown_zone(rig: Rig) -> None:
    with pytest.raises(MarketRefused) as err:
        rig.launch(max_price_usd_per_hour=0.5)
    assert "above max" in err.value.reasons["p3.2xlarge/za/spot"]
    with pytest.raises(MarketRefused) as err:
        rig.launch(zone="nowhere", market="on-demand")
    assert "unknown zone" in err.value.reasons["p3.2xlarge/nowhere/on-demand"]


def test_on_demand_always_launches_and_is_never_reclaimed(rig: Rig) -> None:
    inst = rig.launch(zone="zb", market="on-demand")
    assert inst["state"] == "running" and inst["price_usd_per_hour"] == 3.06
    assert inst["reclaim_at"] is None
    rig.at(7 * TICK_S)
    assert rig.client.instances(ids=[inst["instance_id"]])[0]["state"] == "running"


def test_client_token_is_idempotent(rig: Rig) -> None:
    a = rig.launch(token="tok-1")
    b = rig.launch(token="tok-1")
    assert a["instance_id"] == b["instance_id"]
    assert len(rig.client.instances()) == 1
    assert len(list((rig.market.dir / "instances").iterdir())) == 1
    assert rig.launch(token="tok-2")["instance_id"] != a["instance_id"]


def test_terminate_kills_the_group_and_is_idempotent(rig: Rig, monkeypatch: Any) -> None:
    monkeypatch.setenv("TEST_INSTANCE_CHILDREN", "1")
    iid = rig.launch(market="on-demand")["instance_id"]
    kids = _children(rig, iid)
    first = rig.client.terminate(iid)
    assert first is not None and first["state"] in ("shutting-down", "terminated")
    rig.client.terminate(iid)
    assert rig.client.terminate("i-00000000000000000") is None
    rec = rig.market.state.get(iid)
    assert rec is not None

    def ended() -> bool:
        rig.market.step()
        return rig.client.instances(ids=[iid])[0]["state"] == "terminated"

    wait_for(ended, what="terminated")
    [after] = rig.client.instances(ids=[iid])
    assert after["cause"] == TerminationCause.USER.value
    wait_for(lambda: not any(procs.is_alive(p, None) for p in kids + [rec.pid]),
             what="group dead")
    assert rig.client.terminate(iid)["state"] == "terminated"


def test_instance_that_exits_by_itself_is_instance_shutdown(rig: Rig) -> None:
    iid = rig.launch(market="on-demand")["instance_id"]
    (_disk(rig, iid) / "stop").write_text("")

    def ended() -> bool:
        rig.market.step()
        return rig.market.state.get(iid).state is InstanceState.TERMINATED  # type: ignore

    wait_for(ended, what="shutdown seen")
    assert rig.market.state.get(iid).cause is TerminationCause.INSTANCE_SHUTDOWN  # type: ignore


def test_instance_env_points_at_its_imds_and_user_data_is_served(rig: Rig) -> None:
    iid = rig.launch()["instance_id"]
    env_path = _disk(rig, iid) / "env.json"
    env = wait_for(lambda: env_path.exists() and env_path.stat().st_size and
                   json.loads(env_path.read_text()), what="env.json")
    assert env["SPOTRUN_INSTANCE_ID"] == iid
    assert env["SPOTRUN_IMDS_ENDPOINT"] == f"{rig.client.url}/imds/{iid}"
    tok = rig.token(iid)
    assert rig.imds(iid, "user-data", tok) == (200, '{"hello": 1}')
    assert rig.imds(iid, "meta-data/instance-id", tok) == (200, iid)
    assert rig.imds(iid, "meta-data/placement/availability-zone", tok) == (200, "za")
    assert rig.imds(iid, "meta-data/instance-type", tok) == (200, "p3.2xlarge")


def test_imdsv2_token_is_required_and_bound_to_instance_and_ttl(rig: Rig) -> None:
    a = rig.launch()["instance_id"]
    b = rig.launch(market="on-demand")["instance_id"]
    assert rig.imds(a, "meta-data/instance-id")[0] == 401
    assert rig.imds(a, "meta-data/instance-id", "123.abc")[0] == 401
    assert rig.imds(a, "api/token", method="PUT")[0] == 400
    assert rig.imds(a, "api/token", method="PUT",
                    headers={"X-aws-ec2-metadata-token-ttl-seconds": "0"})[0] == 400
    tok_b = rig.token(b)
    assert rig.imds(a, "meta-data/instance-id", tok_b)[0] == 401
    tok_a = rig.token(a, ttl="5")
    assert rig.imds(a, "meta-data/instance-id", tok_a)[0] == 200
    rig.clock.advance(5)
    assert rig.imds(a, "meta-data/instance-id", tok_a)[0] == 401


def test_admin_interrupt_with_and_without_notice(rig: Rig) -> None:
    a = rig.launch()["instance_id"]
    rig.at(10.0)
    got = rig.client.interrupt(a, in_s=100.0)
    now = rig.market.clock.epoch_wall_s + 10.0
    # The notice cannot start before now: max(now, reclaim - notice_s).
    assert got["notice_at"] == rig.client.instances(ids=[a])[0]["notice_at"]
    assert rig.market.state.get(a).notice_at == pytest.approx(now)  # type: ignore
    assert rig.market.state.get(a).reclaim_at == pytest.approx(now + 100)  # type: ignore
    b = rig.launch(token="b")["instance_id"]
    tok = rig.token(b)
    gone = rig.client.interrupt(b, in_s=0, notice=False)
    assert (gone["state"], gone["cause"], gone["notice_at"]) == ("terminated", "spot-reclaim",
                                                                 None)
    assert rig.imds(b, "meta-data/spot/instance-action", tok)[0] == 404
    rig.at(110.0)
    assert rig.market.state.get(a).cause is TerminationCause.SPOT_RECLAIM  # type: ignore


def test_bad_launch_body_is_400(rig: Rig) -> None:
    from spotrun.errors import BadInputError
    with pytest.raises(BadInputError):
        rig.client.launch({"candidates": [{"zone": "za"}]})
    with pytest.raises(BadInputError):
        rig.client.launch({"candidates": []})

"""The market as a real detached process: restart and re-adoption, real-clock reclaims, the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from conftest import MarketFactory, write_trace
from polling import wait_for

from spotrun.providers.local.market import procs
from spotrun.providers.local.market.client import MarketClient, ensure_market, read_live_info
from spotrun.providers.local.market.clock import aws_time
from spotrun.providers.local.market.options import MarketOptions
from spotrun.providers.local.market.state import MarketState

OD = {"instance_type": "p3.2xlarge", "zone": "za", "market": "on-demand"}
SPOT = {"instance_type": "p3.2xlarge", "zone": "za", "market": "spot"}


def _launch(client: MarketClient, cand: dict[str, str], token: str) -> dict:
    return client.launch({"client_token": token, "user_data": "{}", "candidates": [cand],
                          "tags": {"spotrun:job": "jp"}})


def test_restarted_market_keeps_its_clock_and_readopts_instances(
        market_factory: MarketFactory, tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.csv", {"za": [1] * 20})
    state_dir = tmp_path / "m"
    client = market_factory(state_dir=state_dir, trace=trace, time_scale=5.0)
    epoch = client.time()["epoch_wall_s"]
    inst = _launch(client, OD, "t1")
    old = read_live_info(state_dir)
    assert old is not None
    os.kill(old["pid"], signal.SIGKILL)        # a crash: no chance to clean up
    wait_for(lambda: read_live_info(state_dir) is None, what="market gone")
    rec = MarketState(state_dir).get(inst["instance_id"])
    assert rec is not None and procs.is_alive(rec.pid, rec.pid_start_ticks)   # instance lives on

    again = market_factory(state_dir=state_dir, trace=trace, time_scale=50.0)
    new = read_live_info(state_dir)
    assert new is not None and new["pid"] != old["pid"]
    t = again.time()
    assert t["epoch_wall_s"] == epoch and t["time_scale"] == 5.0      # stored options win
    assert new["ignored_options"] == ["time_scale"]
    [seen] = again.instances(ids=[inst["instance_id"]])
    assert seen["state"] == "running" and seen["pid"] == rec.pid
    assert _launch(again, OD, "t1")["instance_id"] == inst["instance_id"]   # token survives
    again.terminate(inst["instance_id"])
    wait_for(lambda: again.instances(ids=[inst["instance_id"]])[0]["state"] == "terminated",
             what="adopted instance terminated")
    assert not procs.is_alive(rec.pid, rec.pid_start_ticks)


def test_real_clock_notice_then_reclaim_at_high_time_scale(market_factory: MarketFactory,
                                                          tmp_path: Path) -> None:
    # za up for rows 0-2, down at row 3: reclaim 180 market s after the epoch; x200 = 0.9 s wall.
    trace = write_trace(tmp_path / "t.csv", {"za": [1, 1, 1, 0, 0, 0]})
    client = market_factory(trace=trace, time_scale=200.0, notice_s=60.0,
                            spot_price_usd_per_hour=0.5)
    inst = _launch(client, SPOT, "s1")
    epoch = client.time()["epoch_wall_s"]
    assert inst["reclaim_at"] is not None
    iid = inst["instance_id"]
    base = f"{client.url}/imds/{iid}/latest"
    import urllib.error
    import urllib.request
    tok = urllib.request.urlopen(urllib.request.Request(
        base + "/api/token", method="PUT",
        headers={"X-aws-ec2-metadata-token-ttl-seconds": "30"})).read().decode()

    def notice() -> tuple[float, str] | None:
        req = urllib.request.Request(base + "/meta-data/spot/instance-action",
                                     headers={"X-aws-ec2-metadata-token": tok})
        before = client.time()["now_s"]
        try:
            body = urllib.request.urlopen(req).read().decode()
        except urllib.error.HTTPError as exc:
            assert exc.code == 404
            assert before < epoch + 180.0 - 60.0 + 1e-6 or before >= epoch + 180.0
            return None
        return before, body

    _, body = wait_for(notice, what="notice")
    assert json.loads(body) == {"action": "terminate", "time": aws_time(epoch + 180.0)}
    assert client.time()["now_s"] >= epoch + 180.0 - 60.0
    pid = inst["pid"]
    wait_for(lambda: client.instances(ids=[iid])[0]["state"] == "terminated", what="reclaim")
    [after] = client.instances(ids=[iid])
    assert after["cause"] == "spot-reclaim" and after["ended_at"] == after["reclaim_at"]
    assert not procs.is_alive(pid, None)


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spotrun", "market", *args], text=True,
                          capture_output=True, timeout=60, env=env)


def test_cli_start_status_stop(tmp_path: Path, instance_command: str, tmp_home: Path) -> None:
    trace = write_trace(tmp_path / "t.csv", {"za": [1] * 5, "zb": [0] * 5})
    state_dir = tmp_path / "cli"
    try:
        out = _cli("start", "--state-dir", str(state_dir), "--trace", str(trace),
                   "--spot-price", "0.7", "--time-scale", "30", "--grace-s", "1",
                   "--instance-command", instance_command)
        assert out.returncode == 0, out.stderr
        url = out.stdout.strip()
        assert url.startswith("http://127.0.0.1:")
        iid = _launch(MarketClient(url), OD, "c1")["instance_id"]
        status = json.loads(_cli("status", "--state-dir", str(state_dir), "--json").stdout)
        assert status["running"] is True and status["url"] == url
        assert {(p["zone"], p["available"]) for p in status["pools"]} == {("za", True),
                                                                          ("zb", False)}
        assert [i["instance_id"] for i in status["instances"]] == [iid]
        table = _cli("status", "--state-dir", str(state_dir), env={**os.environ, "COLUMNS": "200"})
        assert "za" in table.stdout and iid in table.stdout
        assert _cli("stop", "--state-dir", str(state_dir)).stdout.strip() == "stopped"
        rec = MarketState(state_dir).get(iid)
        assert rec is not None and rec.cause is not None and rec.cause.value == "user"
        assert not procs.is_alive(rec.pid, rec.pid_start_ticks)
        assert json.loads(_cli("status", "--state-dir", str(state_dir), "--json").stdout) == {
            "running": False, "state_dir": str(state_dir.resolve())}
    finally:
        from conftest import kill_leftovers
        kill_leftovers(state_dir)


def test_cli_bad_option_exits_2_and_writes_nothing(tmp_path: Path, tmp_home: Path) -> None:
    state_dir = tmp_path / "never"
    out = _cli("start", "--state-dir", str(state_dir), "--time-scale", "0")
    assert out.returncode == 2
    assert "time_scale" in out.stderr and "Traceback" not in out.stderr
    assert not state_dir.exists()


def test_ensure_market_reuses_the_live_one(market_factory: MarketFactory, tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.csv", {"za": [1] * 5})
    first = market_factory(state_dir=tmp_path / "r", trace=trace)
    second = ensure_market(tmp_path / "r", MarketOptions(trace=str(trace)))
    assert second.url == first.url

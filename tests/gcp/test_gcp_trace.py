"""`spotrun simulate` on a GCP-shaped availability trace: the JSON files of the public GCP
traces (skypilot-org/spot-traces: `{"metadata": {"gap_seconds": 30}, "data": [...]}`, one pool
per file named `<zone>_<machine type>.json`), one file or a directory of them."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from spotrun.cli import cli
from spotrun.traces import load_trace

A = "us-central1-a_g2-standard-4"
B = "us-central1-b_g2-standard-4"


def _write(directory: Path, name: str, data, gap: float = 30.0) -> Path:
    path = directory / f"{name}.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": data}))
    return path


def _simulate(*args: str):
    return CliRunner().invoke(cli, ["simulate", *args, "--od-price", "0.71", "--work-hours",
                                    "1", "--deadline-hours", "3", "--starts", "4", "--json"])


def test_a_directory_of_gcp_json_traces_is_one_trace_with_a_pool_per_file(tmp_path):
    d = tmp_path / "gcp-trace"
    d.mkdir()
    _write(d, A, [1] * 400)                              # always there
    _write(d, B, ([1] * 20 + [0] * 20) * 8 + [1] * 50)   # preempted every 20 min, shorter
    trace = load_trace(d)
    assert trace.pools == [A, B] and trace.tick_s == 30.0 and len(trace) == 400
    assert trace.available[-1].tolist() == [1, -1]        # past B's end: blank, not available
    prices = tmp_path / "prices.csv"
    prices.write_text("zone,tick,time_utc,spot_price_usd_per_hour\n"
                      "us-central1-a,0,,0.40\nus-central1-b,0,,0.39\n")
    res = _simulate("--trace", str(d), "--prices", str(prices))
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["model"]["pools"] == [A, B] and out["model"]["tick_s"] == 30.0
    assert {p for p in out["policies"]} and all(
        s["mean_cost_usd"] > 0 for s in out["policies"].values())


def test_one_file_is_one_pool_and_several_pools_may_share_a_file(tmp_path):
    one = _write(tmp_path, A, [0, 1, 1, 1] * 100)
    res = _simulate("--trace", str(one), "--spot-price", "0.40")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["model"]["pools"] == [A]
    both = tmp_path / "both.json"
    both.write_text(json.dumps({"metadata": {"gap_seconds": 60},
                                "data": {A: [1] * 200, B: [0] * 200}}))
    assert load_trace(both).pools == [A, B]


def test_a_malformed_json_trace_is_one_error_naming_the_trace(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"data": [1, 1]}))           # no gap_seconds
    res = _simulate("--trace", str(bad), "--spot-price", "0.40")
    assert res.exit_code == 2 and "trace" in res.output and "gap_seconds" in res.output
    assert "Traceback" not in res.output
    d = tmp_path / "mixed"
    d.mkdir()
    _write(d, A, [1] * 10, gap=30)
    _write(d, B, [1] * 10, gap=60)
    res = _simulate("--trace", str(d), "--spot-price", "0.40")
    assert res.exit_code == 2 and "same gap_seconds" in res.output

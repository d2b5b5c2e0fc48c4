"""GPU units, refusals and the true waiting reason, through `spotrun plan` and `submit`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from spotrun.catalog import load_catalog
from spotrun.cli import cli
from spotrun.decide import catalog_snapshot, decide, wait_reason
from spotrun.costmodel import NoHistory
from spotrun.spec import parse_spec
from spotrun.providers.aws import DEFAULT_ZONES as DEFAULT_AWS_ZONES

ZONES = DEFAULT_AWS_ZONES["us-east-1"]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    (h / "spotrun.toml").write_text('provider = "aws"\nregion = "us-east-1"\n')
    return h


def _run(home: Path, *args: str):
    return CliRunner().invoke(cli, list(args), env={"SPOTRUN_HOME": str(home)})


def _spec_file(tmp: Path, name: str, body: str) -> Path:
    p = tmp / f"{name}.yaml"
    p.write_text(f"name: {name}\ncommand: python train.py\n{body}")
    return p


def _plan(home: Path, path: Path) -> dict:
    # The model's figures on the catalog's prices (--offline): no cloud is called.
    res = _run(home, "plan", "--offline", str(path), "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_one_gpu_job_gains_nothing_from_an_eight_gpu_node(home: Path, tmp_path: Path) -> None:
    path = _spec_file(tmp_path, "one", "work: {reference_hours: 10, reference_instance: "
                      "p3.2xlarge}\nresources: {instance_types: [p3.2xlarge, p3.16xlarge]}\n"
                      "policy: {market: on-demand}\n")
    rows = {r["instance_type"]: r for r in _plan(home, path)["candidates"]}
    small, big = rows["p3.2xlarge"], rows["p3.16xlarge"]
    assert small["speedup"] == big["speedup"] == 1.0
    assert (small["gpus_used"], small["node_gpus"]) == (1, 1)
    assert (big["gpus_used"], big["node_gpus"]) == (1, 8)
    # The whole node is paid: eight times the price for the same progress.
    assert big["usd_per_reference_hour"] == pytest.approx(8 * small["usd_per_reference_hour"])
    order = [r["instance_type"] for r in _plan(home, path)["candidates"]]
    assert order.index("p3.2xlarge") < order.index("p3.16xlarge")


def test_eight_gpus_follow_the_scaling_table(home: Path, tmp_path: Path) -> None:
    path = _spec_file(tmp_path, "eight", "work: {reference_hours: 56, reference_instance: "
                      "p3.2xlarge}\nresources: {gpus: 8, instance_types: [p3.16xlarge]}\n")
    row = _plan(home, path)["candidates"][0]
    assert row["gpus_used"] == 8 and row["speedup"] == pytest.approx(5.6)
    # A range lets the same node use all eight; a fixed 1 uses one.
    ranged = _spec_file(tmp_path, "ranged", 'resources: {gpus: "1-8", instance_types: '
                        '[p3.16xlarge]}\n')
    assert _plan(home, ranged)["candidates"][0]["gpus_used"] == 8


@pytest.mark.parametrize("name,body,field,words", [
    ("big", "model: {params_billion: 70, sharding: none}\n", "model.sharding",
     ["1155 GB per GPU", "H200", "fsdp"]),
    ("wide", "resources: {gpus: 16}\n", "resources.gpus", ["16 GPUs per node", "the most is 8"]),
    ("filtered", "model: {params_billion: 7}\nresources: {instance_types: [g5.xlarge]}\n",
     "resources.instance_types", ["types that can", "p5e"]),
    ("late", "work: {reference_hours: 500, reference_instance: p3.2xlarge}\n"
             "policy: {deadline_hours: 2}\n", "policy.deadline", ["fastest"]),
    # Issue 22: a 140 s save cannot fit the 2-minute notice, and one periodic save in 10 h
    # loses a whole up stretch per reclaim: no spot pool ever keeps progress (was: queued
    # forever). `auto` without a deadline never pays on-demand, so it cannot run either.
    ("unsaved", "model: {params_billion: 10}\nresources: {gpu_memory_gb: 20}\n"
                "checkpoint: {interval_minutes: 600}\npolicy: {market: spot}\n", "policy.market",
     ["no spot pool keeps progress", "do not fit the 120 s notice", "on-demand"]),
    ("unsaved-auto", "model: {params_billion: 10}\nresources: {gpu_memory_gb: 20}\n"
                     "checkpoint: {interval_minutes: 600}\npolicy: {market: auto}\n",
     "policy.market", ["no spot pool keeps progress", "policy.deadline"]),
])
def test_never_runs_exits_2_with_the_reason_and_writes_nothing(
        home: Path, tmp_path: Path, name: str, body: str, field: str, words: list[str]) -> None:
    path = _spec_file(tmp_path, name, body)
    for verb in (["submit"], ["submit", "--dry-run"], ["plan"]):
        res = _run(home, *verb, str(path))
        assert res.exit_code == 2, (verb, res.output)
        assert field in res.output and "Traceback" not in res.output, res.output
        for w in words:
            assert w in res.output, (w, res.output)
        assert len(res.output.strip().splitlines()) == 1
    assert sorted(p.name for p in home.iterdir()) == ["spotrun.toml"]


def test_what_the_refused_spot_job_needs_to_run_is_accepted(home: Path, tmp_path: Path) -> None:
    body = "model: {params_billion: 10}\nresources: {gpu_memory_gb: 20}\n"
    # A deadline lets `auto` pay on-demand; a 30-minute interval bounds the loss on spot.
    late = _plan(home, _spec_file(tmp_path, "late", body + "checkpoint: {interval_minutes: 600}"
                                  "\npolicy: {market: auto, deadline_hours: 400}\n"))
    assert any(r["launch"] and r["market"] == "on-demand" for r in late["candidates"])
    often = _plan(home, _spec_file(tmp_path, "often", body + "checkpoint: {interval_minutes: 30}"
                                   "\npolicy: {market: spot}\n"))
    rows = [r for r in often["candidates"] if r["launch"]]
    assert rows and all(r["market"] == "spot" and r["notice_usable"] == 0 for r in rows)
    assert "do not fit the 120 s notice" in rows[0]["notice_detail"]


def test_a_price_cap_below_every_price_is_accepted_with_a_warning(home: Path,
                                                                  tmp_path: Path) -> None:
    path = _spec_file(tmp_path, "cheap", "policy: {max_price_usd_per_hour: 0.01}\n")
    res = CliRunner().invoke(cli, ["submit", str(path)],
                             env={"SPOTRUN_HOME": str(home)})
    assert res.exit_code == 0, res.output
    assert "below every price now" in res.output and "$0.01/h" in res.output
    # The waiting reason the daemon records (and status shows) is the true one.
    cat = load_catalog()
    spec = parse_spec({"name": "cheap", "command": "x",
                       "policy": {"max_price_usd_per_hour": 0.01}}, base_dir=Path("."),
                      instance_types=cat.names(), zones=ZONES)
    from datetime import datetime, timezone
    market = catalog_snapshot(cat, "us-east-1", ZONES, datetime.now(timezone.utc))
    placed = decide(spec, catalog=cat, market=market, history=NoHistory(), hours_left=None)
    assert not placed.candidates
    assert placed.wait_reason.startswith("price cap $0.01/h is below every spot price now; "
                                         "lowest $")
    assert wait_reason(spec, placed.ranking, market) == placed.wait_reason


def test_gpu_range_is_validated(home: Path, tmp_path: Path) -> None:
    for bad in ('"8-1"', '"0-4"', '"1-65"', '"a-b"', '"3"'):
        res = _run(home, "plan", str(_spec_file(tmp_path, "r", f"resources: {{gpus: {bad}}}\n")))
        assert res.exit_code == 2 and "resources.gpus" in res.output, (bad, res.output)


def test_plan_json_says_where_each_reclaim_rate_came_from(home: Path, tmp_path: Path) -> None:
    path = _spec_file(tmp_path, "risk", "resources: {instance_types: [p3.2xlarge, g6.xlarge], "
                      "zones: [us-east-1a, us-east-1f]}\npolicy: {market: spot}\n")
    rows = {(r["instance_type"], r["zone"]): r for r in _plan(home, path)["candidates"]}
    p3a, p3f = rows[("p3.2xlarge", "us-east-1a")], rows[("p3.2xlarge", "us-east-1f")]
    g6f = rows[("g6.xlarge", "us-east-1f")]
    # Per zone from the traces: us-east-1a reclaims far more often than us-east-1f.
    assert p3a["reclaims_per_hour"] > 2 * p3f["reclaims_per_hour"]
    assert p3f["reclaims_per_hour_source"] == "trace"
    # g6 has no trace of its own: the nearest traced family, and the plan says so.
    assert g6f["reclaims_per_hour_source"] == "trace-nearest-family"
    assert "p3" in g6f["reclaims_per_hour_detail"]

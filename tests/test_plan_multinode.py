"""Multi-node in the cost model: speed across nodes by interconnect (EFA or not), N nodes'
price, the 70B memory figure, and `spotrun plan` for a 70B FSDP job on 2 nodes of 8 GPUs.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from decide_helpers import rank_candidates
from spotrun.catalog import load_catalog
from spotrun.cli import cli
from spotrun.costmodel import CatalogPrices, NoHistory, default_scaling
from spotrun.costmodel.memory import activation_gb, memory_need
from spotrun.costmodel.speed import gpu_speed, instance_speed
from spotrun.spec import parse_spec

NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)
ZONES = ["us-east-1a", "us-east-1b"]
BIG = {"name": "llama-70b", "command": "torchrun train.py",
       "model": {"params_billion": 70, "sharding": "fsdp"},
       "resources": {"nodes": 2, "gpus": 8},
       "work": {"reference_hours": 2000, "reference_instance": "p3.2xlarge"}}


def _spec(raw: dict):
    cat = load_catalog()
    return parse_spec(raw, base_dir=Path("."), instance_types=cat.names(), zones=ZONES, now=NOW)


def _rank(raw: dict):
    cat = load_catalog()
    return rank_candidates(_spec(raw), catalog=cat, zones=ZONES,
                           prices=CatalogPrices(cat, "us-east-1"), history=NoHistory(),
                           region="us-east-1", now=NOW)


def test_nodes_scale_by_the_curve_with_efa_and_keep_less_without() -> None:
    cat = load_catalog()
    curve = default_scaling(cat)
    p4d, p3 = cat.get("p4d.24xlarge"), cat.get("p3.16xlarge")
    assert p4d.efa and not p3.efa
    kw = dict(precision="bf16", sharding="none", scaling=curve, gpus=8)
    one, two = instance_speed(cat, p4d, **kw), instance_speed(cat, p4d, nodes=2, **kw)
    # EFA: the BRIEF's curve at 16 GPUs (8.5x) against 8 GPUs (5.6x).
    assert two / one == pytest.approx(8.5 / 5.6)
    gain = cat.meta["node_scaling"]["no_efa"]
    p3_one, p3_two = instance_speed(cat, p3, **kw), instance_speed(cat, p3, nodes=2, **kw)
    assert p3_two == pytest.approx(gpu_speed(cat, p3, "bf16") * (5.6 + 2.9 * gain))
    assert p3_one < p3_two < p3_one * 8.5 / 5.6


def test_activations_grow_sublinearly_above_7b() -> None:
    assert activation_gb(7) == pytest.approx(7.0) and activation_gb(0.5) == pytest.approx(1.0)
    assert activation_gb(70) == pytest.approx(7 * 10 ** 0.7)          # 35.1 GB
    need = memory_need(_spec({**BIG, "resources": {"gpus": 8}}), 16)
    assert need.state_gb == pytest.approx(70 * 16 / 16) and need.need_gb == pytest.approx(
        70 + 7 * 10 ** 0.7)


def test_two_nodes_price_and_speed_in_the_ranking() -> None:
    ranking = _rank(BIG)
    assert ranking.candidates, [r.to_dict() for r in ranking.rejected]
    cat = load_catalog()
    for c in ranking.candidates:
        assert c.nodes == 2 and c.gpus == 8 and c.efa
        # Only the 141 GiB H200 holds 70 GB of sharded state + 35 GB of activations.
        assert cat.get(c.instance_type).gpu == "H200"
        assert c.usd_per_reference_hour == pytest.approx(
            c.price_usd_per_hour * 2 / (c.speedup * c.progress_fraction))
        row = c.to_dict()
        assert row["total_price_usd_per_hour"] == pytest.approx(row["price_usd_per_hour"] * 2,
                                                                abs=1e-3)
    rejected = {r.instance_type: r.reason for r in ranking.rejected if r.kind == "never"}
    assert "GB per GPU" in rejected["p5.48xlarge"]       # 80 GB cards cannot hold it


def test_plan_shows_a_70b_fsdp_job_on_two_nodes_per_node_and_total(
        tmp_path: Path) -> None:
    (tmp_path / "spotrun.toml").write_text('provider = "aws"\nregion = "us-east-1"\n')
    path = tmp_path / "llama-70b.yaml"
    path.write_text(yaml.safe_dump(BIG))
    env = {"SPOTRUN_HOME": str(tmp_path)}
    res = CliRunner().invoke(cli, ["plan", "--offline", str(path), "--json"], env=env)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["candidates"]
    for row in out["candidates"]:
        assert (row["nodes"], row["gpus_used"]) == (2, 8)
        assert row["total_price_usd_per_hour"] == pytest.approx(
            2 * row["price_usd_per_hour"], abs=1e-3)
        assert row["expected_usd"] == pytest.approx(
            row["total_price_usd_per_hour"] * row["expected_hours"], rel=1e-2)
    table = CliRunner().invoke(cli, ["plan", "--offline", "--wide", str(path)], env=env)
    assert table.exit_code == 0, table.output
    first = out["candidates"][0]
    assert "2x8/8" in table.output
    assert (f"{first['price_usd_per_hour']:.3f} x2 = "
            f"{first['total_price_usd_per_hour']:.2f}") in table.output
    assert "2 nodes: $/h = per node x nodes = total" in table.output


def test_catalog_says_which_types_have_efa() -> None:
    cat = load_catalog()
    # moto's DescribeInstanceTypes EfaSupported (catalog-facts.md [S4]).
    want = {"g4dn.12xlarge", "g4dn.metal", "g5.12xlarge", "g5.48xlarge", "g6.12xlarge",
            "g6.48xlarge", "g6e.12xlarge", "g6e.48xlarge", "p3dn.24xlarge", "p4d.24xlarge",
            "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge"}
    assert all(isinstance(t.extra.get("efa"), bool) for t in cat.types.values())
    assert {n for n, t in cat.types.items() if t.efa} == want


def test_plan_of_two_nodes_fits_80_columns_with_per_node_and_total(tmp_path: Path) -> None:
    (tmp_path / "spotrun.toml").write_text('provider = "aws"\nregion = "us-east-1"\n')
    path = tmp_path / "llama-70b.yaml"
    path.write_text(yaml.safe_dump(BIG))
    env = {"SPOTRUN_HOME": str(tmp_path), "COLUMNS": "80"}
    out = json.loads(CliRunner().invoke(cli, ["plan", "--offline", str(path), "--json"],
                                        env=env).output)
    table = CliRunner().invoke(cli, ["plan", "--offline", str(path), "--top", "0"], env=env)
    assert table.exit_code == 0, table.output
    assert max(len(line) for line in table.output.splitlines()) <= 80
    first = out["candidates"][0]
    # $/h is never dropped: per node x nodes = total, whole, in the first ranked row.
    row = next(line for line in table.output.splitlines() if line.startswith("│ 1 "))
    assert (f"{first['price_usd_per_hour']:.3f} x2 = "
            f"{first['total_price_usd_per_hour']:.2f}") in row
    assert first["instance_type"] in row and first["zone"] in row

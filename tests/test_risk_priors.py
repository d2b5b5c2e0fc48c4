"""Reclaim risk per pool from the traces: the packaged figures, the script behind them, rules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from spotrun.catalog import load_catalog
from spotrun.costmodel.risk import (PRIOR_RECLAIMS, RiskHint, packaged_trace_priors, risk_model,
                                    traced_types)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "reclaim_priors.py"
PACKAGED = ROOT / "spotrun" / "data" / "risk" / "reclaim_priors.yaml"
SHARED = Path("/work/shared/traces")
NEEDED = ("aws_p3.2xlarge_availability_2023-02-15_9az.csv",
          "aws_p3.2xlarge_16node_availability_2023-08-27.csv",
          "aws_p3.2xlarge_4node_preemption_2023-08-03.csv")


def _run_script(traces: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--traces", str(traces), "--out", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.mark.skipif(not all((SHARED / f).exists() for f in NEEDED),
                    reason="shared traces not on this machine")
def test_script_reproduces_the_packaged_yaml(tmp_path: Path) -> None:
    out = tmp_path / "reclaim_priors.yaml"
    res = _run_script(SHARED, out)
    assert res.returncode == 0, res.stderr
    assert out.read_text() == PACKAGED.read_text()


def test_script_counts_probes_per_flip_and_running_instances_per_loss(tmp_path: Path) -> None:
    # 9az probe: us-east-1a up 2 rows, down, up 1 row; us-east-1c up then blank (censored).
    (tmp_path / NEEDED[0]).write_text(
        "tick,time_utc,us-east-1a,us-east-1c\n0,2023-01-01T00:00:00Z,1,1\n"
        "1,2023-01-01T01:00:00Z,1,1\n2,2023-01-01T02:00:00Z,0,\n3,2023-01-01T03:00:00Z,1,\n")
    # 16-node: one-instance view; a drop 16 -> 5 is no reclaim, 5 -> 0 is one.
    (tmp_path / NEEDED[1]).write_text(
        "tick,elapsed_s,us-east-1a\n0,0,16\n1,3600,5\n2,7200,0\n3,10800,0\n")
    # 4-node running: 4 -> 3 (1 lost), 3 -> 4 relaunch, 4 -> 2 (2 lost), then blank (censored).
    (tmp_path / NEEDED[2]).write_text(
        "tick,elapsed_s,us-west-2c\n0,0,4\n1,3600,3\n2,7200,4\n3,10800,2\n4,14400,\n")
    out = tmp_path / "out.yaml"
    res = _run_script(tmp_path, out)
    assert res.returncode == 0, res.stderr
    fam = yaml.safe_load(out.read_text())["families"]["p3"]
    assert fam["traced_type"] == "p3.2xlarge"
    a = fam["zones"]["us-east-1a"]
    # probe: 3 h up (last row counts one tick = 1 h), 1 flip; 16-node: 2 h up, 1 flip.
    assert a["parts"] == {"9az": [3.0, 1], "16node": [2.0, 1]}
    assert (a["up_hours"], a["reclaims"]) == (5.0, 2)
    assert fam["zones"]["us-east-1c"]["reclaims"] == 0     # blank after up: censored
    c = fam["zones"]["us-west-2c"]
    assert c["parts"] == {"4node": [13.0, 3]}              # 4 + 3 + 4 + 2 instance-hours
    assert fam["regions"]["us-east-1"] == {"up_hours": 7.0, "reclaims": 2, "mtbf_h": 3.5}
    assert fam["all"]["reclaims"] == 5


def test_script_refuses_a_folder_without_the_traces(tmp_path: Path) -> None:
    res = _run_script(tmp_path, tmp_path / "x.yaml")
    assert res.returncode == 2 and "--traces" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "x.yaml").exists()


def test_packaged_figures_name_their_sources_and_commit() -> None:
    data = packaged_trace_priors()
    assert set(data["sources"]) == {"9az", "16node", "4node"}
    for src in data["sources"].values():
        assert src["file"] in NEEDED and "221da1ab" in src["origin"]
    assert traced_types() == ["p3.2xlarge"]


def test_priors_differ_per_zone_where_the_traces_differ() -> None:
    model = risk_model(load_catalog())
    zones = packaged_trace_priors()["families"]["p3"]["zones"]
    got = {z: model.prior("p3.2xlarge", z) for z in zones}
    for z, p in got.items():
        assert p.source == "trace" and z in p.detail
        assert p.mtbf_h == pytest.approx(zones[z]["up_hours"] / zones[z]["reclaims"])
    assert got["us-east-1a"].reclaims_per_hour > 5 * got["us-west-2b"].reclaims_per_hour
    assert len({round(p.mtbf_h, 3) for p in got.values()}) == len(got)
    # The 4-node trace's real reclaims are part of us-east-1f's figure, and named.
    assert "4node_preemption" in got["us-east-1f"].detail
    assert "4node_preemption" not in got["us-east-1a"].detail


def test_g6_gets_the_nearest_family_and_says_so() -> None:
    model = risk_model(load_catalog())
    g6, p3 = model.prior("g6.xlarge", "us-east-1f"), model.prior("p3.2xlarge", "us-east-1f")
    assert g6.source == "trace-nearest-family"
    assert "g6 has no trace: nearest family p3" in g6.detail
    assert g6.mtbf_h == pytest.approx(p3.mtbf_h)
    assert model.prior("p3.8xlarge", "us-east-1f").source == "trace"     # same family
    assert "same GPU V100" in model.prior("p3dn.24xlarge", "us-east-1f").detail
    assert "same instance class p" in model.prior("p4d.24xlarge", "us-east-1f").detail


def test_untraced_zone_uses_its_region_then_the_whole_family() -> None:
    data = packaged_trace_priors()["families"]["p3"]
    model = risk_model(load_catalog())
    b = model.prior("p3.2xlarge", "us-east-1b")
    reg = data["regions"]["us-east-1"]
    assert b.mtbf_h == pytest.approx(reg["up_hours"] / reg["reclaims"])
    assert "no trace of us-east-1b" in b.detail
    eu = model.prior("p3.2xlarge", "eu-west-1a")
    assert eu.mtbf_h == pytest.approx(data["all"]["up_hours"] / data["all"]["reclaims"])
    assert "no trace in eu-west-1" in eu.detail


def _two_families() -> dict:
    row = lambda h, n: {"up_hours": h, "reclaims": n, "mtbf_h": h / n}  # noqa: E731
    fam = lambda t, zones: {"traced_type": t,  # noqa: E731
                            "zones": {z: {**row(h, n), "parts": {"x": [h, n]}}
                                      for z, (h, n) in zones.items()},
                            "regions": {}, "all": row(sum(h for h, _ in zones.values()),
                                                      sum(n for _, n in zones.values()))}
    return {"sources": {"x": {"file": "synthetic.csv"}},
            "families": {
                "p3": fam("p3.2xlarge", {"us-east-1a": (10.0, 10), "us-east-1c": (40.0, 4)}),
                "g5": fam("g5.xlarge", {"us-east-1a": (90.0, 3), "us-east-1c": (12.0, 6)})}}


def test_per_family_priors_differ_where_their_traces_differ() -> None:
    model = risk_model(load_catalog(), data=_two_families())
    assert model.prior("p3.2xlarge", "us-east-1a").mtbf_h == pytest.approx(1.0)
    assert model.prior("g5.xlarge", "us-east-1a").mtbf_h == pytest.approx(30.0)
    assert model.prior("g5.48xlarge", "us-east-1c").mtbf_h == pytest.approx(2.0)
    assert model.prior("g5.xlarge", "us-east-1a").source == "trace"
    # g6 now has a same-class traced family (g5) nearer than p3.
    g6 = model.prior("g6.xlarge", "us-east-1a")
    assert g6.mtbf_h == pytest.approx(30.0)
    assert "nearest family g5 (same instance class g)" in g6.detail


def test_no_trace_at_all_falls_back_to_the_catalog_default() -> None:
    model = risk_model(load_catalog(), data={"families": {}})
    p = model.prior("g5.xlarge", "us-east-1a")
    assert p.source == "default" and p.mtbf_h == pytest.approx(6336.3 / 1887, rel=1e-3)


def test_hints_scale_and_nudge_with_their_source_named() -> None:
    cat = load_catalog()
    base = risk_model(cat).prior("g6.xlarge", "us-east-1c")
    hints = {("g6.xlarge", "us-east-1a"): RiskHint(advisor_range=(0.0, 0.05), advisor_label="<5%"),
             ("p3.2xlarge", "us-east-1a"): RiskHint(advisor_range=(0.10, 0.15),
                                                    advisor_label="10-15%"),
             ("g6.xlarge", "us-east-1c"): RiskHint(placement_score=10)}
    p = risk_model(cat, hints=hints).prior("g6.xlarge", "us-east-1c")
    # Region-level advisor ratio 2.5/12.5, then score 10 halves the rate: MTBF x 5 x 2.
    assert p.mtbf_h == pytest.approx(base.mtbf_h * 5 * 2)
    assert p.source == "trace-nearest-family+advisor+placement-score"
    assert "<5% vs p3.2xlarge 10-15%" in p.detail and "placement score 10/10" in p.detail
    low = risk_model(cat, hints={("g6.xlarge", "us-east-1c"): RiskHint(placement_score=1)})
    assert low.prior("g6.xlarge", "us-east-1c").mtbf_h == pytest.approx(base.mtbf_h / 2)


def test_observed_history_updates_the_prior() -> None:
    p = risk_model(load_catalog()).prior("p3.2xlarge", "us-west-2b")
    q = p.updated(run_hours=20.0, reclaims=4)
    assert q.mtbf_h == pytest.approx((p.up_hours + 20.0) / (PRIOR_RECLAIMS + 4))
    assert q.source == "trace+observed" and "observed 4 reclaim(s) in 20.0 h" in q.detail
    assert p.updated(0.0, 0) is p


def test_an_advisor_bucket_without_the_reference_type_is_not_used() -> None:
    cat = load_catalog()
    hints = {("g6.xlarge", "us-east-1a"): RiskHint(advisor_range=(0.0, 0.05), advisor_label="<5%")}
    p = risk_model(cat, hints=hints).prior("g6.xlarge", "us-east-1a")
    assert p.source == "trace-nearest-family"
    assert p.mtbf_h == pytest.approx(risk_model(cat).prior("g6.xlarge", "us-east-1a").mtbf_h)
    assert "no advisor bucket for p3.2xlarge" in p.detail

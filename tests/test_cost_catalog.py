"""The catalog's cost-model data: speeds with sources, estimates re-derived, priors recomputed."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from spotrun.catalog import load_catalog
from spotrun.costmodel import priors_from_catalog, zone_priors_from_trace
from spotrun.costmodel.priors import pooled
from spotrun.traces import load_trace

SHARED_TRACE = Path("/work/shared/traces/aws_p3.2xlarge_availability_2023-02-15_9az.csv")
FAMILIES = ("g4dn.", "g5.", "g6.", "p3.", "p3dn.", "p4d.", "p4de.", "p5.")


def test_every_type_has_speed_interconnect_and_the_families_are_there() -> None:
    cat = load_catalog()
    for fam in FAMILIES:
        assert any(n.startswith(fam) for n in cat.names()), fam
    speeds = cat.meta["gpu_speed"]
    for t in cat.types.values():
        assert t.extra["interconnect"] in ("none", "pcie", "nvlink", "nvswitch"), t.name
        assert (t.extra["interconnect"] == "none") == (t.gpus == 1), t.name
        row = speeds[t.gpu]
        assert row["amp"] > 0 and row["fp32"] > 0 and row["source"], t.gpu
        assert row["basis"] in ("measured", "estimate")
    assert cat.meta["scaling_default"] == {1: 1.0, 2: 1.8, 4: 3.2, 8: 5.6, 16: 8.5}


def test_speed_estimates_follow_the_documented_rule() -> None:
    cat = load_catalog()
    ref = cat.meta["speed_estimate_rule"]
    estimates = {g: r for g, r in cat.meta["gpu_speed"].items() if r["basis"] == "estimate"}
    assert set(estimates) == {"T4", "A10G", "L4", "L40S"}
    for gpu, row in estimates.items():
        x = row["estimate_inputs"]
        bw = x["mem_bw_gb_s"] / ref["mem_bw_gb_s"]
        amp = math.sqrt(x["amp_tflops"] / ref["amp_tflops"] * bw)
        fp32 = math.sqrt(x["fp32_tflops"] / ref["fp32_tflops"] * bw)
        assert row["amp"] == pytest.approx(amp, abs=0.005), gpu
        assert row["fp32"] == pytest.approx(fp32, abs=0.005), gpu


def test_zone_priors_from_a_small_trace(tmp_path: Path) -> None:
    # Pool a: up 2 ticks, down, up 3 ticks, then its trace ends (blank: censored, not a reclaim).
    csv = ("tick,elapsed_s,a,b\n0,0,1,0\n1,60,1,0\n2,120,0,1\n3,180,1,1\n4,240,1,0\n5,300,1,0\n"
           "6,360,,0\n")
    p = tmp_path / "t.csv"
    p.write_text(csv)
    pri = zone_priors_from_trace(load_trace(p))
    assert pri["a"].reclaims == 1 and pri["a"].up_hours == pytest.approx(300 / 3600)
    assert pri["b"].reclaims == 1 and pri["b"].up_hours == pytest.approx(120 / 3600)
    assert pri["a"].mtbf_h == pytest.approx(300 / 3600)


@pytest.mark.skipif(not SHARED_TRACE.exists(), reason="shared 9-zone trace not on this machine")
def test_recorded_priors_match_the_trace() -> None:
    computed = zone_priors_from_trace(load_trace(SHARED_TRACE))
    priors = priors_from_catalog(load_catalog())
    assert set(priors.zones) == set(computed)
    for zone, got in computed.items():
        rec = priors.zones[zone]
        assert rec.reclaims == got.reclaims, zone
        assert rec.up_hours == pytest.approx(got.up_hours, abs=0.05), zone
    for region, rec in priors.regions.items():
        want = pooled([p for z, p in computed.items() if z.startswith(region)])
        assert rec.reclaims == want.reclaims and rec.mtbf_h == pytest.approx(want.mtbf_h, abs=0.01)
    assert priors.default.mtbf_h == pytest.approx(pooled(list(computed.values())).mtbf_h, abs=0.01)


def test_unknown_zone_falls_back_to_region_then_default() -> None:
    priors = priors_from_catalog(load_catalog())
    assert priors.zone("us-east-1b") == priors.regions["us-east-1"]
    assert priors.zone("eu-west-9a") == priors.default
    assert priors.zone("us-west-2b").mtbf_h == pytest.approx(10.53, abs=0.01)

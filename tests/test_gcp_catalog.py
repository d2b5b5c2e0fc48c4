"""The GCP catalog, its billing rules and its reclaim priors: complete, sourced, consistent."""

from __future__ import annotations

import math
import re

import pytest

from spotrun.catalog import load_catalog
from spotrun.costmodel.priors import priors_from_catalog
from spotrun.costmodel.risk import family_of, packaged_priors, region_of, risk_model
from spotrun.costmodel.speed import gpu_speed
from spotrun.providers.gcp.billing import GCP_RULES
from spotrun.states import Market

REGIONS = ("us-central1", "europe-west4")
REQUIRED = (["a3-highgpu-1g", "a3-highgpu-2g", "a3-highgpu-4g", "a3-highgpu-8g"]
            + [f"a2-highgpu-{n}g" for n in (1, 2, 4, 8)]
            + [f"a2-ultragpu-{n}g" for n in (1, 2, 4, 8)]
            + [f"g2-standard-{n}" for n in (4, 8, 12, 16, 24, 32, 48, 96)])
N1_GPUS = {"T4", "V100", "P100"}
N1_NAME = re.compile(r"(n1-[a-z]+-\d+)\+([a-z0-9]+)x(\d+)")


@pytest.fixture(scope="module")
def cat():
    return load_catalog("gcp")


def test_required_types_are_there_and_n1_has_t4_v100_p100(cat) -> None:
    missing = [n for n in REQUIRED if n not in cat]
    assert not missing, missing
    n1 = [t for t in cat.types.values() if t.name.startswith("n1-")]
    assert {t.gpu for t in n1} == N1_GPUS
    for t in n1:
        m = N1_NAME.fullmatch(t.name)
        assert m, t.name
        assert t.extra["machine_type"] == m.group(1) and t.extra["attach_accelerator"] is True
        assert t.extra["accelerator"] == f"nvidia-tesla-{m.group(2)}"
        assert t.gpus == t.extra["count"] == int(m.group(3))


def test_every_type_has_both_regions_prices_and_zones(cat) -> None:
    for t in cat.types.values():
        spot = t.extra["spot_usd_per_hour"]
        for region in REGIONS:
            od = t.od_usd_per_hour[region]
            assert od > 0 and 0 < spot[region] < od, (t.name, region)
            zones = t.extra["zones"][region]
            assert zones and all(z.startswith(region + "-") and region_of(z) == region
                                 for z in zones), (t.name, zones)
        # The snapshot pair is the two regions' spot prices, low first (CatalogPrices' form).
        assert list(t.spot_snapshot_usd_per_hour) == sorted(spot[r] for r in REGIONS), t.name
        assert t.extra["machine_type"] and t.extra["count"] == t.gpus
        assert t.extra["efa"] is False


def test_specs_scale_with_gpus_within_a_family(cat) -> None:
    # a2/a3 shapes are slices of one machine: vCPU, RAM and price per GPU are constant.
    for fam in ("a2-highgpu", "a2-ultragpu", "a3-highgpu"):
        one = cat.get(f"{fam}-1g")
        for n in (2, 4, 8):
            t = cat.get(f"{fam}-{n}g")
            assert (t.vcpus, t.ram_gib) == (one.vcpus * n, one.ram_gib * n), t.name
            for region in REGIONS:
                assert t.od_usd_per_hour[region] == pytest.approx(
                    one.od_usd_per_hour[region] * n, rel=1e-4), (t.name, region)
    assert cat.get("g2-standard-96").gpus == 8 and cat.get("g2-standard-32").gpus == 1


def test_spot_only_marks_exactly_the_small_a3_shapes(cat) -> None:
    marked = sorted(t.name for t in cat.types.values() if t.extra.get("spot_only"))
    assert marked == ["a3-highgpu-1g", "a3-highgpu-2g", "a3-highgpu-4g"]


def test_speed_interconnect_and_estimates(cat) -> None:
    speeds = cat.meta["gpu_speed"]
    ref = cat.meta["speed_estimate_rule"]
    aws = load_catalog("aws").meta["gpu_speed"]
    for t in cat.types.values():
        assert t.extra["interconnect"] in ("none", "pcie", "nvlink", "nvswitch"), t.name
        assert (t.extra["interconnect"] == "none") == (t.gpus == 1), t.name
        assert gpu_speed(cat, t, "bf16") > 0 and gpu_speed(cat, t, "fp32") > 0
    for gpu, row in speeds.items():
        assert row["basis"] in ("measured", "estimate") and row["source"], gpu
        if gpu in aws:   # the same chip keeps the AWS catalog's figure
            assert (row["amp"], row["fp32"]) == (aws[gpu]["amp"], aws[gpu]["fp32"]), gpu
        if row["basis"] == "estimate":
            x = row["estimate_inputs"]
            bw = x["mem_bw_gb_s"] / ref["mem_bw_gb_s"]
            assert row["amp"] == pytest.approx(math.sqrt(x["amp_tflops"] / ref["amp_tflops"]
                                                         * bw), abs=0.005), gpu
            assert row["fp32"] == pytest.approx(math.sqrt(x["fp32_tflops"] / ref["fp32_tflops"]
                                                          * bw), abs=0.005), gpu
    assert {t.gpu for t in cat.types.values()} == set(speeds)
    assert cat.get(cat.meta["reference_instance"]).gpu == "V100"


def test_billing_rules_per_second_minute_minimum_free_first_minute() -> None:
    spot, od = Market.SPOT, Market.ON_DEMAND
    assert GCP_RULES.provider == "gcp"
    # Preempted by GCE in its first minute: not billed; from the minute on: the seconds used.
    assert GCP_RULES.billed_seconds(59.9, market=spot, reclaimed_by_provider=True) == 0.0
    assert GCP_RULES.billed_seconds(60.0, market=spot, reclaimed_by_provider=True) == 60.0
    assert GCP_RULES.billed_seconds(3599.2, market=spot, reclaimed_by_provider=True) == 3600.0
    # No free first minute when we stop it, nor on demand: the 1-minute minimum.
    assert GCP_RULES.billed_seconds(30.0, market=spot, reclaimed_by_provider=False) == 60.0
    assert GCP_RULES.billed_seconds(10.0, market=od, reclaimed_by_provider=True) == 60.0
    assert GCP_RULES.billed_seconds(61.2, market=od, reclaimed_by_provider=False) == 62.0
    # Standard storage $0.020 per GiB-month; Class A $0.005 per 1,000; pd-balanced $0.10.
    assert GCP_RULES.storage_usd(1024 ** 3, 730 * 3600) == pytest.approx(0.020)
    assert GCP_RULES.put_requests_usd_per_1000 == 0.005
    assert GCP_RULES.volume_usd(100, 730 * 3600) == pytest.approx(10.0)


def test_zone_and_family_names_of_both_clouds() -> None:
    assert region_of("us-central1-a") == "us-central1"
    assert region_of("europe-west4-c") == "europe-west4"
    assert region_of("us-east-1f") == "us-east-1"
    assert family_of("a2-ultragpu-8g") == "a2" and family_of("n1-standard-8+t4x1") == "n1"
    assert family_of("p4de.24xlarge") == "p4de"


def test_gcp_priors_are_estimates_per_family_and_aws_keeps_its_traces(cat) -> None:
    data = packaged_priors(cat.meta["reclaim_priors"])
    assert set(data["families"]) == {"a2", "a3", "g2", "n1"}
    assert all(f["basis"] == "estimate" for f in data["families"].values())
    model = risk_model(cat)
    for t in cat.types.values():
        for region in REGIONS:
            zone = t.extra["zones"][region][0]
            p = model.prior(t.name, zone)
            assert p.source == "estimate", (t.name, zone, p.source)
            assert f"{family_of(t.name)} family" in p.detail
            assert p.mtbf_h == pytest.approx(3.64)
    # A zone the file does not list falls back to its region's row, not to "all".
    assert "in us-central1 pooled" in model.prior("g2-standard-4", "us-central1-f").detail
    # The AWS catalog still reads its generated trace file.
    assert risk_model(load_catalog("aws")).prior("p3.2xlarge", "us-east-1a").source == "trace"
    # The catalog's own zone priors resolve GCP zone names.
    priors = priors_from_catalog(cat)
    assert priors.zone("europe-west4-b").mtbf_h == pytest.approx(3.64)

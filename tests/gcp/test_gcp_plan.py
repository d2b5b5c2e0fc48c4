"""`spotrun plan` and `submit --dry-run` with `provider = "gcp"`: GCP's catalog, GCP's zones,
ranked by cost per unit of progress; nothing calls Google (prices are the catalog's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from spotrun.catalog import load_catalog
from spotrun.cli import cli

TOML = """provider = "gcp"
[gcp]
project = "my-project"
region = "{region}"
image = "projects/deeplearning-platform-release/global/images/family/common-cu124"
"""
SMALL = """name: small-gcp
command: python train.py
resources: {gpus: 1}
model: {params_billion: 0.5, precision: bf16}
work: {reference_hours: 10, reference_instance: n1-standard-8+v100x1}
policy: {market: spot}
"""
BIG = """name: big-gcp
command: torchrun --nproc-per-node=$SPOTRUN_GPUS train.py
resources: {gpus: 8}
model: {params_billion: 7, precision: bf16, optimizer: adamw, sharding: fsdp}
work: {reference_hours: 120, reference_instance: a2-highgpu-8g}
policy: {market: spot}
"""


def _home(tmp_path: Path, region: str = "us-central1") -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "spotrun.toml").write_text(TOML.format(region=region))
    (tmp_path / "small.yaml").write_text(SMALL)
    (tmp_path / "big.yaml").write_text(BIG)
    return home


def _plan(home: Path, *args: str) -> dict:
    res = CliRunner().invoke(cli, ["plan", "--json", *args],
                             env={"SPOTRUN_HOME": str(home), "COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


@pytest.mark.parametrize("offline", [False, True])
def test_a_one_gpu_job_gets_a_one_gpu_type_and_an_eight_gpu_job_an_eight_gpu_type(tmp_path,
                                                                                  offline):
    home = _home(tmp_path)
    flags = ["--offline"] if offline else []
    cat = load_catalog("gcp")
    small = _plan(home, str(tmp_path / "small.yaml"), *flags)
    big = _plan(home, str(tmp_path / "big.yaml"), *flags)
    for out in (small, big):
        assert out["candidates"], out
        assert all(c["instance_type"] in cat for c in out["candidates"])
        assert all(c["zone"].startswith("us-central1-") for c in out["candidates"])
        # Ranked by cost per unit of progress.
        ref_h = [c["usd_per_reference_hour"] for c in out["candidates"]]
        assert ref_h == sorted(ref_h)
    assert small["candidates"][0]["node_gpus"] == 1 == cat.get(
        small["candidates"][0]["instance_type"]).gpus
    top = big["candidates"][0]
    assert top["node_gpus"] == 8 and top["gpus_used"] == 8
    # Priced from GCP's catalog in the gcp region (Spot: the region's price list), live or not.
    row = cat.get(top["instance_type"])
    assert top["price_usd_per_hour"] == pytest.approx(
        row.extra["spot_usd_per_hour"]["us-central1"], rel=1e-4)


def test_a_zone_the_type_is_not_offered_in_has_no_candidate(tmp_path):
    # a2-ultragpu-1g is offered in us-central1-a and -c only (docs/gcp-facts.md).
    home = _home(tmp_path)
    spec = tmp_path / "ultra.yaml"
    spec.write_text(SMALL.replace("resources: {gpus: 1}",
                                  "resources: {gpus: 1, instance_types: [a2-ultragpu-1g]}"))
    out = _plan(home, str(spec))
    assert {c["zone"] for c in out["candidates"] if c["market"] == "spot"} == {
        "us-central1-a", "us-central1-c"}


def test_dry_run_prints_the_spot_vm_insert_and_launches_nothing(tmp_path):
    home = _home(tmp_path)
    res = CliRunner().invoke(cli, ["submit", "--dry-run", "--json", str(tmp_path / "small.yaml")],
                             env={"SPOTRUN_HOME": str(home), "COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    launch = json.loads(res.output)["launch"]
    first = launch["calls"][0]
    assert launch["provider"] == "gcp" and first["api"] == "compute.instances.insert"
    body = first["params"]["instanceResource"]
    assert body["scheduling"] == {"provisioningModel": "SPOT",
                                  "instanceTerminationAction": "DELETE",
                                  "onHostMaintenance": "TERMINATE", "automaticRestart": False}
    assert body["labels"]["spotrun_managed"] == "true"
    # The agent's config is not printed (it may name secrets' references).
    assert {i["value"] for i in body["metadata"]["items"]} >= {"<user data>"}


def test_an_unknown_type_for_gcp_is_refused_naming_the_field(tmp_path):
    home = _home(tmp_path)
    spec = tmp_path / "aws-type.yaml"
    spec.write_text(SMALL.replace("resources: {gpus: 1}",
                                  "resources: {gpus: 1, instance_types: [p3.2xlarge]}"))
    res = CliRunner().invoke(cli, ["plan", str(spec)], env={"SPOTRUN_HOME": str(home)})
    assert res.exit_code == 2 and "instance_types" in res.output and "Traceback" not in res.output


def test_plan_says_its_prices_are_the_catalogs_not_live(tmp_path):
    # GCP has no live spot price feed: the provider declares its prices are the catalog's,
    # and plan's header and JSON say so (it used to print `prices: live`).
    home = _home(tmp_path)
    res = CliRunner().invoke(cli, ["plan", str(tmp_path / "small.yaml")],
                             env={"SPOTRUN_HOME": str(home), "COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    header = res.output.splitlines()[0]
    assert "prices: catalog prices (GCP's Spot price list in gcp.yaml" in header, header
    assert "live" not in header.replace("no live feed", "")
    source = _plan(home, str(tmp_path / "small.yaml"))["prices"]
    assert source["summary"].startswith("catalog prices") and "live" != source["source"]


@pytest.mark.parametrize("verb", [["plan"], ["submit", "--dry-run"]])
def test_an_aws_reference_instance_names_the_gcp_catalog_and_valid_types(tmp_path, verb):
    # The AWS examples' reference_instance on a gcp set-up: the error says which catalog is
    # in use and offers types from it (it used to say only "must be an instance type in the
    # catalog").
    home = _home(tmp_path)
    spec = tmp_path / "aws-ref.yaml"
    spec.write_text(SMALL.replace("reference_instance: n1-standard-8+v100x1",
                                  "reference_instance: p3.2xlarge"))
    res = CliRunner().invoke(cli, [*verb, str(spec)], env={"SPOTRUN_HOME": str(home)})
    assert res.exit_code == 2 and "Traceback" not in res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: work.reference_instance:"), lines
    assert "'p3.2xlarge'" in lines[0] and "gcp provider's catalog (gcp.yaml)" in lines[0]
    offered = lines[0].split("e.g. ", 1)[1].split(", ")
    assert len(offered) >= 3 and all(name in load_catalog("gcp") for name in offered)
    # A near miss gets the closest names.
    spec.write_text(SMALL.replace("n1-standard-8+v100x1", "n1-standard-8+v100"))
    res = CliRunner().invoke(cli, [*verb, str(spec)], env={"SPOTRUN_HOME": str(home)})
    assert res.exit_code == 2 and "closest: n1-standard-8+v100x1" in res.output

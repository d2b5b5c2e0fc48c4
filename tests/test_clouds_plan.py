"""Several clouds in one daemon, as docs/clouds.md tells a user to set it up: settings, a job's
`resources.clouds`, and `plan` ranking both clouds with the move of the checkpoint priced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from spotrun.cli import cli

REPO = Path(__file__).resolve().parents[1]
ONE_GPU = REPO / "configs" / "jobs" / "small-finetune-1gpu.yaml"
EIGHT_GPU = REPO / "configs" / "jobs" / "llama-3b-sft-8gpu.yaml"

TWO_CLOUDS = """\
providers = ["aws", "gcp"]
[aws]
store_uri = "s3://team-ckpt/spotrun"
[gcp]
project = "my-project"
store_uri = "gs://team-ckpt/spotrun"
"""


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "spotrun.toml").write_text(TWO_CLOUDS)
    return tmp_path


def run(home: Path, *args: str):
    """The CLI as a user runs it (catalog prices: no cloud is called)."""
    return CliRunner().invoke(cli, list(args), env={"SPOTRUN_HOME": str(home), "COLUMNS": "200"})


def plan_json(home: Path, spec: Path, *extra: str) -> dict:
    res = run(home, "plan", "--offline", "--json", str(spec), *extra)
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def spec_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(body)
    return path


@pytest.mark.parametrize("spec", [ONE_GPU, EIGHT_GPU], ids=["1-gpu", "8-gpu"])
def test_plan_ranks_the_candidates_of_both_clouds_with_egress_and_copy_columns(home, spec):
    out = plan_json(home, spec)
    rows = out["candidates"]
    assert {r["cloud"] for r in rows} == {"aws", "gcp"}
    assert all({"egress_usd", "transfer_s"} <= set(r) for r in rows)
    # A new job has no checkpoint: nothing to move for its first attempt.
    assert all(r["egress_usd"] == 0 and r["transfer_s"] == 0 for r in rows)
    # One order for both clouds: the launch list is the cheapest progress first, and it
    # tries one cloud (the checkpoint is copied before a launch, once).
    launch = [r for r in rows if r["launch"]]
    assert len({r["cloud"] for r in launch}) == 1
    table = run(home, "plan", "--offline", str(spec), "--top", "0")
    assert table.exit_code == 0, table.output
    header = next(line for line in table.output.splitlines() if line.startswith("┃"))
    assert "cloud" in header and "egress $" in header and "copy" in header


def test_a_resumed_attempt_moves_for_a_small_checkpoint_and_stays_for_a_large_one(home,
                                                                                  tmp_path):
    # The g2 (L4) of GCP against the g6 (L4) of AWS: the same chip, GCP's spot price lower in
    # the packaged catalogs; restricted to the two types so the gap is the price alone.
    spec = spec_file(tmp_path, "name: l4-job\ncommand: python train.py\n"
                     "resources: {gpus: 1, instance_types: [g6.xlarge, g2-standard-8]}\n"
                     "work: {reference_hours: 20, reference_instance: g6.xlarge}\n"
                     "policy: {market: spot}\n")
    fresh = plan_json(home, spec)
    first = fresh["candidates"][0]
    cheap, other = first["cloud"], {"aws": "gcp", "gcp": "aws"}[first["cloud"]]
    # A checkpoint of 1 GB in the other cloud: the move costs cents and the job moves.
    small = plan_json(home, spec, "--resume-from", other, "--checkpoint-gb", "1")
    assert small["candidates"][0]["cloud"] == cheap
    rate = {"aws": 0.09, "gcp": 0.12 * 1e9 / 2**30}[other]   # $ per 10^9 bytes
    assert small["candidates"][0]["egress_usd"] == pytest.approx(1 * rate, rel=1e-3)
    assert small["candidates"][0]["transfer_s"] == pytest.approx(1e9 / 50e6, rel=1e-3)
    # 5 TB: the egress ($450 or more) outweighs the whole price gap of 20 reference-hours,
    # so the job stays in the cloud that holds its checkpoint.
    large = plan_json(home, spec, "--resume-from", other, "--checkpoint-gb", "5000")
    best = large["candidates"][0]
    assert best["cloud"] == other and best["egress_usd"] == 0
    moved = next(r for r in large["candidates"] if r["cloud"] == cheap)
    assert moved["egress_usd"] == pytest.approx(5000 * rate, rel=1e-3)
    gap_usd = min(r["expected_usd"] for r in fresh["candidates"] if r["cloud"] == other) - min(
        r["expected_usd"] for r in fresh["candidates"] if r["cloud"] == cheap)
    assert 0 < gap_usd < moved["egress_usd"]


def test_a_job_restricted_to_one_cloud_is_planned_there_only(home, tmp_path):
    spec = spec_file(tmp_path, "name: gcp-only\ncommand: python train.py\n"
                     "resources: {gpus: 1, clouds: [gcp]}\npolicy: {market: spot}\n")
    out = plan_json(home, spec, "--resume-from", "aws", "--checkpoint-gb", "1")
    assert {r["cloud"] for r in out["candidates"]} == {"gcp"}


def test_a_job_naming_a_cloud_not_configured_is_refused_at_submit(home, tmp_path):
    spec = spec_file(tmp_path, "name: elsewhere\ncommand: python train.py\n"
                     "resources: {gpus: 1, clouds: [azure]}\n")
    res = run(home, "submit", str(spec))
    assert res.exit_code == 2, res.output
    assert "resources.clouds" in res.output and "azure" in res.output
    assert "aws, gcp" in res.output and "Traceback" not in res.output
    assert not (home / "spotrun.db").exists()


@pytest.mark.parametrize("toml,key", [
    ('providers = ["aws", "aws"]\n', "providers"),
    ('providers = ["aws", "azure"]\n', "providers"),
    ('providers = ["local", "aws"]\n', "providers"),
    ('providers = ["aws", "gcp"]\nprovider = "local"\n', "provider"),
    ('providers = ["aws", "gcp"]\n[aws]\nstore_uri = "s3://b/p"\n', "gcp.store_uri"),
    ('providers = ["aws", "gcp"]\n[aws]\nstore_uri = "s3://b/p"\n[gcp]\nstore_uri = "s3://b/q"\n',
     "gcp.store_uri"),
])
def test_bad_cloud_settings_name_their_key(tmp_path, toml, key):
    (tmp_path / "spotrun.toml").write_text(toml)
    spec = spec_file(tmp_path, "name: j\ncommand: python train.py\n")
    res = run(tmp_path, "plan", "--offline", str(spec))
    assert res.exit_code == 2, res.output
    assert res.output.startswith(f"error: {key}") or f"{key}:" in res.output, res.output
    assert "Traceback" not in res.output


def test_resume_from_needs_its_size_and_a_configured_cloud(home):
    res = run(home, "plan", "--offline", str(ONE_GPU), "--resume-from", "aws")
    assert res.exit_code == 2 and "--checkpoint-gb" in res.output
    res = run(home, "plan", "--offline", str(ONE_GPU), "--resume-from", "azure",
              "--checkpoint-gb", "3")
    assert res.exit_code == 2 and "--resume-from" in res.output and "aws, gcp" in res.output

"""Job spec validation: every field's bad input exits 2 with one short message, writing nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from spotrun.catalog import load_catalog
from spotrun.cli import cli
from spotrun.errors import SpecError
from spotrun.spec import parse_spec, spec_from_dict

ZONES = ["us-east-1a", "us-east-1c"]
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def parse(raw, base_dir: Path = Path("/")):
    return parse_spec(raw, base_dir=base_dir, instance_types=load_catalog().names(), zones=ZONES,
                      now=NOW)


def good() -> dict:
    return {"name": "llama-3b-sft", "command": "python train.py"}


def full(tmp_path: Path) -> dict:
    (tmp_path / "code").mkdir()
    return {
        "name": "llama-3b-sft", "command": "torchrun train.py", "workdir": "code",
        "env": {"WANDB_MODE": "offline"}, "secrets": {"HF_TOKEN": "ssm:/team/hf-token"},
        "resources": {"gpus": 8, "nodes": 1, "gpu_memory_gb": 40,
                      "instance_types": ["p4d.24xlarge", "p3dn.24xlarge"], "zones": ["us-east-1a"]},
        "model": {"params_billion": 3, "precision": "bf16", "optimizer": "adamw",
                  "sharding": "none"},
        "work": {"reference_hours": 48, "reference_instance": "p3.2xlarge", "total_steps": 1000},
        "checkpoint": {"uri": "s3://bucket/prefix", "interval_minutes": "auto", "keep": 3},
        "policy": {"market": "auto", "deadline_hours": 72, "budget_usd": 500,
                   "max_price_usd_per_hour": 12.0, "max_restarts_on_error": 3},
    }


def test_full_spec_parses_and_round_trips(tmp_path):
    spec = parse(full(tmp_path), tmp_path)
    assert spec.resources.gpus == 8 and spec.resources.instance_types == ("p4d.24xlarge",
                                                                          "p3dn.24xlarge")
    assert spec.policy.deadline == (NOW + timedelta(hours=72)).isoformat()
    assert spec.checkpoint.interval_minutes is None  # auto
    assert spec.workdir == str((tmp_path / "code").resolve())
    assert spec_from_dict(spec.to_dict()) == spec


def test_defaults():
    spec = parse(good())
    assert (spec.resources.gpus, spec.resources.nodes, spec.checkpoint.keep,
            spec.policy.max_restarts_on_error, spec.model.precision) == (1, 1, 3, 3, "bf16")
    assert spec.policy.market.value == "auto" and spec.env == {} and spec.secrets == {}


def _with(path: str, value, base: dict | None = None) -> dict:
    raw = yaml.safe_load(yaml.safe_dump(base or good()))
    node = raw
    parts = path.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    if value is _DELETE:
        node.pop(parts[-1], None)
    else:
        node[parts[-1]] = value
    return raw


class _Deleted:
    """The field is removed (a stable repr: test ids must match across xdist workers)."""

    def __repr__(self) -> str:
        return "<deleted>"


_DELETE = _Deleted()

BAD = [
    ("name", _DELETE, "name"),
    ("name", "Bad_Name", "name"),
    ("name", "-leading", "name"),
    ("name", "x" * 64, "name"),
    ("name", 5, "name"),
    ("command", _DELETE, "command"),
    ("command", "   ", "command"),
    ("command", ["python"], "command"),
    ("workdir", "does-not-exist", "workdir"),
    ("env", ["A"], "env"),
    ("env", {"1BAD": "x"}, "env.1BAD"),
    ("env", {"OK": {"nested": 1}}, "env.OK"),
    ("env", {"A": 3}, "env.A"),                 # values are strings: quote numbers
    ("env", {"A": True}, "env.A"),
    ("secrets", {"TOKEN": "plain-value"}, "secrets.TOKEN"),
    ("secrets", {"TOKEN": "vault:x"}, "secrets.TOKEN"),
    ("resources", "8 gpus", "resources"),
    ("resources.gpus", 0, "resources.gpus"),
    ("resources.gpus", 65, "resources.gpus"),
    ("resources.gpus", 1.5, "resources.gpus"),
    ("resources.gpus", True, "resources.gpus"),
    ("resources.nodes", 0, "resources.nodes"),
    ("resources.nodes", 65, "resources.nodes"),
    ("resources.nodes", "2-1", "resources.nodes"),
    ("resources.nodes", "0-2", "resources.nodes"),
    ("resources.nodes", "two", "resources.nodes"),
    ("resources.gpu_memory_gb", 0, "resources.gpu_memory_gb"),
    ("resources.gpu_memory_gb", "40GB", "resources.gpu_memory_gb"),
    ("resources.instance_types", ["p9.huge"], "resources.instance_types[0]"),
    ("resources.instance_types", "p4d.24xlarge", "resources.instance_types"),
    ("resources.zones", ["mars-1a"], "resources.zones[0]"),
    ("resources.cpus", 4, "resources.cpus"),
    ("model.params_billion", -1, "model.params_billion"),
    ("model.precision", "int4", "model.precision"),
    ("model.optimizer", "rmsprop", "model.optimizer"),
    ("model.sharding", "zero3", "model.sharding"),
    ("model.extra", 1, "model.extra"),
    ("work.total_steps", 0, "work.total_steps"),
    ("work.reference_hours", 0, "work.reference_hours"),
    ("work.reference_hours", 10, "work.reference_instance"),
    ("work.reference_instance", "p9.huge", "work.reference_instance"),
    ("checkpoint.uri", "http://x/y", "checkpoint.uri"),
    ("checkpoint.uri", "file://relative/path", "checkpoint.uri"),
    ("checkpoint.uri", "s3://bucket/../other", "checkpoint.uri"),
    ("checkpoint.interval_minutes", 0, "checkpoint.interval_minutes"),
    ("checkpoint.interval_minutes", "often", "checkpoint.interval_minutes"),
    ("checkpoint.keep", 0, "checkpoint.keep"),
    ("policy.market", "cheap", "policy.market"),
    ("policy.deadline", "2020-01-01T00:00:00Z", "policy.deadline"),
    ("policy.deadline", "next tuesday", "policy.deadline"),
    ("policy.deadline_hours", -3, "policy.deadline_hours"),
    ("policy.budget_usd", 0, "policy.budget_usd"),
    ("policy.max_price_usd_per_hour", "12", "policy.max_price_usd_per_hour"),
    ("policy.max_restarts_on_error", 101, "policy.max_restarts_on_error"),
    ("policy.max_restarts_on_error", -1, "policy.max_restarts_on_error"),
    ("unknown_top", 1, "unknown_top"),
]


@pytest.mark.parametrize("path,value,field", BAD, ids=[f"{p}={v!r}"[:40] for p, v, _ in BAD])
def test_bad_field_names_the_field(path, value, field):
    base = _with("model", {"params_billion": 1}) if path.startswith("model.") else None
    with pytest.raises(SpecError) as info:
        parse(_with(path, value, base))
    assert info.value.field == field
    assert field in str(info.value)
    assert len(str(info.value)) < 500


def test_deadline_and_deadline_hours_conflict():
    raw = _with("policy.deadline_hours", 5, _with("policy.deadline", "2030-01-01T00:00:00Z"))
    with pytest.raises(SpecError) as info:
        parse(raw)
    assert info.value.field == "policy.deadline"


def test_model_without_params_is_an_error():
    with pytest.raises(SpecError) as info:
        parse(_with("model", {"precision": "bf16"}))
    assert info.value.field == "model.params_billion"


def test_secret_value_is_not_echoed():
    with pytest.raises(SpecError) as info:
        parse(_with("secrets", {"TOKEN": "hunter2-super-secret"}))
    assert "hunter2" not in str(info.value)


# ------------------------------------------------------------ through the CLI

BAD_FILES = [
    ("missing", None, "file"),
    ("binary", b"\xff\xfe\x00name: x", "file"),
    ("not-yaml", b"name: [unclosed", "file"),
    ("not-mapping", b"- a\n- b\n", "spec"),
    ("empty", b"", "spec"),
    ("bad-gpus", b"name: a\ncommand: x\nresources: {gpus: 100}\n", "resources.gpus"),
    ("unknown-key", b"name: a\ncommand: x\nfoo: 1\n", "foo"),
]


@pytest.mark.parametrize("label,content,field", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_cli_bad_input_exits_2_and_writes_nothing(tmp_path, monkeypatch, label, content, field):
    home = tmp_path / "home"
    monkeypatch.setenv("SPOTRUN_HOME", str(home))
    spec = tmp_path / "job.yaml"
    if content is not None:
        spec.write_bytes(content)
    result = CliRunner().invoke(cli, ["submit", str(spec)])
    assert result.exit_code == 2, result.output
    err = result.stderr if hasattr(result, "stderr") else result.output
    assert err.startswith("error: ") and field in err and len(err) < 500
    assert "Traceback" not in result.output
    assert not home.exists() or not any(home.rglob("*")), list(home.rglob("*"))


def test_broken_yaml_names_its_line(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTRUN_HOME", str(tmp_path / "home"))
    spec = tmp_path / "job.yaml"
    spec.write_text("name: a\ncommand: python train.py\nenv: {A: 1\nwork: {total_steps: 10}\n")
    result = CliRunner().invoke(cli, ["submit", str(spec)])
    assert result.exit_code == 2
    assert "not valid YAML at line 4" in result.output, result.output


def test_cli_submit_good_spec_writes_job(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("SPOTRUN_HOME", str(home))
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('hi')\n")
    spec = tmp_path / "job.yaml"
    spec.write_text("name: tiny\ncommand: python train.py\nworkdir: code\n")
    result = CliRunner().invoke(cli, ["submit", str(spec)])
    assert result.exit_code == 0, result.output
    job_id = result.stdout.strip()
    assert job_id.startswith("tiny-")
    out = CliRunner().invoke(cli, ["status", "--json"])
    import json
    jobs = json.loads(out.output)
    assert [(j["id"], j["state"], j["attempts"]) for j in jobs] == [(job_id, "queued", [])]
    assert (home / "store" / "jobs" / job_id / "bundle.tar.gz").is_file()


def test_real_process_exit_code_and_no_traceback(tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text("name: a\ncommand: x\npolicy: {market: cheap}\n")
    env = dict(os.environ, SPOTRUN_HOME=str(tmp_path / "home"))
    p = subprocess.run([sys.executable, "-m", "spotrun", "submit", str(spec)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.startswith("error: policy.market") and "Traceback" not in p.stderr
    assert not (tmp_path / "home").exists()


def test_env_number_error_says_to_quote_and_workdir_error_echoes_the_path(tmp_path: Path):
    cat_types, zones = ["p3.2xlarge"], ["us-east-1a"]
    with pytest.raises(SpecError) as err:
        parse_spec({"name": "a", "command": "x", "env": {"A": 3}}, base_dir=tmp_path,
                   instance_types=cat_types, zones=zones)
    assert "quote it: A: '3'" in str(err.value)
    (tmp_path / "afile").write_text("")
    with pytest.raises(SpecError) as err:
        parse_spec({"name": "a", "command": "x", "workdir": "afile"}, base_dir=tmp_path,
                   instance_types=cat_types, zones=zones)
    assert str((tmp_path / "afile").resolve()) in str(err.value) and "a file" in str(err.value)


# ------------------------------------------------------------ stored form (pydantic contracts)

# What the hand-written `to_dict` (before pydantic) wrote to jobs.spec_json for a full spec.
OLD_STORED = {
    "checkpoint": {"interval_minutes": 30.0, "keep": 3, "uri": "s3://bucket/prefix"},
    "command": "torchrun train.py", "env": {"WANDB_MODE": "offline"},
    "model": {"optimizer": "adamw", "params_billion": 3.0, "precision": "bf16",
              "sharding": "none"},
    "name": "llama-3b-sft", "outputs": ["out/*.pt"],
    "policy": {"budget_usd": 500.0, "deadline": "2026-01-04T00:00:00+00:00", "market": "auto",
               "max_price_usd_per_hour": 12.0, "max_restarts_on_error": 3},
    "resources": {"gpu_memory_gb": 40.0, "gpus": 2, "gpus_max": 8,
                  "instance_types": ["p4d.24xlarge", "p3dn.24xlarge"], "nodes": 1,
                  "nodes_min": None, "zones": ["us-east-1a"]},
    "secrets": {"HF_TOKEN": "ssm:/team/hf-token"},
    "work": {"reference_hours": 48.0, "reference_instance": "p3.2xlarge",
             "scaling": [[1, 1.0], [8, 6.5]], "total_steps": 1000},
    "workdir": "/tmp/tmplxywkfou/code",
}


def test_old_stored_spec_loads_to_the_same_spec_and_writes_the_same_form(tmp_path):
    raw = full(tmp_path)
    raw["resources"]["gpus"] = "2-8"
    raw["work"]["scaling"] = {8: 6.5, 1: 1.0}
    raw["outputs"] = ["out/*.pt"]
    raw["checkpoint"]["interval_minutes"] = 30
    spec = parse(raw, tmp_path)
    stored = json.loads(json.dumps(OLD_STORED))
    stored["workdir"] = spec.workdir
    assert spec_from_dict(stored) == spec
    assert json.loads(json.dumps(spec.to_dict())) == stored


def test_stored_spec_skips_submit_time_checks():
    """A stored deadline may be past and a type may have left the catalog: it still loads."""
    stored = json.loads(json.dumps(OLD_STORED))
    stored["policy"]["deadline"] = "2001-01-01T00:00:00+00:00"
    stored["resources"]["instance_types"] = ["gone.huge"]
    spec = spec_from_dict(stored)
    assert spec.policy.deadline == "2001-01-01T00:00:00+00:00"
    assert spec.resources.instance_types == ("gone.huge",)


@pytest.mark.parametrize("path,value,field,says", [
    ("resources.gpus_max", 8, "resources.gpus_max", "allowed here: clouds, gpu_memory_gb, gpus"),
    ("work.scaling", {1: 1.0, 8: -2}, "work.scaling", "speedup > 0"),
    ("work.scaling", [[1, 1.0]], "work.scaling", "a mapping"),
    ("resources.instance_types", ["p3.2xlarge", 3], "resources.instance_types",
     "a list of strings"),
    ("policy.deadline_hours", float("inf"), "policy.deadline_hours", "a number > 0"),
    ("resources", None, None, None),
])
def test_more_bad_fields_say_what_is_allowed(path, value, field, says):
    if field is None:   # an empty section is the defaults
        assert parse(_with(path, value)).resources.gpus == 1
        return
    with pytest.raises(SpecError) as info:
        parse(_with(path, value))
    assert info.value.field == field and says in str(info.value)
    assert "\n" not in str(info.value)


def test_multi_node_counts_and_elastic_ranges_are_accepted():
    assert parse(_with("resources.nodes", 2)).resources.nodes == 2
    elastic = parse(_with("resources.nodes", "1-2")).resources
    assert (elastic.nodes, elastic.nodes_min, elastic.min_nodes) == (2, 1, 1)
    assert parse(_with("resources.nodes", 64)).resources.nodes == 64

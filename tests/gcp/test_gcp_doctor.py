"""`spotrun doctor` on gcp, against the fake Compute Engine: settings, credentials, the API and
the region's Spot GPU quota, one line each; exit 1 when one needs a fix."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from spotrun.cli import cli

from .gce_fixtures import IMAGE, gce  # noqa: F401  (fixture)


def _doctor(home: Path, fake, **gcp: str):
    fields = {"project": fake.state.project, "region": fake.state.region, "image": IMAGE,
              "endpoint_url": fake.url, **gcp}
    body = "\n".join(f'{k} = "{v}"' for k, v in fields.items())
    (home / "spotrun.toml").write_text(f'provider = "gcp"\n[gcp]\n{body}\n')
    res = CliRunner().invoke(cli, ["doctor", "--json"], env={"SPOTRUN_HOME": str(home)})
    return res.exit_code, json.loads(res.output)


def test_a_ready_project_passes_every_check(gce, tmp_path):  # noqa: F811
    code, out = _doctor(tmp_path, gce)
    checks = {c["name"]: c for c in out["checks"]}
    assert code == 0 and out["provider"] == "gcp"
    assert {n: c["status"] for n, c in checks.items() if n != "database"} == {
        "settings": "ok", "credentials": "ok", "compute api": "ok", "spot gpu quota": "ok"}
    assert "A100 16" in checks["spot gpu quota"]["detail"]


def test_missing_image_and_an_unknown_region_need_a_fix(gce, tmp_path):  # noqa: F811
    code, out = _doctor(tmp_path, gce, image="")
    settings = next(c for c in out["checks"] if c["name"] == "settings")
    assert code == 1 and settings["status"] == "fix" and "image" in settings["detail"]
    code, out = _doctor(tmp_path, gce, region="mars-north1")
    by = {c["name"]: c for c in out["checks"]}
    assert code == 1 and by["settings"]["status"] == "fix" and "zones" in by["settings"]["detail"]
    # The API answers, but the fake has no such region: the quota cannot be read.
    assert by["spot gpu quota"]["status"] == "could-not-check"


def test_the_table_fits_a_pipe_and_wraps_long_details(gce, tmp_path, monkeypatch):  # noqa: F811
    # Piped (no terminal, no COLUMNS): 80 columns, as every spotrun table. A long detail wraps
    # inside its cell, whole; the table used to be drawn 160 wide whatever the output.
    monkeypatch.delenv("COLUMNS", raising=False)
    code, out = _doctor(tmp_path, gce, image="", region="mars-north1")
    res = CliRunner().invoke(cli, ["doctor"], env={"SPOTRUN_HOME": str(tmp_path)})
    assert res.exit_code == code == 1 and "Traceback" not in res.output
    # The database's line stays one line, whatever its path (operations.md greps it).
    lines = res.output.splitlines()
    assert lines[0].startswith("database ")
    assert max(len(line) for line in lines[1:]) <= 80, res.output
    # Each check's detail, read back from its cell's lines, is the whole detail.
    shown: dict[str, str] = {}
    name = ""
    for line in lines[1:]:
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if len(cells) == 3:
            name = cells[0] or name
            shown[name] = shown.get(name, "") + cells[2]
    squeeze = "".join
    assert {n: squeeze(d.split()) for n, d in shown.items()} == {
        c["name"]: squeeze(c["detail"].split()) for c in out["checks"] if c["name"] != "database"}
    assert max(len(c["detail"]) for c in out["checks"]) > 80      # something had to wrap

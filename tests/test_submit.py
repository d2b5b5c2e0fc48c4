"""`spotrun submit`: --dry-run prints the ranked plan and the provider's calls, writing nothing."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from spotrun.cli import cli

REPO = Path(__file__).resolve().parent.parent


def test_dry_run_writes_nothing_and_shows_the_launch(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("SPOTRUN_HOME", str(home))
    result = CliRunner().invoke(cli, ["submit", "--dry-run", "--json",
                                      str(REPO / "configs" / "demo" / "job.yaml")])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    zones = [c["zone"] for c in plan["candidates"]]
    assert zones and set(zones) <= {"us-east-1a", "us-east-1c", "us-east-1d", "us-east-1f"}
    assert [c["market"] for c in plan["candidates"]] == ["spot"] * len(zones)  # market: spot
    ranks = [c["usd_per_reference_hour"] for c in plan["candidates"]]
    assert ranks == sorted(ranks)
    launch = plan["launch"]
    assert launch["provider"] == "local" and launch["request"]["user_data"].startswith("<")
    assert launch["request"]["candidates"][0] == f"p3.2xlarge/{zones[0]}/spot"
    assert not home.exists()  # no database, no store, no market started


def test_dry_run_table(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTRUN_HOME", str(tmp_path / "home"))
    result = CliRunner().invoke(cli, ["submit", "--dry-run",
                                      str(REPO / "configs" / "demo" / "job.yaml")])
    assert result.exit_code == 0, result.output
    assert "nothing was written" in result.output and "p3.2xlarge" in result.output


def test_unknown_zone_for_the_local_market_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTRUN_HOME", str(tmp_path / "home"))
    spec = tmp_path / "job.yaml"
    spec.write_text("name: a\ncommand: x\nresources: {zones: [eu-west-1a]}\n")
    result = CliRunner().invoke(cli, ["submit", str(spec)])
    assert result.exit_code == 2
    assert "resources.zones[0]" in result.output and "us-east-1a" in result.output


def test_dry_run_of_a_two_node_job_plans_one_group_in_one_pool(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTRUN_HOME", str(tmp_path / "home"))
    spec = tmp_path / "job.yaml"
    spec.write_text("name: mn\ncommand: x\nresources: {nodes: 2}\npolicy: {market: spot}\n")
    result = CliRunner().invoke(cli, ["submit", "--dry-run", "--json", str(spec)])
    assert result.exit_code == 0, result.output
    launch = json.loads(result.output)["launch"]
    assert launch["request"]["count"] == 2 and launch["request"]["node_ranks"] == [0, 1]
    bodies = [c["body"] for c in launch["calls"]]
    assert [b["client_token"] for b in bodies] == ["<dry-run>-0", "<dry-run>-1"]
    assert [b["tags"]["spotrun:node"] for b in bodies] == ["0", "1"]
    assert len({json.dumps(b["candidates"]) for b in bodies}) == 1
    assert len(bodies[0]["candidates"]) == 1
    assert not (tmp_path / "home").exists()


def test_dry_run_table_of_a_two_node_job_shows_nodes_and_totals_at_80_columns(tmp_path,
                                                                            monkeypatch):
    monkeypatch.setenv("SPOTRUN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "80")
    spec = tmp_path / "job.yaml"
    spec.write_text("name: mn\ncommand: x\nresources: {nodes: 2}\npolicy: {market: spot}\n")
    result = CliRunner().invoke(cli, ["submit", "--dry-run", str(spec)])
    assert result.exit_code == 0, result.output
    first = next(line for line in result.output.splitlines() if line.startswith("│ 1 "))
    cells = [c.strip() for c in first.strip("│").split("│")]
    per_node = float(cells[5].split(" x2 = ")[0])
    assert cells[4] == "2x1/1" and float(cells[5].split(" = ")[1]) == round(per_node * 2, 2)
    assert "…" not in result.output    # whole cells; what does not fit is a dropped column

"""`spotrun simulate` with pools in two clouds, as docs/simulate.md ("Several clouds") tells it.

Market: ten-minute rows. AWS has one pool `z1` at $1/h with an outage at rows 30-59; GCP
has one pool, also named `z1`, at $2/h, always up; on-demand is $3/h in both. The job: 8 h
of work (48 rows), 12 h to its deadline (72 rows), a changeover of one row, started at row
20, run by `greedy` (the cheapest pool up, kept until reclaimed; otherwise wait, on-demand
when the safety net says so). Every figure below follows from the model's rules by hand:

- AWS alone: 10 rows on z1 (one of them changeover) at $1, the reclaim at row 30 (lost,
  unpaid), waiting while the slack allows, then on-demand for the changeover and the 39 rows
  of work left at $3: (10 x 1 + 40 x 3) / 6 = $21.67.
- GCP alone: 49 rows at $2: $16.33.
- Across clouds, moves free: AWS first (cheaper), GCP after the reclaim at row 31:
  (10 x 1 + 40 x 2) / 6 = $15.00, 8.2 % below GCP alone, one move.
- 50 GB: the move pays AWS's egress, 50 x $0.09 = $4.50, and its changeover is longer by the
  copy, 50 GB at 50 MB/s = 1000 s = 2 rows: (10 x 1 + 42 x 2) / 6 + 4.50 = $20.17.
- 500 GB: $45 of egress and 17 rows of copy do not pay for the 6.5 h of work left (the move
  would cost $9.8/h there against $3/h on-demand at home), so the job stays on AWS: $21.67,
  no egress, no move.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import write_prices, write_trace

from spotrun.cli import cli

TICK_S = 600.0
ROWS = 200
AWS = [1] * 30 + [0] * 30 + [1] * (ROWS - 60)
GCP = [1] * ROWS


@pytest.fixture
def clouds(tmp_path: Path) -> dict[str, Path]:
    """The two clouds' traces and price files (both name their one pool `z1`)."""
    return {"aws": write_trace(tmp_path / "aws.csv", {"z1": AWS}, tick_s=TICK_S),
            "gcp": write_trace(tmp_path / "gcp.csv", {"z1": GCP}, tick_s=TICK_S),
            "aws_prices": write_prices(tmp_path / "aws_prices.csv", [("z1", 0, 1.0)]),
            "gcp_prices": write_prices(tmp_path / "gcp_prices.csv", [("z1", 0, 2.0)])}


def invoke(*args: str):
    return CliRunner().invoke(cli, ["simulate", *args], catch_exceptions=False)


JOB = ["--work-hours", "8", "--deadline-hours", "12", "--changeover-hours", "0.2",
       "--t0", "20", "--workers", "1"]


def two_clouds(f: dict[str, Path], *extra: str) -> list[str]:
    """The arguments of a run over both clouds with their own prices, on-demand $3/h."""
    return ["--trace", f"aws={f['aws']}", "--trace", f"gcp={f['gcp']}",
            "--prices", f"aws={f['aws_prices']}", "--prices", f"gcp={f['gcp_prices']}",
            "--od-price", "3", *JOB, *extra]


def greedy_json(f: dict[str, Path], *extra: str) -> dict:
    """`greedy` across both clouds, as --json reports it."""
    res = invoke(*two_clouds(f, "--policy", "greedy", "--json", *extra))
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_across_clouds_beats_each_cloud_alone_when_moves_are_free(clouds):
    out = greedy_json(clouds)
    g = out["policies"]["greedy"]
    assert g["mean_cost_alone_usd"] == {"aws": pytest.approx(130 / 6, abs=1e-4),
                                        "gcp": pytest.approx(98 / 6, abs=1e-4)}
    assert g["mean_cost_usd"] == pytest.approx(90 / 6, abs=1e-4)
    assert g["best_single_cloud"] == "gcp"
    assert g["saving_vs_best_single_cloud_pct"] == pytest.approx(100 * (1 - 90 / 98), abs=1e-3)
    assert g["moves_per_run"] == 1 and g["mean_egress_usd"] == 0
    assert g["deadline_met_fraction"] == 1.0
    # the columns of the two clouds do not clash
    assert out["model"]["pools"] == ["aws:z1", "gcp:z1"]
    assert out["model"]["checkpoint_gb"] == 0 and out["model"]["copy_ticks"] == 0
    assert out["alone"]["gcp"]["greedy"]["mean_cost_usd"] == pytest.approx(98 / 6, abs=1e-4)


def test_a_checkpoint_pays_the_egress_and_the_copy_of_its_move(clouds, tmp_path):
    decisions = tmp_path / "decisions.csv"
    out = greedy_json(clouds, "--checkpoint-gb", "50", "--decisions", str(decisions))
    g = out["policies"]["greedy"]
    assert g["mean_egress_usd"] == pytest.approx(4.5)
    assert g["mean_cost_usd"] == pytest.approx(94 / 6 + 4.5, abs=1e-4)
    assert g["moves_per_run"] == 1 and g["deadline_met_fraction"] == 1.0
    assert out["model"]["copy_ticks"] == 2
    assert out["model"]["clouds"]["aws"]["egress_usd_per_move"] == pytest.approx(4.5)
    # GCP bills per GiB: 50e9 bytes / 2^30 x $0.12
    assert out["model"]["clouds"]["gcp"]["egress_usd_per_move"] == pytest.approx(5.5879, abs=1e-4)
    # The across-clouds run's decisions: aws:z1 until the reclaim, then gcp:z1 to the end.
    with decisions.open() as fh:
        rows = [(int(r["tick"]), r["mode"], r["pool"]) for r in csv.DictReader(fh)]
    assert rows[:10] == [(t, "spot", "aws:z1") for t in range(20, 30)]
    assert rows[10] == (30, "idle", "")
    assert rows[11:] == [(t, "spot", "gcp:z1") for t in range(31, 31 + 42)]


def test_a_large_checkpoint_makes_the_job_stay_in_its_cloud(clouds):
    out = greedy_json(clouds, "--checkpoint-gb", "500")
    g = out["policies"]["greedy"]
    assert g["moves_per_run"] == 0 and g["mean_egress_usd"] == 0
    assert g["mean_cost_usd"] == pytest.approx(130 / 6, abs=1e-4)     # AWS alone's cost
    assert g["mean_cost_usd"] == g["mean_cost_alone_usd"]["aws"]
    # so across clouds is now dearer than GCP alone: the saving is negative
    assert g["saving_vs_best_single_cloud_pct"] == pytest.approx(100 * (1 - 130 / 98), abs=1e-3)
    assert g["deadline_met_fraction"] == 1.0
    assert out["model"]["copy_ticks"] == 17


def test_a_move_whose_copy_does_not_fit_the_slack_is_not_made(clouds):
    # A 9 h deadline leaves 3 rows of slack at row 31: enough for a launch's changeover and
    # a reclaim (2), not for the 2 rows of copy on top. Free, the job moves; with 50 GB it
    # waits and finishes on on-demand at home, as AWS alone does.
    nine = ["--deadline-hours", "9"]
    free = greedy_json(clouds, *nine)["policies"]["greedy"]
    assert free["moves_per_run"] == 1
    g = greedy_json(clouds, *nine, "--checkpoint-gb", "50")["policies"]["greedy"]
    assert g["moves_per_run"] == 0 and g["deadline_met_fraction"] == 1.0
    assert g["mean_cost_usd"] == pytest.approx(130 / 6, abs=1e-4)


def test_the_optimum_runs_across_clouds_only_when_moves_are_free(clouds):
    free = json.loads(invoke(*two_clouds(clouds, "--policy", "optimal", "--json")).output)
    opt = free["policies"]["optimal"]
    assert opt["mean_cost_usd"] <= 90 / 6 + 1e-9 and opt["saving_vs_best_single_cloud_pct"] > 0
    res = invoke(*two_clouds(clouds, "--policy", "optimal", "--policy", "greedy",
                             "--checkpoint-gb", "50"))
    assert res.exit_code == 0, res.output
    assert "optimal: each cloud alone only" in res.output


def test_the_table_puts_each_cloud_beside_across(clouds):
    res = CliRunner().invoke(cli, ["simulate", *two_clouds(clouds, "--policy", "greedy",
                                                           "--checkpoint-gb", "50")],
                             env={"COLUMNS": "160"}, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "aws $" in res.output and "gcp $" in res.output and "egress $" in res.output
    # across 20.17 against GCP alone's 16.33
    assert "20.17" in res.output and "-23.5% vs gcp" in res.output
    assert "from aws $4.50" in res.output and "2 ticks of copy" in res.output


def test_one_cloud_named_or_a_checkpoint_changes_nothing(clouds):
    plain = invoke("--trace", str(clouds["aws"]), "--prices", str(clouds["aws_prices"]),
                   "--od-price", "3", *JOB, "--json")
    named = invoke("--trace", f"aws={clouds['aws']}", "--prices", f"aws={clouds['aws_prices']}",
                   "--od-price", "aws=3", *JOB, "--checkpoint-gb", "500", "--json")
    assert plain.exit_code == 0 and named.exit_code == 0, named.output
    assert json.loads(named.output) == json.loads(plain.output)
    assert set(json.loads(plain.output)) == {"policies", "model"}


def test_two_clouds_with_free_moves_are_one_market_of_their_pools(clouds, tmp_path):
    # Free moves and one on-demand price: across clouds is the one-cloud simulate of a trace
    # holding both clouds' columns, figure for figure.
    merged = write_trace(tmp_path / "merged.csv", {"aws:z1": AWS, "gcp:z1": GCP}, tick_s=TICK_S)
    prices = write_prices(tmp_path / "merged_prices.csv", [("aws:z1", 0, 1.0), ("gcp:z1", 0, 2.0)])
    job = [a for a in JOB if a not in ("--t0", "20")] + ["--starts", "8", "--seed", "3"]
    one = invoke("--trace", str(merged), "--prices", str(prices), "--od-price", "3", *job,
                 "--json")
    assert one.exit_code == 0, one.output
    res = invoke("--trace", f"aws={clouds['aws']}", "--trace", f"gcp={clouds['gcp']}",
                 "--prices", f"aws={clouds['aws_prices']}", "--prices",
                 f"gcp={clouds['gcp_prices']}", "--od-price", "3", *job, "--json")
    assert res.exit_code == 0, res.output
    across, single = json.loads(res.output), json.loads(one.output)
    added = {"mean_cost_alone_usd", "best_single_cloud", "saving_vs_best_single_cloud_pct",
             "mean_egress_usd", "moves_per_run"}
    for name, s in single["policies"].items():
        assert {k: v for k, v in across["policies"][name].items() if k not in added} == s
    assert {k: across["model"][k] for k in single["model"]} == single["model"]


@pytest.mark.parametrize("change,flag", [
    (["--trace", "azure={aws}"], "--trace"),
    (["--trace", "{aws}", "--trace", "{gcp}"], "--trace"),
    (["--od-price", "aws=3"], "--od-price"),
    (["--spot-price", "azure=1"], "--spot-price"),
    (["--prices", "aws={aws_prices}", "--prices", "aws={gcp_prices}"], "--prices"),
    (["--pool", "z1"], "--pool"),
    (["--pool", "aws:z1"], "--pool"),
    (["--trace", "aws={aws}", "--trace", "gcp={short}"], "--trace"),
])
def test_bad_cloud_input_exits_2_naming_the_flag(clouds, tmp_path, change, flag):
    files = {k: str(v) for k, v in clouds.items()}
    files["short"] = str(write_trace(tmp_path / "short.csv", {"z1": GCP[:150]}, tick_s=TICK_S))
    change = [a.format(**files) for a in change]
    args = ["--trace", f"aws={files['aws']}", "--trace", f"gcp={files['gcp']}",
            "--prices", f"aws={files['aws_prices']}", "--prices", f"gcp={files['gcp_prices']}",
            "--od-price", "3", *JOB]
    for name in {a for a in change if a.startswith("--")} - {"--pool", "--spot-price"}:
        while name in args:                 # the changed flag replaces every given value
            i = args.index(name)
            del args[i:i + 2]
    out = tmp_path / "never.csv"
    res = invoke(*args, *change, "--decisions", str(out))
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and "Traceback" not in res.output, res.output
    assert not out.exists()


@pytest.mark.parametrize("flag,value", [("--od-price", "gcp=x"), ("--od-price", "gcp=0"),
                                        ("--spot-price", "aws=-1"), ("--checkpoint-gb", "-1"),
                                        ("--checkpoint-gb", "nan")])
def test_a_bad_number_for_a_cloud_is_one_click_error_naming_the_flag(clouds, tmp_path, flag,
                                                                    value):
    out = tmp_path / "never.csv"
    res = invoke(*two_clouds(clouds), flag, value, "--decisions", str(out))
    assert res.exit_code == 2, res.output
    errors = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and f"'{flag}'" in errors[0], res.output
    assert not out.exists()

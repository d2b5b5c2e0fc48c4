"""`spotrun simulate` as users call it: flags, JSON keys, decisions file, bad input."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from spotrun.cli import cli

POOLS = ["za", "zb"]


@pytest.fixture
def trace_files(tmp_path: Path) -> tuple[Path, Path]:
    """A 2-pool availability trace (10-minute ticks, time_utc) and its price change points."""
    rng = np.random.default_rng(3)
    n = 300
    rows = ["tick,time_utc," + ",".join(POOLS)]
    state = [1, 0]
    for t in range(n):
        for j in range(2):
            if rng.random() < 0.08:
                state[j] = 1 - state[j]
        hh, mm = divmod(t * 10, 60)
        day, hh = divmod(hh, 24)
        cells = [str(s) for s in state]
        if t > n - 5:
            cells[1] = ""              # pool zb's trace ended: unavailable
        rows.append(f"{t},2023-03-{1 + day:02d}T{hh:02d}:{mm:02d}:00Z," + ",".join(cells))
    trace = tmp_path / "trace.csv"
    trace.write_text("\n".join(rows) + "\n")
    prices = tmp_path / "prices.csv"
    prices.write_text("zone,tick,time_utc,spot_price_usd_per_hour\n"
                      "za,0,2023-03-01T00:00:00Z,0.9\nzb,0,2023-03-01T00:00:00Z,1.2\n"
                      "za,100,2023-03-01T16:40:00Z,1.4\n")
    return trace, prices


def invoke(*args: str):
    return CliRunner().invoke(cli, ["simulate", *args], catch_exceptions=False)


def base_args(trace: Path, prices: Path) -> list[str]:
    return ["--trace", str(trace), "--prices", str(prices), "--od-price", "3.0",
            "--work-hours", "8", "--deadline-hours", "12", "--changeover-hours", "0.3"]


def test_json_has_the_contract_keys(trace_files):
    trace, prices = trace_files
    res = invoke(*base_args(trace, prices), "--starts", "12", "--seed", "1", "--json",
                 "--workers", "1")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert set(out["policies"]) == {"on-demand", "greedy", "uniform-progress", "optimal", "reserve",
                                    "spotrun"}
    for name, s in out["policies"].items():
        assert set(s) >= {"runs", "mean_cost_usd", "mean_cost_vs_on_demand",
                          "mean_cost_vs_optimal", "deadline_met_fraction"}
        assert s["runs"] == 12 and s["deadline_met_fraction"] == 1.0
        assert s["mean_cost_vs_optimal"] >= 1.0 - 1e-9
    assert out["policies"]["on-demand"]["mean_cost_vs_on_demand"] == pytest.approx(1.0)
    m = out["model"]
    # 10-min ticks: 8 h = 48 ticks, 12 h = 72, 0.3 h = 1.8 -> 2 ticks
    assert (m["tick_s"], m["work_ticks"], m["deadline_ticks"], m["changeover_ticks"]) == \
        (600.0, 48, 72, 2)


def test_same_seed_same_starts_and_workers_do_not_change_results(trace_files):
    trace, prices = trace_files
    a = json.loads(invoke(*base_args(trace, prices), "--starts", "8", "--json",
                          "--workers", "1").output)
    b = json.loads(invoke(*base_args(trace, prices), "--starts", "8", "--json",
                          "--workers", "2").output)
    assert a == b


def test_t0_and_decisions_file(trace_files, tmp_path):
    trace, prices = trace_files
    out = tmp_path / "dec.csv"
    res = invoke(*base_args(trace, prices), "--t0", "5", "--t0", "40", "--pool", "za",
                 "--policy", "greedy", "--policy", "optimal", "--decisions", str(out), "--json")
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0]) == ["run", "policy", "tick", "mode", "pool"]
    assert {r["policy"] for r in rows} == {"greedy", "optimal"}
    assert {r["run"] for r in rows} == {"0", "1"}
    first = [r for r in rows if r["run"] == "1" and r["policy"] == "optimal"]
    assert first[0]["tick"] == "40"
    assert all(r["mode"] in ("idle", "on-demand", "spot") for r in rows)
    assert all((r["pool"] == "za") == (r["mode"] == "spot") for r in rows)
    assert json.loads(res.output)["model"]["starts"] == [5, 40]


def test_table_output(trace_files):
    trace, prices = trace_files
    res = invoke(*base_args(trace, prices), "--starts", "3", "--policy", "spotrun",
                 "--policy", "on-demand")
    assert res.exit_code == 0
    assert "spotrun" in res.output and "vs OD" in res.output


def test_the_plan_runs_by_name_and_the_old_variants_are_gone(trace_files):
    trace, prices = trace_files
    res = invoke(*base_args(trace, prices), "--starts", "3", "--policy", "markov-tiers",
                 "--policy", "spotrun", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)["policies"]
    assert set(out) == {"markov-tiers", "spotrun"}
    assert all(s["deadline_met_fraction"] == 1.0 for s in out.values())
    assert "markov-tiers" in invoke("--help").output
    # issue 41: plan-first is `spotrun`; its old name and the one-tier plan are refused
    for gone in ("spotrun-plan", "markov"):
        res = invoke(*base_args(trace, prices), "--policy", gone)
        assert res.exit_code == 2 and "--policy" in res.output and "Traceback" not in res.output
        assert "allowed: on-demand, greedy, uniform-progress, optimal, reserve, spotrun, " \
            "markov-tiers" in res.output


@pytest.mark.parametrize("extra,flag", [
    (["--pool", "nope"], "--pool"),
    (["--policy", "clairvoyant"], "--policy"),
    (["--t0", "299"], "--t0"),
    (["--t0", "7.5"], "--t0"),
    (["--starts", "0"], "--starts"),
    (["--t0", "3", "--starts", "4"], "--t0"),
])
def test_bad_input_exits_2_naming_the_flag(trace_files, tmp_path, extra, flag):
    trace, prices = trace_files
    out = tmp_path / "never.csv"
    res = invoke(*base_args(trace, prices), *extra, "--decisions", str(out))
    assert res.exit_code == 2
    assert flag in res.output and len(res.output) < 500 and "Traceback" not in res.output
    assert not out.exists()


@pytest.mark.parametrize("args,flag", [
    (["--od-price", "3", "--work-hours", "8", "--deadline-hours", "8.1"], "--deadline-hours"),
    (["--od-price", "-1", "--work-hours", "8", "--deadline-hours", "12"], "--od-price"),
    (["--od-price", "x", "--work-hours", "8", "--deadline-hours", "12"], "--od-price"),
    (["--work-hours", "8", "--deadline-hours", "12"], "--od-price"),
    (["--od-price", "3", "--work-hours", "8", "--deadline-hours", "100"], "--deadline-hours"),
])
def test_bad_numbers(trace_files, args, flag):
    trace, prices = trace_files
    res = invoke("--trace", str(trace), "--prices", str(prices), *args)
    assert res.exit_code == 2 and flag in res.output


@pytest.mark.parametrize("flag,value", [
    ("--od-price", "x"), ("--od-price", "nan"), ("--od-price", "inf"), ("--od-price", "0"),
    ("--work-hours", "-2"), ("--deadline-hours", "1e999"), ("--changeover-hours", "-0.1"),
    ("--spot-price", "-1"), ("--starts", "0"), ("--starts", "2.5"), ("--seed", "-1"),
    ("--seed", "x"), ("--nodes", "0"), ("--workers", "0"), ("--t0", "7.5"),
])
def test_a_bad_number_is_one_error_line_naming_the_flag(trace_files, tmp_path, flag, value):
    # click parses the numbers: a bad one exits 2 before anything runs (a negative seed
    # used to reach numpy and end in a traceback).
    trace, prices = trace_files
    out = tmp_path / "never.csv"
    args = base_args(trace, prices)
    if flag in args:
        i = args.index(flag)
        del args[i:i + 2]
    res = invoke(*args, flag, value, "--decisions", str(out))
    assert res.exit_code == 2, res.output
    errors = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and f"'{flag}'" in errors[0], res.output
    assert "Traceback" not in res.output and not out.exists()


def test_bad_trace_and_missing_price(tmp_path, trace_files):
    trace, _ = trace_files
    bad = tmp_path / "bad.csv"
    bad.write_text("hello,world\n1,2\n")
    res = invoke("--trace", str(bad), "--spot-price", "1", "--od-price", "3", "--work-hours",
                 "1", "--deadline-hours", "2")
    assert res.exit_code == 2 and "trace" in res.output
    res = invoke("--trace", str(trace), "--od-price", "3", "--work-hours", "1",
                 "--deadline-hours", "2")
    assert res.exit_code == 2 and "--spot-price" in res.output
    # a flat spot price instead of a price file
    res = invoke("--trace", str(trace), "--spot-price", "1.0", "--od-price", "3", "--work-hours",
                 "1", "--deadline-hours", "2", "--starts", "2", "--json")
    assert res.exit_code == 0


def test_deadline_longer_than_the_trace_is_told_in_hours(trace_files):
    # the trace: 300 rows of 10 minutes = 50 h; the user gave hours, the message says hours
    trace, prices = trace_files
    res = invoke("--trace", str(trace), "--prices", str(prices), "--od-price", "3",
                 "--work-hours", "8", "--deadline-hours", "72")
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "--deadline-hours" in lines[0]
    assert "72 h" in lines[0] and "50 h" in lines[0] and "ticks" not in lines[0]


def test_deadline_shorter_than_the_work_is_told_in_hours(trace_files):
    trace, prices = trace_files
    res = invoke("--trace", str(trace), "--prices", str(prices), "--od-price", "3",
                 "--work-hours", "8", "--deadline-hours", "8.1")
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "8 h of work" in lines[0] and "ticks" not in lines[0]


def test_a_trace_glob_that_also_matches_the_price_file_names_it(trace_files):
    # `--trace data/*.csv` expands in the shell to the trace and the price file
    trace, prices = trace_files
    res = invoke("--trace", str(trace), str(prices), "--od-price", "3",
                 "--work-hours", "8", "--deadline-hours", "12", "--spot-price", "1")
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "--trace" in lines[0] and str(prices) in lines[0]
    assert "price file" in lines[0] and "--prices" in lines[0]
    assert "extra argument" not in res.output

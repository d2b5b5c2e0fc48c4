"""`spotrun audit`: hand-worked baseline and waste, sums against raw rows, --json/--csv/--plot."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from spotrun.audit import audit_jobs
from spotrun.cli import cli
from spotrun.catalog import catalog_od_price
from spotrun.daemon.spend import SpendLoop
from spotrun.db import session
from spotrun.states import EndReason, JobState, Market
from spotrun.store.file import FileStore

from test_ledger_support import (OD_P3, P3, ZONE, PriceFeed, at, make_attempt, make_job, new_db,
                                 rows_of, total_usd)

OD = catalog_od_price("us-east-1")
WORK = {"reference_instance": P3, "reference_hours": 4, "total_steps": 4000}


def _fallback_run(eng, feed, job_id="job-1", store_uri="file:///nonexistent/store"):
    """Spot 2 h reclaimed (steps 0->1900, checkpoint 1800), then on-demand 1.5 h (1800->3200).

    Both attempts spend their first 6 min booting and restoring, so the job trains at
    1900/1.9 h = 1400/1.4 h = 1000 steps/h on p3.2xlarge.
    """
    make_job(eng, job_id, state=JobState.SUCCEEDED, work=WORK, last_step=3200,
             store_uri=store_uri)
    make_attempt(eng, job_id, 1, start=at(0), end=at(120), reason=EndReason.RECLAIMED,
                 start_step=0, last_step=1900, running_at=at(6))
    make_attempt(eng, job_id, 2, start=at(130), end=at(220), reason=EndReason.COMPLETED,
                 market=Market.ON_DEMAND, price=OD_P3, start_step=1800, last_step=3200,
                 running_at=at(136))
    feed.clock = at(221)
    SpendLoop(eng, feed, storage_interval_s=1e9).tick(at(221))


def _feed():
    feed = PriceFeed()
    feed.set_prices(P3, ZONE, [(at(-60), 0.90)])
    return feed


def test_baseline_saving_and_waste_by_hand(tmp_path):
    eng = new_db(tmp_path)
    _fallback_run(eng, _feed())
    with session(eng) as s:
        [ja] = audit_jobs(s, ["job-1"], od_price=OD)
    # Actual: spot 2 h x 0.90 = 1.80 (reclaimed after the first hour: charged);
    # on-demand 1.5 h x 3.06 = 4.59. Total 6.39.
    assert ja.spot_usd == pytest.approx(1.80)
    assert ja.on_demand_usd == pytest.approx(4.59)
    assert ja.actual_usd == pytest.approx(6.39)
    # Kept progress: attempt 1 kept 1800 (the checkpoint attempt 2 resumed from),
    # attempt 2 kept 1400. At 1000 steps/h on-demand p3.2xlarge: 3.2 h x 3.06 = 9.792.
    assert [a.kept_steps for a in ja.attempts] == [1800, 1400]
    assert [a.steps_per_hour for a in ja.attempts] == pytest.approx([1000, 1000])
    assert ja.baseline_on_demand_usd == pytest.approx(9.792)
    # Reference: 3200/4000 of 4 h on p3.2xlarge at 3.06 = 9.792 as well.
    assert ja.baseline_reference_usd == pytest.approx(9.792)
    assert ja.saved_usd == pytest.approx(9.792 - 6.39)
    assert ja.saved_fraction == pytest.approx((9.792 - 6.39) / 9.792)
    assert ja.preemptions == 1
    # Waste: 100 steps lost = 0.1 h on spot at 0.90/h = 0.09; restart: 6 min on
    # on-demand = 0.1 h x 3.06 = 0.306; 10 min waiting for capacity (unpaid).
    w = ja.waste
    assert (w["lost_work"].hours, w["lost_work"].usd) == pytest.approx((0.1, 0.09))
    assert (w["restart_overhead"].hours, w["restart_overhead"].usd) == pytest.approx((0.1, 0.306))
    assert (w["waiting_for_capacity"].hours, w["waiting_for_capacity"].usd) == \
        pytest.approx((1 / 6, 0.0))
    assert ja.hindsight_regret_usd is None   # hook: the simulator's optimal is not wired yet


def test_free_reclaim_costs_nothing_and_wastes_no_money(tmp_path):
    eng = new_db(tmp_path)
    make_job(eng, state=JobState.RECOVERING, last_step=400)
    make_attempt(eng, "job-1", 1, start=at(0), end=at(50), reason=EndReason.RECLAIMED,
                 start_step=0, last_step=450, running_at=at(5))
    feed = _feed()
    feed.clock = at(51)
    SpendLoop(eng, feed, storage_interval_s=1e9).tick(at(51))
    with session(eng) as s:
        [ja] = audit_jobs(s, od_price=OD)
    assert ja.actual_usd == pytest.approx(0.0, abs=1e-12)
    # Kept 400 (the job's checkpointed step), rate 450 steps / 45 min = 600/h:
    # baseline 400/600 h x 3.06 = 2.04, all of it saved.
    assert ja.baseline_on_demand_usd == pytest.approx(2.04)
    assert ja.saved_fraction == pytest.approx(1.0)
    assert ja.waste["lost_work"].hours == pytest.approx(50 / 600)
    assert ja.waste["lost_work"].usd == pytest.approx(0.0, abs=1e-12)


def _home_with_runs(tmp_path):
    """SPOTRUN_HOME with two booked jobs, one with storage and a volume line."""
    home = tmp_path / "home"
    home.mkdir()
    eng = new_db(home)
    feed = _feed()
    store = FileStore(home / "store")
    _fallback_run(eng, feed, "job-a", store_uri=store.uri)
    store.put_bytes("jobs/job-b/checkpoints/ckpt-000000000010/model.pt", b"w" * 5_000_000)
    make_job(eng, "job-b", state=JobState.RUNNING, store_uri=store.uri, last_step=10)
    make_attempt(eng, "job-b", 1, start=at(300), start_step=0, last_step=20, running_at=at(301))
    loop = SpendLoop(eng, feed, volume_gb=100, storage_interval_s=600)
    for m in (310, 330, 340, 400):
        feed.clock = at(m)
        loop.tick(at(m))
    return home, eng


def test_audit_sums_equal_raw_ledger_rows_and_formats_agree(tmp_path):
    home, eng = _home_with_runs(tmp_path)
    env = {"SPOTRUN_HOME": str(home)}
    runner = CliRunner()
    res = runner.invoke(cli, ["audit", "--json"], env=env)
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert [j["id"] for j in data] == ["job-a", "job-b"]
    for j in data:
        raw = total_usd(eng, j["id"])
        assert j["actual_usd"] == pytest.approx(raw, abs=1e-12)
        parts = j["spot_usd"] + j["on_demand_usd"] + j["volume_usd"] + j["storage_usd"] \
            + j["other_usd"]
        assert parts == pytest.approx(j["actual_usd"], abs=1e-12)
        assert j["ledger_rows"] == len(rows_of(eng, j["id"]))
        for key in ("baseline_on_demand_usd", "saved_usd", "saved_fraction", "preemptions"):
            assert key in j
    b = data[1]
    assert b["storage_usd"] > 0 and b["volume_usd"] > 0
    assert sum(j["actual_usd"] for j in data) == pytest.approx(total_usd(eng), abs=1e-12)

    res_csv = runner.invoke(cli, ["audit", "--csv"], env=env)
    assert res_csv.exit_code == 0, res_csv.output
    rows = list(csv.DictReader(io.StringIO(res_csv.output)))
    assert [r["id"] for r in rows] == ["job-a", "job-b", "TOTAL"]
    for r, j in zip(rows, data):
        for key in ("actual_usd", "spot_usd", "on_demand_usd", "storage_usd",
                    "baseline_on_demand_usd", "saved_usd"):
            assert float(r[key]) == pytest.approx(j[key], abs=1e-9)
        assert int(r["preemptions"]) == j["preemptions"]
        assert float(r["waste_lost_work_usd"]) == pytest.approx(j["waste"]["lost_work"]["usd"])
    assert float(rows[2]["actual_usd"]) == pytest.approx(total_usd(eng), abs=1e-9)

    res_tab = runner.invoke(cli, ["audit"], env={**env, "COLUMNS": "250"})
    assert res_tab.exit_code == 0, res_tab.output
    assert "6.3900" in res_tab.output                       # job-a actual $ as in JSON
    assert f"{data[0]['saved_fraction'] * 100:.1f}%" in res_tab.output
    assert "TOTAL" in res_tab.output


def test_since_until_window(tmp_path):
    eng = new_db(tmp_path)
    _fallback_run(eng, _feed())
    with session(eng) as s:
        [first] = audit_jobs(s, until=at(125), od_price=OD)
        [second] = audit_jobs(s, since=at(125), od_price=OD)
    assert first.actual_usd == pytest.approx(1.80)
    assert second.actual_usd == pytest.approx(4.59)
    assert first.actual_usd + second.actual_usd == pytest.approx(total_usd(eng))


def test_plot_is_a_png(tmp_path):
    home, _ = _home_with_runs(tmp_path)
    out = tmp_path / "audit.png"
    res = CliRunner().invoke(cli, ["audit", "--plot", str(out)], env={"SPOTRUN_HOME": str(home)})
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


@pytest.mark.parametrize("args,field", [
    (["audit", "no-such-job"], "JOB"),
    (["audit", "--since", "yesterday"], "--since"),
    (["audit", "--json", "--csv"], "--csv"),
    (["audit", "--plot", "out.jpg"], "--plot"),
])
def test_bad_input_exits_2_naming_the_field(tmp_path, args, field):
    home = tmp_path / "home"
    home.mkdir()
    new_db(home)
    res = CliRunner().invoke(cli, args, env={"SPOTRUN_HOME": str(home)})
    assert res.exit_code == 2
    assert field in res.output and "Traceback" not in res.output
    assert not (tmp_path / "out.jpg").exists()


def test_real_process_exit_code(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    new_db(home)
    env = {**os.environ, "SPOTRUN_HOME": str(home)}
    p = subprocess.run([sys.executable, "-m", "spotrun", "audit", "--json"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and json.loads(p.stdout) == []
    p = subprocess.run([sys.executable, "-m", "spotrun", "audit", "ghost"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "JOB" in p.stderr and len(p.stderr) < 500


def test_cumulative_curve_spreads_rows_over_their_span():
    from spotrun.audit.plot import cumulative_curve
    xs, ys = cumulative_curve([(at(0), at(60), 1.0), (at(30), at(30), 0.5),
                               (at(0), at(60), -1.0)])
    # The +1/-1 pair cancels everywhere; the zero-length row is a jump at minute 30.
    assert xs == [at(0), at(30), at(30), at(60)]
    assert ys == pytest.approx([0.0, 0.0, 0.5, 0.5])
    xs, ys = cumulative_curve([(at(0), at(60), 3.0)])
    assert ys == pytest.approx([0.0, 3.0])

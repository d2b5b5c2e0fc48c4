"""Audit causes that add up, steps after the last heartbeat read, status JSON, 80-column tables."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from spotrun.audit import audit_jobs
from spotrun.audit.compute import CAUSES
from spotrun.audit.reclaims import AttemptReports
from spotrun.cli import cli
from spotrun.catalog import catalog_od_price
from spotrun.daemon.spend import SpendLoop
from spotrun.db import session
from spotrun.reports import ExitReport
from spotrun.states import EndReason, JobState, Market
from spotrun.store.file import FileStore
from spotrun.ui.views import Reports

from test_ledger_support import OD_P3, P3, ZONE, PriceFeed, at, make_attempt, make_job, new_db, \
    total_usd

OD = catalog_od_price("us-east-1")
WORK = {"reference_instance": P3, "reference_hours": 4, "total_steps": 4000}


def _feed(price: float = 0.90) -> PriceFeed:
    feed = PriceFeed()
    feed.set_prices(P3, ZONE, [(at(-60), price)])
    return feed


def _book(eng, minute: float) -> None:
    feed = _feed()
    feed.clock = at(minute)
    SpendLoop(eng, feed, storage_interval_s=1e9).tick(at(minute))


def test_causes_sum_to_actual_and_match_the_hand_worked_split(tmp_path):
    eng = new_db(tmp_path)
    make_job(eng, state=JobState.SUCCEEDED, work=WORK, last_step=3200)
    # Spot 2 h (boot 6 min, 0->1900, kept 1800, 36 s of checkpoint stalls), reclaimed after
    # the first hour (charged); then on-demand 1.5 h (boot 6 min, 1800->3200) that stays up
    # 6 min after its last step.
    make_attempt(eng, "job-1", 1, start=at(0), end=at(120), reason=EndReason.RECLAIMED,
                 start_step=0, last_step=1900, running_at=at(6), stall_s=36.0)
    make_attempt(eng, "job-1", 2, start=at(130), end=at(226), reason=EndReason.COMPLETED,
                 market=Market.ON_DEMAND, price=OD_P3, start_step=1800, last_step=3200,
                 running_at=at(136))
    _book(eng, 227)
    # Attempt 2's agent wrote its exit report 6 min before the instance ended.
    exited = {2: AttemptReports(exit=ExitReport(ts=at(220).isoformat(), reason="completed"))}
    with session(eng) as s:
        [ja] = audit_jobs(s, ["job-1"], od_price=OD, to_market=lambda t: t,
                          reports_of=lambda job, a: exited.get(a.number, AttemptReports()))
    c = ja.causes
    assert set(c) == set(CAUSES)
    assert ja.causes_total_usd() == pytest.approx(total_usd(eng, "job-1"), abs=1e-9)
    assert ja.actual_usd == pytest.approx(1.80 + 1.6 * OD_P3)
    # Speed over both attempts: (1900 + 1400) steps / (1.89 h + 1.4 h) of training.
    rate_h = 3300 / ((7200 - 360 - 36) / 3600 + (5760 - 360 - 360) / 3600)
    spot_per_h, od_per_h = 0.90, OD_P3
    assert c["startup"].hours == pytest.approx(0.1)
    assert c["startup"].usd == pytest.approx(0.1 * spot_per_h)
    assert c["restart_overhead"].hours == pytest.approx(0.1)
    assert c["restart_overhead"].usd == pytest.approx(0.1 * od_per_h)
    assert c["checkpoint_stall"].usd == pytest.approx(0.01 * spot_per_h)
    # Each attempt's steps fill the time it trained, at its own speed (kept and lost in
    # proportion); attempt 2 is idle from its command's end (its exit report) to its end.
    train1_h = 2.0 - 0.1 - 0.01
    assert c["lost_work"].hours == pytest.approx(train1_h * 100 / 1900)
    assert c["lost_work"].usd == pytest.approx(train1_h * 100 / 1900 * spot_per_h)
    assert c["productive"].hours == pytest.approx(train1_h * 1800 / 1900 + 1.4)
    assert c["paid_idle"].hours == pytest.approx(0.1)
    assert c["paid_idle"].usd == pytest.approx(0.1 * od_per_h)
    assert ja.baseline_on_demand_usd == pytest.approx((1800 + 1400) / rate_h * OD(P3))
    assert c["waiting_for_capacity"].hours == pytest.approx(10 / 60)
    assert c["waiting_for_capacity"].usd == 0.0
    assert c["node_replacement"].usd == 0.0
    for a in ja.attempts:   # per attempt too: its causes are its instance spend
        assert sum(w.usd for w in a.causes.values()) == pytest.approx(a.instance_usd, abs=1e-12)
    assert ja.lost_steps == 100 and ja.not_charged.usd == 0.0


def test_free_reclaim_is_a_not_charged_line_outside_actual(tmp_path):
    eng = new_db(tmp_path)
    make_job(eng, state=JobState.RECOVERING, last_step=400)
    make_attempt(eng, "job-1", 1, start=at(0), end=at(50), reason=EndReason.RECLAIMED,
                 start_step=0, last_step=450, running_at=at(5))
    _book(eng, 51)
    with session(eng) as s:
        [ja] = audit_jobs(s, od_price=OD)
    assert ja.actual_usd == pytest.approx(0.0, abs=1e-12)
    assert ja.causes_total_usd() == pytest.approx(0.0, abs=1e-12)
    # Booked at 0.90/h for 50 min, then reversed: that is what was not charged.
    assert ja.not_charged.usd == pytest.approx(0.75)
    assert ja.not_charged.hours == pytest.approx(50 / 60)
    d = ja.to_dict()
    assert d["not_charged"]["usd"] == pytest.approx(0.75)
    assert "first hour" in d["not_charged"]["what"]
    assert "hindsight optimum" in d["hindsight_note"]


def _home_with_notice_run(tmp_path):
    """A job reclaimed after a notice whose last steps reached the store, not the database."""
    home = tmp_path / "home"
    home.mkdir()
    eng = new_db(home)
    store = FileStore(home / "store")
    make_job(eng, "job-n", state=JobState.SUCCEEDED, store_uri=store.uri, last_step=200,
             work={"total_steps": 200})
    # The daemon's last read of attempt 1 said step 91 (the emergency checkpoint); the
    # agent went on to step 100 and wrote that in its last heartbeat before the reclaim.
    make_attempt(eng, "job-n", 1, start=at(0), end=at(20), reason=EndReason.RECLAIMED,
                 start_step=0, last_step=91, running_at=at(2))
    store.put_bytes("jobs/job-n/attempts/0001/heartbeat.json",
                    json.dumps({"step": 100, "phase": "running"}).encode())
    make_attempt(eng, "job-n", 2, start=at(21), end=at(45), reason=EndReason.COMPLETED,
                 start_step=91, last_step=200, running_at=at(23))
    _book(eng, 46)
    return home, eng


def test_steps_after_the_last_heartbeat_read_count_as_lost(tmp_path):
    home, eng = _home_with_notice_run(tmp_path)
    res = CliRunner().invoke(cli, ["audit", "--json"], env={"SPOTRUN_HOME": str(home)})
    assert res.exit_code == 0, res.output
    [j] = json.loads(res.output)
    assert j["lost_steps"] == 9
    assert [a["lost_steps"] for a in j["attempts"]] == [9, 0]
    assert sum(c["usd"] for c in j["causes"].values()) == pytest.approx(j["actual_usd"], abs=1e-9)
    st = CliRunner().invoke(cli, ["status", "job-n", "--json"], env={"SPOTRUN_HOME": str(home)})
    assert st.exit_code == 0, st.output
    obj = json.loads(st.output)
    assert isinstance(obj, dict) and obj["id"] == "job-n" and obj["reclaims"] == 1
    assert [(a["resumed_from"], a["ran_to"]) for a in obj["attempts"]] == [(0, 100), (91, 200)]
    assert obj["clock"]["provider_clock"] == "market"   # the local provider's x60 default
    assert "started_at_market" in obj["attempts"][0] and "created_at_wall" in obj
    table = CliRunner().invoke(cli, ["status", "job-n"], env={"SPOTRUN_HOME": str(home),
                                                             "COLUMNS": "80"})
    assert "resumed from 91, ran to 200" in table.output
    assert "resumed from 0, ran to 100" in table.output


LONG = ["llama-3b-sft-full-precision-run-a1b2c3", "mistral-7b-dpo-long-context-d4e5f6",
        "tiny-mlp-0a0b0c", "vision-transformer-large-pretrain-ffeedd"]


def _home_with_four_jobs(tmp_path):
    home = tmp_path / "home4"
    home.mkdir()
    eng = new_db(home)
    for n, jid in enumerate(LONG):
        make_job(eng, jid, state=JobState.SUCCEEDED, last_step=300, work={"total_steps": 300})
        make_attempt(eng, jid, 1, start=at(n * 100), end=at(n * 100 + 30),
                     reason=EndReason.RECLAIMED, start_step=0, last_step=120,
                     running_at=at(n * 100 + 2))
        make_attempt(eng, jid, 2, start=at(n * 100 + 31), end=at(n * 100 + 90),
                     reason=EndReason.COMPLETED, start_step=100, last_step=300,
                     running_at=at(n * 100 + 33))
    _book(eng, 500)
    return home


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("verb", [["status"], ["audit"]])
def test_tables_show_every_id_whole_at_80_and_120_columns(tmp_path, columns, verb):
    home = _home_with_four_jobs(tmp_path)
    env = {"SPOTRUN_HOME": str(home), "COLUMNS": str(columns)}
    res = CliRunner().invoke(cli, verb, env=env)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert max(len(ln) for ln in lines) <= columns
    for jid in LONG:
        assert any(jid in ln for ln in lines), (jid, res.output)
    assert "…" not in res.output
    wide = CliRunner().invoke(cli, verb + ["--wide"], env=env)
    assert wide.exit_code == 0, wide.output
    header = next(ln for ln in wide.output.splitlines() if "reclaims" in ln)
    if verb == ["audit"]:
        assert "regret $" in header and "state" in header
    else:
        assert "current" in header and "attempts" in header
    assert ("not shown at" in res.output) == (len(header) > columns)


def test_reports_read_the_last_step_of_heartbeat_and_exit(tmp_path):
    store = FileStore(tmp_path / "s")
    store.put_bytes("jobs/j/attempts/0002/heartbeat.json", b'{"step": 40}')
    store.put_bytes("jobs/j/attempts/0002/exit.json", b'{"step": 42, "reason": "completed"}')
    job = type("J", (), {"id": "j", "store_uri": store.uri})()
    att = type("A", (), {"number": 2})()
    assert Reports().final_step(job, att) == 42
    att1 = type("A", (), {"number": 1})()
    assert Reports().final_step(job, att1) is None


def test_times_inside_event_text_are_labelled_with_their_clock():
    from spotrun.cli.jobs import label_times
    text = "attempt 1: interruption notice terminate at 2026-12-01T11:20:46Z"
    assert label_times(text, "market").endswith("2026-12-01T11:20:46Z (market)")
    assert label_times(text, "provider") == text


def test_status_gives_deadline_and_budget_headroom(tmp_path):
    from datetime import datetime, timedelta, timezone
    from spotrun.db import Job
    home = tmp_path / "h"
    home.mkdir()
    eng = new_db(home)
    make_job(eng, "dl", state=JobState.RUNNING, budget_usd=5.0)
    with session(eng) as s:
        j = s.get(Job, "dl")
        j.deadline_at = datetime.now(timezone.utc) + timedelta(hours=2)
        s.add(j)
        s.commit()
    res = CliRunner().invoke(cli, ["status", "dl", "--json"], env={"SPOTRUN_HOME": str(home)})
    d = json.loads(res.output)
    # No market has run in this home: its clock falls back to the wall's.
    assert d["deadline_headroom_s_market"] == pytest.approx(7200, abs=120)
    assert d["budget_headroom_usd"] == pytest.approx(5.0) and d["spend_usd"] == 0.0


def test_split_attempt_edge_cases_still_add_up():
    from spotrun.audit import split_attempt
    # A 60 s minimum charged for an instance that never ran a second: all of it idle.
    z = split_attempt(used_s=0.0, inst_usd=0.05, overhead_s=None, stall_s=None, kept_steps=0,
                      lost_steps=0, steps_per_s=None, first=True)
    assert z["paid_idle"].usd == 0.05 and sum(w.usd for w in z.values()) == 0.05
    # No speed known: training time split by steps, nothing left idle.
    n = split_attempt(used_s=1000.0, inst_usd=1.0, overhead_s=100.0, stall_s=None,
                      kept_steps=30, lost_steps=10, steps_per_s=None, first=False)
    assert n["restart_overhead"].usd == pytest.approx(0.1)
    assert n["productive"].usd == pytest.approx(0.675) and n["lost_work"].usd == pytest.approx(0.225)
    assert n["paid_idle"].usd == pytest.approx(0.0, abs=1e-12)
    assert sum(w.usd for w in n.values()) == pytest.approx(1.0, abs=1e-15)

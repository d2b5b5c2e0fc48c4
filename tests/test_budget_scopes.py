"""Project and owner budgets as docs/budgets.md describes them: settings, periods, what is
spent, committed and left, submit's owner and refusal, `spotrun budgets`, the 80 %/100 %
alerts, `audit --by`, the migration of old rows. Real SQLite, the real CLI; the price feed
(tests/test_ledger_support.py) is the one stand-in, for the cloud's price history.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, inspect, text
from sqlmodel import select

from spotrun.config import BudgetsSettings, ScopeBudget
from spotrun.budgets.periods import window
from spotrun.budgets.standing import read_standing
from spotrun.budgets.submit import os_user
from spotrun.ledger.stopmargin import StopMargin
from spotrun.cli import cli
from spotrun.daemon.spend import SpendLoop
from spotrun.db import Attempt, Job, SpendEntry, open_db, session
from spotrun.decide.waitkind import reason_kind
from spotrun.db.migrations import LATEST, stored_version
from spotrun.notify.routes import NotifyConfig
from spotrun.db.outbox import NotifyOutbox
from spotrun.notify.scopes import ScopeAlerts
from spotrun.states import AttemptState, EndReason, JobState, Market

from test_ledger_support import P3, ZONE, PriceFeed, make_attempt, make_job, new_db
from test_migrations import V1_SQL

MARGIN = StopMargin.fixed(900.0)   # 15 minutes: round figures (no stop measured here)
UTC = timezone.utc


def _t(day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(2030, 1, day, hour, minute, tzinfo=UTC)


def _scoped(eng, job_id: str, project: str, owner: str, **kw) -> None:
    make_job(eng, job_id, **kw)
    with session(eng) as s:
        job = s.get(Job, job_id)
        job.project, job.owner = project, owner
        s.add(job)
        s.commit()


def _budgets(**by: dict) -> BudgetsSettings:
    return BudgetsSettings(
        project={n: ScopeBudget(usd=u, period=p) for n, (u, p) in by.get("project", {}).items()},
        owner={n: ScopeBudget(usd=u, period=p) for n, (u, p) in by.get("owner", {}).items()})


def _cli(home: Path, *args: str, columns: str = "80"):
    return CliRunner().invoke(cli, list(args), env={"SPOTRUN_HOME": str(home),
                                                     "COLUMNS": columns})


# ------------------------------------------------------------ settings and periods

@pytest.mark.parametrize("toml,field", [
    ('[budgets.project.ml]\nusd = -1\nperiod = "month"\n', "budgets.project.ml.usd"),
    ('[budgets.project.ml]\nusd = 5\n', "budgets.project.ml.period"),
    ('[budgets.project.ml]\nusd = 5\nperiod = "year"\n', "budgets.project.ml.period"),
    ('[budgets.project.ML]\nusd = 5\nperiod = "day"\n', "budgets.project.ML"),
    ('[budgets.owner."a b"]\nusd = 5\nperiod = "day"\n', "budgets.owner.a b"),
    ('[budgets]\nteam = 5\n', "budgets.team"),
    ('[budgets]\nallow_owner_override = "yes"\n', "budgets.allow_owner_override"),
])
def test_bad_budgets_are_one_line_naming_the_key(tmp_home: Path, toml: str, field: str):
    (tmp_home / "spotrun.toml").write_text(toml)
    res = _cli(tmp_home, "budgets")
    assert res.exit_code == 2, res.output
    assert res.output.startswith(f"error: {field}: ") and len(res.output.splitlines()) == 1
    assert not (tmp_home / "spotrun.db").exists()   # nothing written


def test_periods_are_utc_calendar_days_iso_weeks_months_or_ever():
    late = datetime(2029, 12, 31, 23, 59, 59, tzinfo=UTC)    # a Monday
    day, week, month = (window(p, late) for p in ("day", "week", "month"))
    assert (day.key, day.start, day.end) == ("2029-12-31", datetime(2029, 12, 31, tzinfo=UTC),
                                             _t(1))
    assert (week.key, week.start, week.end) == ("2030-W01", datetime(2029, 12, 31, tzinfo=UTC),
                                                _t(7))
    assert (month.key, month.start, month.end) == ("2029-12", datetime(2029, 12, 1, tzinfo=UTC),
                                                   _t(1))
    assert window("day", _t(1)).key == "2030-01-01"     # midnight opens the next day
    assert window("total", late).start is None and window("total", late).phrase() == "in total"
    assert window("month", late).phrase() == "this month (2029-12)"


# ------------------------------------------------------------ spent, committed, left

def test_spent_counts_what_falls_in_the_period_and_commitments_count_once(tmp_path):
    eng = new_db(tmp_path)
    feed = PriceFeed(now=_t(1, 23))
    feed.set_prices(P3, ZONE, [(_t(1), 0.9)])
    _scoped(eng, "j1", "ml", "alice")
    _scoped(eng, "j2", "ml", "bob", state=JobState.STARTING)
    _scoped(eng, "j3", "other", "alice")
    make_attempt(eng, "j1", 1, start=_t(1, 23))            # runs across midnight
    make_attempt(eng, "j3", 1, start=_t(1, 23), end=_t(1, 23, 30), reason=EndReason.COMPLETED)
    with session(eng) as s:   # j2: an intent, no instance yet
        s.add(Attempt(job_id="j2", number=1, state=AttemptState.LAUNCHING, market=Market.SPOT,
                      instance_type=P3, zone=ZONE, price_usd_per_hour=0.9, client_token="t2"))
        s.commit()
    feed.clock = _t(2, 1)
    SpendLoop(eng, feed, storage_interval_s=1e9).tick(_t(2, 1))
    # j1: one open row 23:00-01:00 at $0.90/h ($1.80), half of it today; j3: $0.45 yesterday.
    budgets = _budgets(project={"ml": (10.0, "day")}, owner={"alice": (10.0, "week")})
    with session(eng) as s:
        rows = list(s.exec(select(SpendEntry).where(SpendEntry.job_id == "j1")))
        st = {b.key: b for b in read_standing(s, budgets.configured(), _t(2, 1), MARGIN)}
        total = {b.key: b for b in read_standing(
            s, _budgets(project={"ml": (10.0, "total")}).configured(), _t(2, 1), MARGIN)}
    assert [(r.start, r.end) for r in rows if r.kind == "compute"] == [(_t(1, 23), _t(2, 1))]
    ml, alice = st["project:ml"], st["owner:alice"]
    assert ml.window.key == "2030-01-02" and alice.window.key == "2030-W01"
    assert ml.spent_usd == pytest.approx(0.90)                 # half of j1's row
    assert total["project:ml"].spent_usd == pytest.approx(1.80)
    assert alice.spent_usd == pytest.approx(1.80 + 0.45)       # both of alice's projects
    # Running j1 and the intent of j2 commit the stop margin each at $0.90/h.
    assert ml.committed_usd == pytest.approx(2 * 0.225)
    assert alice.committed_usd == pytest.approx(0.225)         # j3 has ended
    assert sorted(ml.running) == ["j1", "j2"] and alice.running == ["j1"]
    assert ml.left_usd == pytest.approx(10.0 - 0.90 - 0.45)
    assert ml.fits(ml.left_usd) and not ml.fits(ml.left_usd + 0.01)
    why = ml.wait_reason(0.225 * 50)
    assert why.startswith("budget project ml: $0.9000 spent + $0.4500 committed of $10.00 "
                          "today (2030-01-02)") and reason_kind(why) == "budget"


# ------------------------------------------------------------ submit: owner and refusal

SPEC = ("name: {name}\ncommand: python train.py\nworkdir: code\nproject: ml\n"
        "work: {{reference_hours: 1.0, reference_instance: p3.2xlarge}}\n"
        "policy: {{market: spot, budget_usd: {cap}}}\n")


def _spec(tmp_path: Path, name: str, cap: float) -> Path:
    (tmp_path / "code").mkdir(exist_ok=True)
    (tmp_path / "code" / "train.py").write_text("print('hi')\n")
    path = tmp_path / f"{name}.yaml"
    path.write_text(SPEC.format(name=name, cap=cap))
    return path


def test_submit_records_owner_and_project_and_owner_override_needs_settings(tmp_home, tmp_path):
    spec = _spec(tmp_path, "mine", 5.0)
    res = _cli(tmp_home, "submit", "--json", str(spec))
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert (out["project"], out["owner"]) == ("ml", os_user())
    refused = _cli(tmp_home, "submit", "--owner", "bob", str(spec))
    assert refused.exit_code == 2 and "--owner" in refused.output
    assert "allow_owner_override" in refused.output and "Traceback" not in refused.output
    (tmp_home / "spotrun.toml").write_text("[budgets]\nallow_owner_override = true\n")
    bad = _cli(tmp_home, "submit", "--owner", "bob smith", str(spec))
    assert bad.exit_code == 2 and bad.output.startswith("error: --owner: not a valid owner")
    ok = _cli(tmp_home, "submit", "--owner", "bob", str(spec))
    assert ok.exit_code == 0, ok.output
    jobs = json.loads(_cli(tmp_home, "status", "--json").stdout)
    assert sorted((j["project"], j["owner"]) for j in jobs) == sorted(
        [("ml", os_user()), ("ml", "bob")])
    line = _cli(tmp_home, "status", jobs[0]["id"]).output.splitlines()[0]
    assert "project ml" in line and f"owner {jobs[0]['owner']}" in line


def test_a_cap_that_cannot_fit_what_is_left_is_refused_and_writes_nothing(tmp_home, tmp_path):
    (tmp_home / "spotrun.toml").write_text(
        '[budgets.project.ml]\nusd = 1.0\nperiod = "total"\n')
    eng = open_db(f"sqlite:///{tmp_home / 'spotrun.db'}")
    _scoped(eng, "old", "ml", "carol", state=JobState.SUCCEEDED)
    with session(eng) as s:
        s.add(SpendEntry(job_id="old", kind="compute", start=_t(1), end=_t(1, 1),
                         billed_seconds=3600, price_usd_per_hour=0.8, usd=0.8))
        s.commit()
    res = _cli(tmp_home, "submit", str(_spec(tmp_path, "big", 0.5)))
    assert res.exit_code == 2, res.output
    assert res.output.startswith("error: policy.budget_usd: $0.5 cannot fit budget project ml: "
                                 "$0.2000 left") and len(res.output.splitlines()) == 1
    with session(eng) as s:
        assert [j.id for j in s.exec(select(Job))] == ["old"]
    assert not (tmp_home / "store" / "jobs").exists()      # no bundle uploaded
    ok = _cli(tmp_home, "submit", str(_spec(tmp_path, "small", 0.2)))
    assert ok.exit_code == 0, ok.output
    eng.dispose()


# ------------------------------------------------------------ spotrun budgets

def test_budgets_verb_json_and_an_80_column_table(tmp_home):
    long = "vision-transformer-large-pretraining-team"
    (tmp_home / "spotrun.toml").write_text(
        f'[budgets.project.{long}]\nusd = 2000\nperiod = "total"\n'
        '[budgets.owner.alice]\nusd = 300.5\nperiod = "total"\n')
    eng = open_db(f"sqlite:///{tmp_home / 'spotrun.db'}")
    _scoped(eng, "a1", long, "alice", state=JobState.SUCCEEDED)
    _scoped(eng, "q1", long, "bob", state=JobState.QUEUED)
    with session(eng) as s:
        s.add(SpendEntry(job_id="a1", kind="compute", start=_t(1), end=_t(1, 2),
                         billed_seconds=7200, price_usd_per_hour=12.5, usd=25.0))
        s.commit()
    res = _cli(tmp_home, "budgets", "--json")
    assert res.exit_code == 0, res.output
    data = {f"{b['scope']}:{b['name']}": b for b in json.loads(res.output)}
    proj = data[f"project:{long}"]
    assert set(proj) == {"scope", "name", "period", "period_key", "period_start_market",
                         "period_end_market", "budget_usd", "spent_usd", "committed_usd",
                         "left_usd", "used_fraction", "running_jobs", "queued_jobs",
                         "stopped_jobs", "source", "set_by", "set_at", "overrides_toml"}
    assert (proj["source"], proj["set_by"]) == ("spotrun.toml", None)
    assert (proj["spent_usd"], proj["committed_usd"], proj["left_usd"]) == (25.0, 0.0, 1975.0)
    assert proj["period_key"] == "total" and proj["queued_jobs"] == 1
    assert data["owner:alice"]["left_usd"] == pytest.approx(275.5)
    table = _cli(tmp_home, "budgets")
    assert table.exit_code == 0, table.output
    assert max(len(ln) for ln in table.output.splitlines()) <= 80
    assert f"project {long}" in table.output and "owner alice" in table.output
    assert "1,975.00" in table.output and "275.50" in table.output   # left, always shown
    wide = _cli(tmp_home, "budgets", "--wide")
    assert "stopped" in wide.output and "committed $" in wide.output
    eng.dispose()


def test_without_budgets_the_verb_says_how_to_add_one(tmp_home):
    res = _cli(tmp_home, "budgets")
    assert res.exit_code == 0 and "docs/budgets.md" in res.output
    assert json.loads(_cli(tmp_home, "budgets", "--json").output) == []


# ------------------------------------------------------------ alerts

def test_alerts_once_per_budget_and_period(tmp_path):
    eng = new_db(tmp_path)
    _scoped(eng, "j1", "ml", "alice", state=JobState.SUCCEEDED)
    with session(eng) as s:
        s.add(SpendEntry(job_id="j1", kind="compute", start=_t(1, 1), end=_t(1, 2),
                         billed_seconds=3600, price_usd_per_hour=8.5, usd=8.5))
        s.commit()
    cfg = NotifyConfig(webhooks={"ops": "http://127.0.0.1:9/a", "me": "http://127.0.0.1:9/b"},
                       routes={"budget_100": ("ops",)})
    budgets = _budgets(project={"ml": (10.0, "day")})

    def queue(alerts: ScopeAlerts, at: datetime) -> None:
        with session(eng) as s:
            standing = read_standing(s, budgets.configured(), at, MARGIN)
        alerts.queue(standing)

    def rows() -> list[tuple[str, str]]:
        with session(eng) as s:
            return sorted((r.event_key, r.webhook) for r in s.exec(select(NotifyOutbox)))
    first = ScopeAlerts(eng, cfg, 0.8)
    for _ in range(3):
        queue(first, _t(1, 3))
    queue(ScopeAlerts(eng, cfg, 0.8), _t(1, 4))   # a restarted daemon
    assert rows() == [("budget_80:project:ml:2030-01-01:10", "me"),
                      ("budget_80:project:ml:2030-01-01:10", "ops")]
    with session(eng) as s:
        s.add(SpendEntry(job_id="j1", kind="compute", start=_t(1, 2), end=_t(1, 3),
                         billed_seconds=3600, price_usd_per_hour=2.0, usd=2.0))
        s.commit()
    queue(first, _t(1, 5))
    assert ("budget_100:project:ml:2030-01-01:10", "ops") in rows() and len(rows()) == 3
    queue(first, _t(2, 5))   # a new day has spent nothing
    assert len(rows()) == 3
    with session(eng) as s:
        text_100 = s.exec(select(NotifyOutbox.text).where(
            NotifyOutbox.event == "budget_100")).one()
    assert text_100.startswith("spotrun: budget project ml reached: $10.50 spent")


# ------------------------------------------------------------ audit --by, resume, migration

def _audited_home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    eng = new_db(home)
    for n, (jid, project, owner) in enumerate([("a-1", "ml", "alice"), ("b-1", "ml", "bob"),
                                               ("c-1", "vision", "alice")]):
        _scoped(eng, jid, project, owner, state=JobState.SUCCEEDED, last_step=300,
                work={"total_steps": 300, "reference_instance": P3, "reference_hours": 4})
        base = _t(1, 1 + 2 * n)
        make_attempt(eng, jid, 1, start=base, end=base.replace(minute=30),
                     reason=EndReason.RECLAIMED, last_step=120, running_at=base)
        make_attempt(eng, jid, 2, start=base.replace(minute=31), end=base.replace(minute=59),
                     reason=EndReason.COMPLETED, start_step=100, last_step=300,
                     running_at=base.replace(minute=32))
    feed = PriceFeed(now=_t(2))
    feed.set_prices(P3, ZONE, [(_t(1), 0.9)])
    SpendLoop(eng, feed, storage_interval_s=1e9).tick(_t(2))
    eng.dispose()
    return home


def test_audit_by_project_and_owner_sums_the_jobs_figures(tmp_path):
    home = _audited_home(tmp_path)
    jobs = {j["id"]: j for j in json.loads(_cli(home, "audit", "--json").output)}
    assert {(j["project"], j["owner"]) for j in jobs.values()} == {
        ("ml", "alice"), ("ml", "bob"), ("vision", "alice")}
    for by, want in (("project", {"ml": ["a-1", "b-1"], "vision": ["c-1"]}),
                     ("owner", {"alice": ["a-1", "c-1"], "bob": ["b-1"]})):
        res = _cli(home, "audit", "--by", by, "--json")
        assert res.exit_code == 0, res.output
        groups = {g["group"]: g for g in json.loads(res.output)}
        assert {k: g["jobs"] for k, g in groups.items()} == want
        for name, g in groups.items():
            members = [jobs[j] for j in want[name]]
            assert g["by"] == by and g["job_count"] == len(members)
            for key in ("actual_usd", "baseline_on_demand_usd", "saved_usd", "spot_usd"):
                assert g[key] == pytest.approx(sum(m[key] for m in members)), key
            assert g["reclaims"] == sum(m["preemptions"] for m in members)
            for cause, line in g["causes"].items():
                assert line["usd"] == pytest.approx(sum(m["causes"][cause]["usd"] or 0
                                                        for m in members)), cause
            assert g["causes_total_usd"] == pytest.approx(g["actual_usd"])
    # --since keeps the rows booked from then on, as for jobs.
    later = json.loads(_cli(home, "audit", "--by", "project", "--since", "2030-01-01T04:00:00Z",
                            "--json").output)
    assert {g["group"]: g["actual_usd"] > 0 for g in later} == {"ml": False, "vision": True}
    table = _cli(home, "audit", "--by", "owner")
    assert table.exit_code == 0 and max(len(ln) for ln in table.output.splitlines()) <= 80
    assert "owner alice (2 jobs): where the money went" in table.output
    bad = _cli(home, "audit", "--by", "team")
    assert bad.exit_code == 2 and "--by" in bad.output
    csv = _cli(home, "audit", "--by", "owner", "--csv")
    assert csv.exit_code == 2 and csv.output.startswith("error: --by: ")


def test_resume_takes_a_budget_stopped_job_back_to_the_queue(tmp_home):
    eng = open_db(f"sqlite:///{tmp_home / 'spotrun.db'}")
    _scoped(eng, "stopped", "ml", "alice", state=JobState.BUDGET_EXHAUSTED)
    with session(eng) as s:
        j = s.get(Job, "stopped")
        j.budget_stop_requested, j.budget_stop_scope = True, "project:ml@2030-01"
        j.reason = "budget reached"
        s.add(j)
        s.commit()
    shown = json.loads(_cli(tmp_home, "status", "stopped", "--json").output)
    assert shown["reason"] == "budget project ml reached (2030-01)"
    assert shown["budget_stop_scope"] == "project:ml@2030-01"
    res = _cli(tmp_home, "resume", "stopped")
    assert res.exit_code == 0, res.output
    with session(eng) as s:
        j = s.get(Job, "stopped")
    assert j.state is JobState.RECOVERING and not j.budget_stop_requested
    assert j.budget_stop_scope is None
    eng.dispose()


def test_old_jobs_gain_an_owner_and_a_project(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    raw = create_engine(url)
    with raw.begin() as conn:
        for sql in V1_SQL:
            conn.execute(text(sql))
    raw.dispose()
    engine = open_db(url)
    assert stored_version(engine) == LATEST
    with session(engine) as s:
        job = s.get(Job, "old-1")
    assert (job.owner, job.project, job.budget_stop_scope) == ("unknown", "default", None)
    indexed = {tuple(ix["column_names"]) for ix in inspect(engine).get_indexes("job")}
    assert {("owner",), ("project",)} <= indexed
    engine.dispose()


# ------------------------------------------------------------ dashboard

def test_dashboard_shows_spend_against_each_budget(tmp_home):
    import threading
    import urllib.request

    from spotrun.config import load_settings
    from spotrun.ui.server import make_server
    from test_dashboard import _browser
    (tmp_home / "spotrun.toml").write_text(
        '[budgets.project.ml]\nusd = 40\nperiod = "total"\n'
        '[budgets.owner.alice]\nusd = 10\nperiod = "total"\n')
    eng = open_db(f"sqlite:///{tmp_home / 'spotrun.db'}")
    _scoped(eng, "a1", "ml", "alice", state=JobState.SUCCEEDED)
    with session(eng) as s:
        s.add(SpendEntry(job_id="a1", kind="compute", start=_t(1), end=_t(1, 2),
                         billed_seconds=7200, price_usd_per_hour=6.0, usd=12.0))
        s.commit()
    server = make_server(load_settings(str(tmp_home)), port=0)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with urllib.request.urlopen(url + "/api/budgets", timeout=30) as r:
            web = json.loads(r.read())
        assert web == json.loads(_cli(tmp_home, "budgets", "--json").stdout)
        assert {(b["scope"], b["name"], b["left_usd"]) for b in web} == {
            ("project", "ml", 28.0), ("owner", "alice", -2.0)}
        driver = _browser()
        try:
            from selenium.webdriver.common.by import By
            from selenium.webdriver.support.ui import WebDriverWait
            driver.get(url + "/")
            WebDriverWait(driver, 60).until(
                lambda d: d.execute_script("return document.body.dataset.ready === '1'"))
            row = driver.find_element(By.CSS_SELECTOR, '#budgets tr[data-budget="project:ml"]')
            assert "project ml" in row.text and "12.00" in row.text and "28.00" in row.text
            over = driver.find_element(By.CSS_SELECTOR, '#budgets tr[data-budget="owner:alice"]')
            assert "-2.0000" in over.text
            job = driver.find_element(By.CSS_SELECTOR, '#jobs tr[data-job="a1"]')
            assert "ml" in job.text and "alice" in job.text
        finally:
            driver.quit()
    finally:
        server.shutdown()
        server.server_close()
        eng.dispose()

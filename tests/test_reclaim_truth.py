"""The truth about each reclaim (issue 40): the steps the next attempt computed again, the time
it took to train again by part, the notice's outcome, and the audit's causes at each attempt's
own speed. A real SQLite state database and a FileStore holding the agents' reports as the
agent writes them; the CLI as a user runs it."""

from __future__ import annotations

import json
import threading
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from spotrun import layout
from spotrun.audit.reclaims import quantile
from spotrun.cli import cli
from spotrun.clock import ManualClock
from spotrun.config import load_settings
from spotrun.daemon.context import DaemonContext
from spotrun.daemon.reconcile import ReconcileLoop
from spotrun.daemon.spend import SpendLoop
from spotrun.db import Attempt, add_event, session
from spotrun.demo import proof
from spotrun.providers.base import InstanceInfo
from spotrun.providers.local.market.clock import MarketClock, to_dt
from spotrun.states import EndReason, InstanceState, JobState, Market, TerminationCause
from spotrun.store.file import FileStore
from spotrun.ui.server import Dashboard, make_server
from spotrun.ui.views import Reports, audit_view, job_page, status_view

from test_dashboard import _browser
from test_ledger_support import P3, ZONE, PriceFeed, T0, at, make_attempt, make_job, new_db

OUTCOME = "emergency checkpoint at step 120 in 1.50 s"


def _put(store: FileStore, key: str, body: dict) -> None:
    store.put_bytes(key, json.dumps(body).encode())


def _iso(t: datetime) -> str:
    return t.isoformat()


def _set(eng, attempt_id: int, **fields) -> None:
    """Write columns the daemon fills in later (created_at, notice_at, ...)."""
    with session(eng) as s:
        row = s.get(Attempt, attempt_id)
        for k, v in fields.items():
            setattr(row, k, v)
        s.add(row)
        s.commit()


def _reclaimed_event(eng, job_id: str, attempt_id: int, ts: datetime) -> None:
    with session(eng) as s:
        add_event(s, job_id, "attempt_reclaimed", "reclaimed", attempt_id=attempt_id, ts=ts)
        s.commit()


def _aws_home(home: Path):
    """A home on the aws provider's clock (the provider's clock is the wall's): two jobs.

    rt-job: attempt 1 reclaimed after a notice; the daemon last read step 120, the agent's
    last heartbeat says 121 (no exit report: a reclaim kills the agent). A launch found no
    capacity (attempt 2, planned from 120); attempt 3 found 120's checkpoint broken and
    resumed from 115, so 6 steps were computed again. Its way back: reclaim at 30:00, the
    daemon knew at 30:04, asked for an instance at 31:00, got it at 31:20, its agent started
    at 31:50, restored at 32:30, made its first new step at 32:35; it exited at 59:00 and
    its instance ended at 60:00.
    rt-open: attempt 1 reclaimed with no report at all (its last step is unknown); attempt 2
    runs, back to training 100 s after the reclaim.
    """
    home.mkdir(exist_ok=True)
    (home / "spotrun.toml").write_text('provider = "aws"\n')
    eng = new_db(home)
    store = FileStore(home / "store")
    make_job(eng, "rt-job", state=JobState.SUCCEEDED, store_uri=store.uri, last_step=300,
             work={"total_steps": 300})
    a1 = make_attempt(eng, "rt-job", 1, start=at(0), end=at(30), reason=EndReason.RECLAIMED,
                      start_step=0, last_step=120, running_at=at(2))
    _set(eng, a1.id, notice_at=at(28), created_at=at(-1))
    _put(store, layout.heartbeat_key("rt-job", 1), {"ts": _iso(at(29, 59)), "phase": "running",
                                                     "step": 121, "notice": True})
    _put(store, layout.notice_key("rt-job", 1), {
        "ts": _iso(at(28)), "action": "terminate", "emergency_checkpoint_step": 120,
        "emergency_save_s": 1.5, "outcome": OUTCOME})
    _reclaimed_event(eng, "rt-job", a1.id, at(30, 4))
    a2 = make_attempt(eng, "rt-job", 2, start=None, end=at(30, 30),
                      reason=EndReason.LAUNCH_FAILED, start_step=120, last_step=0)
    _set(eng, a2.id, created_at=at(30, 30))
    a3 = make_attempt(eng, "rt-job", 3, start=at(31, 20), end=at(60),
                      reason=EndReason.COMPLETED, start_step=115, last_step=300,
                      running_at=at(33))
    _set(eng, a3.id, created_at=at(31))
    _put(store, layout.heartbeat_key("rt-job", 3), {
        "ts": _iso(at(59)), "phase": "exited", "step": 300, "resumed_from": 115,
        "restore_started_at": _iso(at(31, 50)), "restore_done_at": _iso(at(32, 30)),
        "first_step_at": _iso(at(32, 35))})
    _put(store, layout.exit_key("rt-job", 3), {"ts": _iso(at(59)), "exit_code": 0,
                                               "reason": "completed", "step": 300})
    make_job(eng, "rt-open", state=JobState.RUNNING, store_uri=store.uri, last_step=50,
             work={"total_steps": 300})
    b1 = make_attempt(eng, "rt-open", 1, start=at(70), end=at(100),
                      reason=EndReason.RECLAIMED, start_step=50, last_step=50,
                      running_at=at(72))
    _reclaimed_event(eng, "rt-open", b1.id, at(100, 2))
    b2 = make_attempt(eng, "rt-open", 2, start=at(100, 15), start_step=50, last_step=60,
                      running_at=at(101, 30))
    _set(eng, b2.id, created_at=at(100, 10))
    _put(store, layout.heartbeat_key("rt-open", 2), {
        "ts": _iso(at(102)), "phase": "running", "step": 60, "resumed_from": 50,
        "restore_started_at": _iso(at(100, 30)), "restore_done_at": _iso(at(101, 10)),
        "first_step_at": _iso(at(101, 40))})
    feed = PriceFeed()
    feed.set_prices(P3, ZONE, [(at(-60), 0.9)])
    feed.clock = at(103)
    SpendLoop(eng, feed, storage_interval_s=1e9).tick(at(103))
    eng.dispose()
    return home


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return _aws_home(tmp_path_factory.mktemp("reclaim-truth") / "home")


def _cli(home: Path, *args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, list(args), env={"SPOTRUN_HOME": str(home),
                                                   "COLUMNS": "160"})
    return res.exit_code, res.output


def _json(home: Path, *args: str):
    code, out = _cli(home, *args, "--json")
    assert code == 0, out
    return json.loads(out)


WANT_TTR = {"detection_s": 4.0, "waiting_s": 56.0, "launch_s": 20.0, "boot_s": 30.0,
            "restore_s": 40.0, "first_step_s": 5.0, "total_s": 155.0,
            "first_step_from": "agent", "from_attempt": 1}


def test_status_gives_each_reclaims_lost_steps_time_to_resume_and_notice_outcome(home):
    job = _json(home, "status", "rt-job")
    a1, a2, a3 = job["attempts"]
    # The next attempt that ran resumed from 115, not the failed launch's planned 120.
    assert (a1["ran_to"], a1["lost_steps"]) == (121, 6)
    assert a2["lost_steps"] is None and a2["time_to_resume"] is None
    assert a3["lost_steps"] == 0 and a3["ran_to"] == 300
    assert a1["notice_outcome"] == OUTCOME and a3["notice_outcome"] is None
    assert a1["time_to_resume"] is None and a3["time_to_resume"] == WANT_TTR
    # Unknown is said, never 0: no report named attempt 1's last step.
    b1, b2 = _json(home, "status", "rt-open")["attempts"]
    assert (b1["ran_to"], b1["lost_steps"]) == (None, None)
    assert b2["lost_steps"] is None   # still running: its unsaved steps are not lost (yet)
    assert b2["time_to_resume"]["total_s"] == 100.0
    # The list view carries the same figures.
    listed = {j["id"]: j for j in _json(home, "status")}
    assert listed["rt-job"]["attempts"] == job["attempts"]


def test_status_timeline_text_names_the_notice_outcome_and_the_resume(home):
    code, out = _cli(home, "status", "rt-job")
    assert code == 0, out
    assert f"attempt 1: reclaimed, lost steps 6; notice: {OUTCOME}" in out
    assert ("attempt 3 resumed 2m35s (provider clock) after attempt 1's reclaim: detection "
            "4.0s, waiting 56.0s, launch 20.0s, boot 30.0s, restore 40.0s, first step 5.0s"
            ) in " ".join(out.split())
    code, out = _cli(home, "status", "rt-open")
    assert "attempt 1: reclaimed, lost steps ?; notice: -" in out


def test_audit_gives_the_same_figures_per_attempt_in_total_and_in_its_table(home):
    jobs = {j["id"]: j for j in _json(home, "audit")}
    j = jobs["rt-job"]
    assert [a["lost_steps"] for a in j["attempts"]] == [6, 0]   # attempts that ran
    assert j["lost_steps"] == 6 and j["lost_steps_unknown"] == 0
    a1, a3 = j["attempts"]
    assert a1["notice_outcome"] == OUTCOME and a3["time_to_resume"] == WANT_TTR
    assert a1["kept_steps"] == 115 and a1["gained_steps"] == 121
    # Attempt 3's command ended at 59:00 (its exit report): its last minute is paid idle.
    assert a3["trained_until_market"] == at(59).isoformat()
    assert a3["causes"]["paid_idle"]["hours"] == pytest.approx(60 / 3600)
    assert sum(c["usd"] for c in j["causes"].values()) == pytest.approx(j["actual_usd"])
    o = jobs["rt-open"]
    assert o["attempts"][0]["lost_steps"] is None and o["lost_steps_unknown"] == 1
    assert any("lost steps unknown for 1 attempt" in n for n in o["notes"])
    code, out = _cli(home, "audit", "rt-job", "--wide")
    assert code == 0, out
    row = next(ln for ln in out.splitlines() if "1 -> 3" in ln)
    assert [c.strip() for c in row.split("│")[1:10]] == [
        "1 -> 3", "6", "155.0", "4.0", "56.0", "20.0", "30.0", "40.0", "5.0"]
    assert f"rt-job: attempt 1 notice: {OUTCOME}" in out


def test_metrics_give_p50_and_p95_of_each_part_over_every_reclaim(home):
    text = Dashboard(load_settings(str(home))).metrics()
    samples = {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1])
               for ln in text.splitlines() if ln and not ln.startswith("#")}
    name = "spotrun_time_to_resume_seconds"
    assert f"# TYPE {name} summary" in text
    # Two reclaims resumed: 155 s and 100 s to the first new step.
    assert samples[f'{name}{{part="total",quantile="0.5"}}'] == pytest.approx(127.5)
    assert samples[f'{name}{{part="total",quantile="0.95"}}'] == pytest.approx(152.25)
    assert samples[f'{name}_count{{part="total"}}'] == 2
    assert samples[f'{name}{{part="restore",quantile="0.5"}}'] == pytest.approx(40.0)
    assert samples[f'{name}{{part="detection",quantile="0.95"}}'] == pytest.approx(3.9)


def test_demo_proof_takes_lost_steps_from_status_and_keeps_unknown(home):
    status = _json(home, "status", "rt-job")
    [audit] = _json(home, "audit", "rt-job")
    assert proof(status, audit)["steps_lost_per_reclaim"] == [6]
    open_status = _json(home, "status", "rt-open")
    [open_audit] = _json(home, "audit", "rt-open")
    assert proof(open_status, open_audit)["steps_lost_per_reclaim"] == [None]


def test_dashboard_page_carries_the_reclaim_figures(home):
    page = job_page(load_settings(str(home)), "rt-job")
    a1, _a2, a3 = page["status"]["attempts"]
    assert (a1["lost_steps"], a1["notice_outcome"]) == (6, OUTCOME)
    assert a3["time_to_resume"] == WANT_TTR
    assert page["audit"]["attempts"][1]["time_to_resume"] == WANT_TTR
    app = (Path(__file__).resolve().parent.parent / "spotrun/ui/static/app.js").read_text()
    for key in ("lost_steps", "time_to_resume", "notice_outcome", "first_step_s"):
        assert key in app   # the job page's attempts table renders each (browser test below)


def test_an_agents_last_heartbeat_landing_after_the_end_is_read_again(tmp_path):
    # The dashboard keeps one Reports: an ended attempt without an exit report may still get
    # its agent's last heartbeat; only a final report is kept.
    store = FileStore(tmp_path / "s")
    eng = new_db(tmp_path)
    make_job(eng, "j", state=JobState.RECOVERING, store_uri=store.uri, last_step=10)
    make_attempt(eng, "j", 1, start=at(0), end=at(5), reason=EndReason.RECLAIMED,
                 start_step=0, last_step=10, running_at=at(1))
    settings = load_settings(str(tmp_path))
    reports = Reports()
    key = layout.heartbeat_key("j", 1)
    _put(store, key, {"ts": "1", "phase": "running", "step": 11})
    assert status_view(settings, "j", engine=eng, reports=reports)["attempts"][0][
        "lost_steps"] == 1
    _put(store, key, {"ts": "2", "phase": "running", "step": 12})
    assert status_view(settings, "j", engine=eng, reports=reports)["attempts"][0][
        "lost_steps"] == 2
    eng.dispose()


def test_the_reclaimed_attempts_final_heartbeat_is_its_last_step_in_the_database(tmp_path):
    store = FileStore(tmp_path / "s")
    eng = new_db(tmp_path)
    make_job(eng, "j", state=JobState.RUNNING, store_uri=store.uri, last_step=0)
    att = make_attempt(eng, "j", 1, start=at(0), start_step=0, last_step=40, running_at=at(1))
    # The daemon last read step 40; the agent beat once more (step 43) before the reclaim.
    _put(store, layout.heartbeat_key("j", 1), {"ts": "9", "phase": "running", "step": 43})

    class Provider:
        def now(self) -> datetime:
            return at(10)

    ctx = DaemonContext(engine=eng, settings=load_settings(str(tmp_path)), provider=Provider(),
                        store=store)
    ReconcileLoop(ctx)._ended(att, InstanceInfo(
        instance_id=att.instance_id, instance_type=P3, zone=ZONE, market=Market.SPOT,
        state=InstanceState.TERMINATED, launched_at=at(0), ended_at=at(10),
        cause=TerminationCause.SPOT_RECLAIM), at(10))
    with session(eng) as s:
        assert s.get(Attempt, att.id).last_step == 43
    eng.dispose()


# ----------------------------------------------------------- a paced market's clock

E = T0.timestamp()   # the market's epoch: market time equals wall time there


def _paced_clock() -> MarketClock:
    """The local market's clock over the story below (wall s after E -> rate)."""
    clock = MarketClock(E, 60.0, 0, 600.0, ManualClock(E))
    for wall_s, rate in ((10, 1), (40, 60), (140, 6), (160, 60), (164, 1), (175, 60)):
        clock.set_rate(rate, E + wall_s)
    return clock


def _wall(s: float) -> datetime:
    return to_dt(E + s)


def test_causes_use_each_attempts_own_speed_on_a_paced_clock(tmp_path):
    """Attempt 1 boots (x60), starts up in real time (x1) from wall 10 s, trains at x60 from
    40 s at 20 steps a wall second, gets a notice at 140 s (x6: 400 steps in 120 market s),
    is reclaimed at 160 s at step 2400 (checkpoint 2380). Attempt 2 trains at x60 from its
    first step (175 s) to step 6380 (375 s), exits, and its instance ends a wall second later.
    The job trained the whole time: only attempt 2's last market minute is paid idle, though
    steps per market second differ tenfold between the notice and the rest."""
    clock = _paced_clock()

    def market(wall_s: float) -> datetime:
        return to_dt(clock.market_s(E + wall_s))

    def to_market(t: datetime) -> datetime:
        return to_dt(clock.market_s(t.timestamp()))

    store = FileStore(tmp_path / "store")
    eng = new_db(tmp_path)
    make_job(eng, "paced", state=JobState.SUCCEEDED, store_uri=store.uri, last_step=6380,
             work={"total_steps": 6380})
    a1 = make_attempt(eng, "paced", 1, start=market(0), end=market(160),
                      reason=EndReason.RECLAIMED, start_step=0, last_step=2380,
                      running_at=market(40))
    _put(store, layout.heartbeat_key("paced", 1), {"ts": _iso(_wall(160)), "phase": "running",
                                                    "step": 2400, "notice": True})
    _reclaimed_event(eng, "paced", a1.id, _wall(161))
    a2 = make_attempt(eng, "paced", 2, start=market(163), end=market(376),
                      reason=EndReason.COMPLETED, start_step=2380, last_step=6380,
                      running_at=market(175))
    _set(eng, a2.id, created_at=_wall(162))
    _put(store, layout.heartbeat_key("paced", 2), {
        "ts": _iso(_wall(375)), "phase": "exited", "step": 6380, "resumed_from": 2380,
        "restore_started_at": _iso(_wall(164)), "restore_done_at": _iso(_wall(174)),
        "first_step_at": _iso(_wall(175))})
    _put(store, layout.exit_key("paced", 2), {"ts": _iso(_wall(375)), "exit_code": 0,
                                              "reason": "completed", "step": 6380})
    settings = load_settings(str(tmp_path))
    [ja] = audit_view(settings, ["paced"], hindsight=False, engine=eng, to_market=to_market)
    one, two = ja.attempts
    assert one.causes["paid_idle"].hours == pytest.approx(0.0, abs=1e-12)
    assert two.causes["paid_idle"].hours == pytest.approx(60 / 3600)
    assert ja.causes["paid_idle"].hours == pytest.approx(60 / 3600)
    # Each attempt at its own speed: attempt 2 made 4000 steps in 12,000 market s.
    assert two.steps_per_hour == pytest.approx(4000 / 12000 * 3600)
    assert two.causes["productive"].hours == pytest.approx(12000 / 3600)
    # Attempt 1's 20 unsaved steps: its 6,120 s of training by steps.
    assert one.lost_steps == 20
    assert one.causes["lost_work"].hours == pytest.approx(6120 * 20 / 2400 / 3600)
    assert ja.causes_total_usd() == pytest.approx(ja.actual_usd, abs=1e-9)
    # Time to resume, each wall time on the market's clock: every part at x60 but the
    # restore and the first step, which ran in real time.
    assert two.time_to_resume == {"detection_s": 60.0, "waiting_s": 60.0, "launch_s": 60.0,
                                  "boot_s": 60.0, "restore_s": 10.0, "first_step_s": 1.0,
                                  "total_s": 251.0, "first_step_from": "agent",
                                  "from_attempt": 1}
    st = status_view(settings, "paced", engine=eng, to_market=to_market)
    assert st["attempts"][1]["time_to_resume"] == two.time_to_resume
    assert st["attempts"][0]["lost_steps"] == 20
    eng.dispose()


def test_quantiles_interpolate_between_ranks():
    assert quantile([], 0.5) is None
    assert quantile([7.0], 0.95) == 7.0
    assert quantile([100.0, 155.0], 0.95) == pytest.approx(152.25)
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == pytest.approx(2.5)


def test_a_notice_without_outcome_reads_as_none(tmp_path):
    # An older agent's notice.json has no outcome: null, never a crash or a made-up text.
    store = FileStore(tmp_path / "s")
    eng = new_db(tmp_path)
    make_job(eng, "j", state=JobState.RECOVERING, store_uri=store.uri, last_step=10)
    make_attempt(eng, "j", 1, start=at(0), end=at(5), reason=EndReason.RECLAIMED,
                 start_step=0, last_step=10, running_at=at(1))
    _put(store, layout.notice_key("j", 1), {"ts": "1", "action": "terminate",
                                             "emergency_checkpoint_step": 10})
    settings = load_settings(str(tmp_path))
    [a] = status_view(settings, "j", engine=eng)["attempts"]
    assert a["notice_outcome"] is None and a["lost_steps"] == 0
    _put(store, layout.notice_key("j", 1), {"ts": "1", "outcome": 42})   # wrong type
    [a] = status_view(settings, "j", engine=eng)["attempts"]
    assert a["notice_outcome"] is None
    eng.dispose()


@pytest.mark.slow
def test_browser_job_page_shows_lost_steps_time_to_resume_and_notice(home):
    driver = _browser()   # skips, saying why, without Chromium or Selenium
    # Selenium is an optional (dev) dependency: imported once _browser found it.
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    server = make_server(load_settings(str(home)), port=0)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    try:
        driver.get(f"http://127.0.0.1:{server.server_address[1]}/job/rt-job")
        WebDriverWait(driver, 60).until(
            lambda d: d.execute_script("return document.body.dataset.ready === '1'"))
        rows = {r.get_attribute("data-attempt"): r for r in
                driver.find_elements(By.CSS_SELECTOR, "#attempts tbody tr")}
        assert rows["1"].find_element(By.CSS_SELECTOR, "td.lost").text == "6"
        assert rows["1"].find_element(By.CSS_SELECTOR, "td.notice").text == OUTCOME
        assert rows["2"].find_element(By.CSS_SELECTOR, "td.lost").text == "-"
        ttr = rows["3"].find_element(By.CSS_SELECTOR, "td.ttr").text
        assert ttr.startswith("2m35s") and "4.0s + 56.0s + 20.0s + 30.0s + 40.0s + 5.0s" in ttr
    finally:
        driver.quit()
        server.shutdown()
        server.server_close()

"""Project and owner budgets in the daemon's loops, as docs/budgets.md describes them.

The scheduler, spend and reconcile loops run against the real local market (in-process, a
hand-moved clock at time scale 1: the provider's clock is the manual one, started just
before a UTC midnight), the real submit path and SQLite. Every launch commits the stop
margin at the spot price: 60 s at $2/h = $0.0333 (budget_helpers.COMMIT_USD). The clock
moves in steps of the daemon's 5 s check interval (the margin counts one), as a daemon's
loops would see it.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlmodel import select

from budget_helpers import COMMIT_USD, PRICE, BudgetRig
from polling import wait_for
from spotrun.cli import cli
from spotrun.db import Job, SpendEntry, attempts_of, session
from spotrun.decide.waitkind import reason_kind
from spotrun.db.outbox import NotifyOutbox
from spotrun.states import EndReason, JobState
from spotrun.ui.views import budgets_view

DAY1 = datetime(2030, 1, 1, 23, 0, tzinfo=timezone.utc)   # an hour before midnight (UTC)
HOOK = '[notify]\nwebhooks = ["ops=http://127.0.0.1:9/hook"]\n'


@pytest.fixture
def rigs(tmp_path: Path, instance_command: str, monkeypatch: pytest.MonkeyPatch):
    made: list[BudgetRig] = []

    def make(extra_toml: str, start: datetime = DAY1, price: float = PRICE) -> BudgetRig:
        root = tmp_path / f"rig{len(made)}"
        monkeypatch.setenv("SPOTRUN_HOME", str(root / "home"))
        monkeypatch.delenv("SPOTRUN_DB_URL", raising=False)
        rig = BudgetRig(root, instance_command, start, extra_toml, price=price)
        made.append(rig)
        return rig
    yield make
    for rig in made:
        rig.close()


def _budgets(rig: BudgetRig) -> dict[str, dict]:
    """`spotrun budgets --json`'s view, read on the rig's clock (the CLI reads the real one)."""
    return {f"{b['scope']}:{b['name']}": b
            for b in budgets_view(rig.settings, engine=rig.ctx.engine, now=rig.now())}


def _spent(rig: BudgetRig, project: str = "ml") -> float:
    """The ledger's total for one project's jobs."""
    with session(rig.ctx.engine) as s:
        return sum(r.usd for r, j in s.exec(select(SpendEntry, Job).where(
            SpendEntry.job_id == Job.id, Job.project == project)))


def _run_until_stopped(rig: BudgetRig, job: str) -> None:
    """Book and check every 5 s (the daemon's check interval) until the job is flagged."""
    while not rig.jobs()[job].budget_stop_requested:
        rig.advance(2)   # + the tick's 3 s
        rig.book()
        rig.tick()


def test_a_project_at_its_budget_waits_stops_and_starts_again_next_day(rigs):
    # Two launches' commitments and a bit a day: a third would pass it.
    budget = round(2.4 * COMMIT_USD, 4)
    rig = rigs(f'[budgets.project.ml]\nusd = {budget}\nperiod = "day"\n' + HOOK)
    ids = [rig.submit(f"j{k}") for k in range(3)]
    other = rig.submit("elsewhere", project="other")    # no budget: never held
    rig.tick()
    jobs = rig.jobs()
    started = [j for j in ids if jobs[j].state is JobState.STARTING]
    assert len(started) == 2 and jobs[other].state is JobState.STARTING
    [held] = [j for j in ids if j not in started]
    assert jobs[held].state is JobState.QUEUED
    why = jobs[held].reason
    assert why.startswith("budget project ml: ") and reason_kind(why) == "budget"
    assert "today (2030-01-01)" in why, why
    # Passes go on, spend is booked: the reason's figures change, its kind does not.
    for _ in range(3):
        rig.book()
        rig.tick()
    waiting = [e for e in rig.events("waiting") if e.job_id == held]
    assert len(waiting) == 1
    b = _budgets(rig)["project:ml"]
    assert b["period_key"] == "2030-01-01" and b["budget_usd"] == budget
    # (plus the seconds run since the last booking)
    assert b["committed_usd"] == pytest.approx(2 * COMMIT_USD, abs=0.012)
    assert sorted(b["running_jobs"]) == sorted(started) and b["queued_jobs"] == 1

    # Spend booked every check: once spend plus commitments pass the budget, the
    # project's running jobs are asked to save and stop.
    while not rig.jobs()[started[0]].budget_stop_requested:
        rig.advance(2)   # + the tick's 3 s: the 5 s check interval
        rig.book()
        rig.tick()
    for j in started:
        assert rig.jobs()[j].budget_stop_requested
    stops = rig.events("budget_stop_requested")
    assert sorted(e.job_id for e in stops) == sorted(started)
    assert all(e.detail.startswith("budget project ml reached: ") for e in stops)
    assert not rig.jobs()[other].budget_stop_requested
    # The reconcile loop carries the stop out (the agent stand-in never saves: after the
    # grace it terminates), and they end budget_exhausted.

    def all_stopped() -> bool:
        rig.advance(5)
        rig.reconcile()
        js = rig.jobs()
        return all(js[j].state is JobState.BUDGET_EXHAUSTED for j in started)
    wait_for(all_stopped, 30, "the project's jobs to stop")
    rig.book()
    for _ in range(3):
        rig.tick()
    assert rig.jobs()[held].state is JobState.QUEUED   # still no room today
    spent_day1 = _spent(rig)
    assert 0.8 * budget <= spent_day1 <= budget   # never over
    status = CliRunner().invoke(cli, ["status", started[0], "--json"],
                                env={"SPOTRUN_HOME": str(rig.home)})
    assert json.loads(status.output)["reason"] == "budget project ml reached (2030-01-01)"
    # Alerts: 80 % and 100 % once each for this budget and day, however many passes saw
    # them (the unreachable webhook keeps the rows queued).
    with session(rig.ctx.engine) as s:
        keys = sorted(r.event_key for r in s.exec(select(NotifyOutbox))
                      if ":project:ml:" in r.event_key)
    assert keys == [f"budget_100:project:ml:2030-01-01:{budget:g}",
                    f"budget_80:project:ml:2030-01-01:{budget:g}"], keys

    # Midnight: a new day resumes the stopped jobs and launches again up to the budget.
    rig.advance(3600)
    rig.tick()
    jobs = rig.jobs()
    resumed = rig.events("resumed")
    assert sorted(e.job_id for e in resumed) == sorted(started)
    assert all(e.detail == "new budget period: project ml today (2030-01-02)"
               for e in resumed)
    assert sum(jobs[j].state is JobState.STARTING for j in ids) == 2
    assert sum(jobs[j].state in (JobState.QUEUED, JobState.RECOVERING) for j in ids) == 1
    assert _budgets(rig)["project:ml"]["period_key"] == "2030-01-02"
    with session(rig.ctx.engine) as s:
        keys = {r.event_key for r in s.exec(select(NotifyOutbox))}
    assert not any("2030-01-02" in k for k in keys)   # nothing crossed yet today


def test_an_owner_budget_inside_a_project_budget(rigs):
    rig = rigs('[budgets]\nallow_owner_override = true\n'
               '[budgets.project.ml]\nusd = 100.0\nperiod = "month"\n'
               f'[budgets.owner.alice]\nusd = {1.2 * COMMIT_USD:.4f}\nperiod = "week"\n')
    a1, a2 = rig.submit("a1", owner="alice"), rig.submit("a2", owner="alice")
    b1 = rig.submit("b1", owner="bob")
    elsewhere = rig.submit("a3", owner="alice", project="other")
    rig.tick()
    jobs = rig.jobs()
    # Alice's week holds one launch (5/6 of it), whichever project it is in; Bob's job
    # spends from the project alone.
    assert jobs[a1].state is JobState.STARTING and jobs[b1].state is JobState.STARTING
    assert jobs[a2].state is JobState.QUEUED and jobs[elsewhere].state is JobState.QUEUED
    assert jobs[a2].reason.startswith("budget owner alice: ")
    assert "this week (2030-W01)" in jobs[a2].reason
    b = _budgets(rig)
    assert b["owner:alice"]["committed_usd"] == pytest.approx(COMMIT_USD, abs=0.002)
    assert b["project:ml"]["committed_usd"] == pytest.approx(2 * COMMIT_USD, abs=0.002)
    assert b["project:ml"]["period_key"] == "2030-01"
    assert {j["owner"] for j in json.loads(CliRunner().invoke(
        cli, ["status", "--json"], env={"SPOTRUN_HOME": str(rig.home)}).output)} == {
            "alice", "bob"}


def test_a_job_stopped_by_a_budget_resumes_by_hand_and_waits_for_room(rigs):
    budget = round(2 * COMMIT_USD, 4)
    rig = rigs(f'[budgets.project.ml]\nusd = {budget}\nperiod = "total"\n')
    job = rig.submit("solo")
    rig.tick()
    _run_until_stopped(rig, job)
    assert rig.jobs()[job].budget_stop_scope == "project:ml@total"
    wait_for(lambda: (rig.advance(5), rig.reconcile(),
                      rig.jobs()[job].state is JobState.BUDGET_EXHAUSTED)[-1], 30,
             "the stop")
    rig.book()
    res = CliRunner().invoke(cli, ["resume", job], env={"SPOTRUN_HOME": str(rig.home)})
    assert res.exit_code == 0, res.output
    rig.advance(86400 * 40)   # a `total` budget never turns over
    rig.tick()
    j = rig.jobs()[job]
    assert j.state is JobState.RECOVERING and not j.budget_stop_requested
    assert j.reason.startswith("budget project ml: ") and "in total" in j.reason
    assert len(rig.live_attempts()) == 0
    with session(rig.ctx.engine) as s:
        [attempt] = attempts_of(s, job)
    assert attempt.end_reason is EndReason.BUDGET
    assert COMMIT_USD < _spent(rig) <= budget


def test_a_pass_reads_the_budgets_once_whatever_the_queue(rigs):
    # Jobs held by a budget cost a pass no statement each: the budgets' figures are read
    # set-based once per pass, and the held jobs' reasons only written when they change.
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    statements: dict[int, list[int]] = {}
    for n in (4, 30):
        rig = rigs(f'[budgets.project.ml]\nusd = {COMMIT_USD / 2:.4f}\nperiod = "month"\n')
        for k in range(n):
            rig.submit(f"q{k}")
        seen: list[int] = []
        for _ in range(3):
            count = [0]

            def one(*_a: object, count: list[int] = count) -> None:
                count[0] += 1
            event.listen(Engine, "before_cursor_execute", one)
            try:
                rig.tick()
            finally:
                event.remove(Engine, "before_cursor_execute", one)
            seen.append(count[0])
        statements[n] = seen
        jobs = rig.jobs()
        assert all(j.state is JobState.QUEUED and j.reason.startswith("budget project ml: ")
                   for j in jobs.values())
        assert len(rig.events("waiting")) == n   # one each, on the first pass
    assert min(statements[4]) > 0
    assert statements[30] == statements[4], statements


def test_budgets_commit_the_stop_margin_the_daemons_spend_loop_keeps(rigs):
    # One notion of committed spend: the scheduler's budget checks leave room for the margin
    # the spend loop stops jobs with (spotrun.daemon.app builds it).
    from spotrun.daemon.app import build_loops
    from spotrun.daemon.spend import SpendLoop
    rig = rigs("")
    [spend] = [s.loop for s in build_loops(rig.ctx) if isinstance(s.loop, SpendLoop)]
    assert spend.stop_margin == rig.scheduler.scopes.margin
    assert COMMIT_USD == pytest.approx(rig.scheduler.scopes.need_usd(PRICE, 1))


def test_resuming_a_project_stopped_job_sends_no_job_budget_alert(rigs):
    # The notify loop re-reads recent events (notify/events.py, OVERLAP_IDS): a resume
    # clears the job's stop mark, so the alert must be read from the stop's event itself.
    from spotrun.daemon.notify import NotifyLoop
    rig = rigs(f'[budgets.project.ml]\nusd = {2 * COMMIT_USD:.4f}\nperiod = "total"\n' + HOOK)
    notify = NotifyLoop(rig.ctx, post=lambda url, body, headers, timeout: 503)
    try:
        notify.tick(rig.now())   # the first tick sets the events watermark
        job = rig.submit("solo")
        rig.tick()
        _run_until_stopped(rig, job)
        wait_for(lambda: (rig.advance(5), rig.reconcile(),
                          rig.jobs()[job].state is JobState.BUDGET_EXHAUSTED)[-1], 30,
                 "the stop")
        notify.tick(rig.now())
        res = CliRunner().invoke(cli, ["resume", job], env={"SPOTRUN_HOME": str(rig.home)})
        assert res.exit_code == 0, res.output
        for _ in range(2):
            notify.tick(rig.now())
    finally:
        notify.deliverer.close()
    with session(rig.ctx.engine) as s:
        sent = {(r.event_key, r.text) for r in s.exec(select(NotifyOutbox))
                if r.job_id == job}
    assert [k for k, _ in sent] == [f"budget_100:{job}:project:ml@total"], sent
    [(_, text)] = sent
    assert "budget project ml reached (total)" in text and "$None" not in text


def test_the_80_percent_alert_counts_the_commitments_so_it_comes_before_the_stop(rigs):
    # The stop decision counts spent + committed; so does the 80 % alert: with a reserve
    # larger than a fifth of the budget, spend alone is under 80 % when the scope stops.
    budget = 2 * COMMIT_USD
    rig = rigs(f'[budgets.project.ml]\nusd = {budget!r}\nperiod = "total"\n' + HOOK)
    job = rig.submit("solo")
    rig.tick()
    rig.advance(1.3 * COMMIT_USD / PRICE * 3600)   # spent 1.3 reserves: 65 % of the budget
    rig.book()
    rig.tick()
    assert rig.jobs()[job].budget_stop_requested
    assert _spent(rig) < 0.8 * budget
    with session(rig.ctx.engine) as s:
        rows = [r.event for r in s.exec(select(NotifyOutbox).order_by(NotifyOutbox.id))
                if r.job_id == "project:ml"]
    assert rows == ["budget_80", "budget_100"], rows


def test_a_small_budget_stops_within_a_few_percent_of_its_limit(rigs):
    # $0.50 at $1.20/h: 25 minutes. The margin is what a stop takes (here the 60 s floor:
    # $0.02), not 15 minutes ($0.30, which stopped it near $0.21, 58 % short).
    rig = rigs('[budgets.project.ml]\nusd = 0.5\nperiod = "total"\n', price=1.2)
    job = rig.submit("small")
    rig.tick()
    _run_until_stopped(rig, job)
    wait_for(lambda: (rig.advance(5), rig.reconcile(),
                      rig.jobs()[job].state is JobState.BUDGET_EXHAUSTED)[-1], 30, "the stop")
    rig.book()
    spent = _spent(rig)
    assert 0.97 * 0.5 <= spent <= 0.5, spent   # within 3 %, never over
    # The stop was measured (request to instance gone, wall seconds), and the margin
    # follows it: one check interval plus the longest stop measured, over the floor.
    with session(rig.ctx.engine) as s:
        [attempt] = attempts_of(s, job)
        margin_s = rig.scheduler.scopes.margin.seconds(s)
    assert 20.0 <= attempt.budget_stop_wall_s <= 40.0   # the 20 s grace, then the terminate
    prior_wall_s = rig.scheduler.scopes.margin.prior_wall_s   # measured stops only raise it
    assert margin_s == max(60.0, 5.0 + max(prior_wall_s, attempt.budget_stop_wall_s))

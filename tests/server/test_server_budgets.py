"""Budgets set by admins through the team server (docs/budgets.md, docs/server.md): a real
uvicorn server over a daemon rig's home (tests/budget_helpers.py: the scheduler, spend and
reconcile loops ticked by hand against the real local market), real CLI processes."""

from __future__ import annotations


import pytest
from sqlmodel import select

from budget_helpers import COMMIT_USD, BudgetRig
from polling import wait_for
from server.harness import start_team
from spotrun.db import session
from spotrun.db.budget_rows import BudgetRow
from spotrun.db.identity import TrailEntry
from spotrun.states import JobState

def _rows(rig: BudgetRig) -> list[tuple]:
    with session(rig.ctx.engine) as s:
        return [(r.scope, r.name, r.usd, r.period, r.set_by) for r in s.exec(select(BudgetRow))]


def test_an_admins_budget_stops_a_project_on_the_running_daemon_and_its_removal_requeues(
        rig_and_team):
    rig, team = rig_and_team
    team.login("alice", "ada")
    ml, other = rig.submit("j0"), rig.submit("o0", project="other")
    rig.tick()
    assert {j: rig.jobs()[j].state for j in (ml, other)} == {
        ml: JobState.STARTING, other: JobState.STARTING}

    # A member (and a viewer) may not: 403, one line, exit 2, nothing written, trailed.
    res = team.cli("alice", "budgets", "set", "project", "ml", "--usd", "0.1",
                   "--period", "day")
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        "error: role: setting budgets needs role admin; user alice is member"], res.stderr
    with team.client("vera") as c:
        assert c.delete("/api/v1/budgets/project/ml").status_code == 403
    # Bad input from an admin: the CLI's own one line, nothing written.
    res = team.cli("ada", "budgets", "set", "project", "ml", "--usd", "-1", "--period", "day")
    assert res.returncode == 2 and res.stderr.startswith("error: --usd: must be a number > 0")
    res = team.cli("ada", "budgets", "set", "group", "ml", "--usd", "1", "--period", "day")
    assert res.returncode == 2 and res.stderr.startswith("error: SCOPE: unknown scope")
    assert _rows(rig) == []

    # The admin sets $0.02 a day: the launch alone committed more (COMMIT_USD, the stop
    # margin), so the daemon, not restarted, stops the project's running job at its next
    # pass; the other project runs on.
    assert COMMIT_USD > 0.02
    res = team.cli("ada", "budgets", "set", "project", "ml", "--usd", "0.02", "--period", "day")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "budget project ml: $0.02 per day (set by ada)"
    assert _rows(rig) == [("project", "ml", 0.02, "day", "ada")]
    rig.book()
    rig.tick()
    jobs = rig.jobs()
    assert jobs[ml].budget_stop_requested and not jobs[other].budget_stop_requested
    [stop] = rig.events("budget_stop_requested")
    assert stop.job_id == ml and stop.detail.startswith("budget project ml reached: ")
    listed = team.cli("ada", "budgets", "--wide")
    assert listed.returncode == 0 and "set by ada" in listed.stdout, listed.stdout

    def stopped() -> bool:
        rig.advance(5)
        rig.reconcile()
        return rig.jobs()[ml].state is JobState.BUDGET_EXHAUSTED
    wait_for(stopped, 30, "the project's job to stop")

    # Removing the budget (the project's only one) puts the job it stopped back in the queue.
    res = team.cli("ada", "budgets", "remove", "project", "ml")
    assert res.returncode == 0 and "none (removed)" in res.stdout, res.stdout
    rig.tick()
    resumed = [e for e in rig.events("resumed") if e.job_id == ml]
    assert [e.detail for e in resumed] == ["budget project:ml removed"]
    assert rig.jobs()[ml].state is not JobState.BUDGET_EXHAUSTED

    # The trail: the refusals as denied, the bad input as error, each change as ok.
    with session(rig.ctx.engine) as s:
        rows = [(t.user, t.action, t.target, t.outcome)
                for t in s.exec(select(TrailEntry).order_by(TrailEntry.id))]
    assert rows == [
        ("alice", "PUT /api/v1/budgets/project/ml", "project:ml", "denied"),
        ("vera", "DELETE /api/v1/budgets/project/ml", "project:ml", "denied"),
        ("ada", "budgets set", "project:ml", "error"),
        ("ada", "budgets set", "group:ml", "error"),
        ("ada", "budgets set", "project:ml", "ok"),
        ("ada", "budgets remove", "project:ml", "ok")], rows
    trail = team.cli("ada", "trail", "--json")
    assert trail.returncode == 0 and '"budgets set"' in trail.stdout

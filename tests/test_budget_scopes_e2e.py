"""End to end, on a loaded machine: a project budget holds a launch back and, once spend
crosses it, has the project's running jobs save and stop; `spotrun budgets`, `status`,
`resume` and `audit --by project` say so through the real CLI (docs/budgets.md).

The real daemon loops, the local market (x120, $1/h spot), real agents and a workload that
checkpoints on the agent's signal (tests/test_budget_e2e.py's). Before any stop is measured a
launch commits the stop margin's prior, the longest stop the daemon allows
(spotrun.ledger.stopmargin): a 0.5 s check, 0.2 + 20 + 0.2 s of reconcile ticks and save
window, the market's 5 s terminate; 25.9 wall s at x120, $0.8633 at $1/h. The $2 budget
holds two launches, not three. The two stop when their spend plus that commitment reaches
$2, after about $0.27 of spend. Their stops are measured (a few seconds), but a measured stop
never lowers the margin below the prior (a third launch let in by quick stops once overran
the budget on a loaded box), so the third job waits for good. Spend never passes the
budget, and at the end no launch fits.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlmodel import select

from conftest import kill_leftovers, write_trace
from daemon_helpers import FAST_TOML
from polling import wait_for
from spotrun.cli import cli
from spotrun.config import load_settings
from spotrun.daemon.app import build_context, build_runner
from spotrun.db import Event, Job, SpendEntry, attempts_of, session
from spotrun.jobs import submit, validate_submission
from spotrun.ledger.stopmargin import stop_margin_for
from spotrun.states import EndReason, JobState
from spotrun.ui.views import budgets_view
from test_budget_e2e import WORKLOAD

pytestmark = pytest.mark.slow
BUDGET_USD, PRIOR_USD = 2.0, (0.5 + 0.2 + 20.0 + 0.2 + 5.0) * 120 / 3600


def _jobs(ctx) -> dict[str, Job]:
    with session(ctx.engine) as s:
        return {j.id: j for j in s.exec(select(Job))}


def _budget_waits(ctx) -> list[str]:
    """Jobs that recorded waiting for the project's budget."""
    with session(ctx.engine) as s:
        return [e.job_id for e in s.exec(select(Event).where(Event.kind == "waiting"))
                if e.detail.startswith("budget project team: ")]


def _need_usd(ctx) -> float:
    """What a launch commits now (the margin follows the stops measured), at $1/h."""
    with session(ctx.engine) as s:
        return stop_margin_for(ctx.settings).seconds(s) / 3600


def _cli(home: Path, *args: str) -> dict | list:
    res = CliRunner().invoke(cli, [*args, "--json"], env={"SPOTRUN_HOME": str(home)})
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_a_project_budget_stops_its_jobs_end_to_end(tmp_home: Path, tmp_path: Path, cpu_load):
    trace = write_trace(tmp_path / "t.csv", {"za": [1] * 200}, tick_s=600.0)
    toml = FAST_TOML.format(trace=trace, scale=120.0, hb_timeout=60.0, lease_ttl=5.0)
    (tmp_home / "spotrun.toml").write_text(
        toml.replace("notice_s = 120.0", "spot_price_usd_per_hour = 1.0")
        + f'[budgets.project.team]\nusd = {BUDGET_USD}\nperiod = "total"\n')
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(WORKLOAD)
    spec = tmp_path / "job.yaml"
    # 6000 steps of 10 ms: 60 wall s, $2 each: no job finishes inside the budget (the third
    # runs the longest: about 40 wall s, the room the measured stops freed).
    spec.write_text("name: team-run\ncommand: python train.py\nworkdir: code\nproject: team\n"
                    "resources: {instance_types: [p3.2xlarge]}\n"
                    "work: {total_steps: 6000}\ncheckpoint: {interval_minutes: 5}\n"
                    "policy: {market: spot}\n")
    ctx = build_context(load_settings(str(tmp_home)))
    runner = build_runner(ctx)
    assert _need_usd(ctx) == pytest.approx(PRIOR_USD)   # nothing measured yet: the prior
    try:
        ids = [submit(validate_submission(spec, ctx.settings), ctx.engine).id for _ in range(3)]
        runner.start()

        def settled() -> bool:
            """No job of the project runs, at least two were stopped, and no room is left
            for another launch at the margin now (a job that waits now waits for good)."""
            js = _jobs(ctx)
            if any(js[j].state not in (JobState.BUDGET_EXHAUSTED, JobState.QUEUED)
                   for j in ids):
                return False
            [b] = budgets_view(ctx.settings, engine=ctx.engine)
            return b["left_usd"] < _need_usd(ctx) and not b["running_jobs"] and sum(
                js[j].state is JobState.BUDGET_EXHAUSTED for j in ids) >= 2
        wait_for(settled, 180, "the project's jobs to stop at its budget")
        runner.stop(wait=True)
        once = build_runner(ctx)   # a stopped runner runs nothing: passes of a fresh one
        once.run_once()            # book the last seconds
        jobs = _jobs(ctx)
        done = [j for j in ids if jobs[j].state is JobState.BUDGET_EXHAUSTED]
        held = [j for j in ids if j not in done]
        with session(ctx.engine) as s:
            spent = sum(r.usd for r in s.exec(select(SpendEntry)))
            runs = {j: attempts_of(s, j) for j in ids}
            for j in done:
                assert [a.end_reason for a in runs[j]] == [EndReason.BUDGET]
                assert 0 < s.get(Job, j).last_step < 6000   # saved before it stopped
            for j in held:   # it waited from the start, and no room came
                assert runs[j] == []
                assert jobs[j].reason.startswith("budget project team: ")
            stops_wall_s = [a.budget_stop_wall_s for j in done for a in runs[j]]
        # Two launches fitted at once, the third did not: it waited for the budget, and
        # launched (if at all) only once a stop was measured and freed the prior's room.
        first_two = sorted(runs[j][0].started_at for j in done)[:2]
        waited = _budget_waits(ctx)
        assert len(first_two) == 2 and len(set(waited)) == 1
        [third] = set(waited)
        if runs[third]:
            ends = [runs[j][0].ended_at for j in ids if j != third]
            assert runs[third][0].started_at >= min(ends)
        # The stops kept spend within the budget: never over it.
        print(f"spent ${spent:.4f} of the ${BUDGET_USD} budget; launches: "
              f"{sum(bool(r) for r in runs.values())}; stops measured (wall s): {stops_wall_s}")
        assert 0.1 < spent <= BUDGET_USD, spent

        [b] = _cli(tmp_home, "budgets")
        assert (b["scope"], b["name"], b["period_key"]) == ("project", "team", "total")
        assert b["spent_usd"] == pytest.approx(spent) and b["committed_usd"] == 0.0
        assert (b["stopped_jobs"], b["queued_jobs"], b["running_jobs"]) == (
            len(done), len(held), [])
        assert b["left_usd"] < _need_usd(ctx)   # no room for another launch
        shown = _cli(tmp_home, "status", done[0])
        assert shown["reason"] == "budget project team reached (total)"
        assert shown["project"] == "team"
        [group] = _cli(tmp_home, "audit", "--by", "project")
        assert group["group"] == "team" and sorted(group["jobs"]) == sorted(ids)
        assert group["actual_usd"] == pytest.approx(spent)

        # Resumed by hand, it still waits: a `total` budget has no room left.
        res = CliRunner().invoke(cli, ["resume", done[0]], env={"SPOTRUN_HOME": str(tmp_home)})
        assert res.exit_code == 0, res.output
        once.run_once()
        again = _jobs(ctx)[done[0]]
        assert again.state is JobState.RECOVERING
        assert again.reason.startswith("budget project team: ")
        with session(ctx.engine) as s:
            assert len(attempts_of(s, done[0])) == 1
    finally:
        runner.stop(wait=True)
        kill_leftovers(tmp_home / "market")

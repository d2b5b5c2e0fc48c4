"""`spotrun interrupt` from a laptop (docs/server.md): the server sends the provider's own
interruption, members to their own jobs, admins to any, each call in the trail. A daemon rig
(tests/budget_helpers.py) launches the job on the real local market."""

from __future__ import annotations

import json

from sqlmodel import select

from budget_helpers import BudgetRig
from server.harness import Team, one_line_exit_2
from spotrun.db import Job, session
from spotrun.db.identity import TrailEntry


def _alices_running_job(rig: BudgetRig) -> tuple[str, str]:
    job_id = rig.submit("j0")
    with session(rig.ctx.engine) as s:
        job = s.get(Job, job_id)
        job.owner = "alice"
        s.add(job)
        s.commit()
    rig.tick()
    [att] = rig.live_attempts()
    assert att.instance_id
    return job_id, att.instance_id


def test_members_interrupt_only_their_own_jobs_and_each_call_is_trailed(
        rig_and_team: tuple[BudgetRig, Team]) -> None:
    rig, team = rig_and_team
    team.login("alice", "bob", "vera", "ada")
    job_id, instance = _alices_running_job(rig)

    one_line_exit_2(team.cli("bob", "interrupt", job_id), "alice's", "only their own")
    one_line_exit_2(team.cli("vera", "interrupt", job_id), "role", "viewer")
    one_line_exit_2(team.cli("alice", "interrupt", job_id, "--notice-s", "-1"), "--notice-s")
    one_line_exit_2(team.cli("alice", "interrupt", "nope-1"), "no such job")
    [seen] = rig.ctx.provider.describe(instance_ids=[instance])
    assert seen.notice_at is None           # no refused call reached the provider

    res = team.cli("alice", "interrupt", job_id, "--notice-s", "30", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["id"] == job_id and out["provider"] == "local" and out["notice_s"] == 30
    assert [(i["node_rank"], i["instance_id"], i["already_noticed"])
            for i in out["instances"]] == [(0, instance, False)]
    [seen] = rig.ctx.provider.describe(instance_ids=[instance])
    assert seen.notice_at is not None       # the real market's notice, sent by the server

    # An admin may interrupt anyone's job; the pending reclaim keeps its time, as locally.
    res = team.cli("ada", "interrupt", job_id)
    assert res.returncode == 0, res.stderr
    assert res.stdout == (f"{job_id} node 0: interruption sent to {instance} (reclaim in 30 s: "
                          "one was already due sooner than the 120 s asked)\n"), res.stdout

    with session(rig.ctx.engine) as s:
        rows = [(t.user, t.action, t.target, t.outcome) for t in s.exec(
            select(TrailEntry).where(TrailEntry.action.contains("interrupt"))
            .order_by(TrailEntry.id))]
    path = f"POST /api/v1/jobs/{job_id}/interrupt"     # a refusal names the call itself
    assert rows == [("bob", path, job_id, "denied"),
                    ("vera", path, job_id, "denied"),
                    ("alice", "interrupt", "nope-1", "error"),
                    ("alice", "interrupt", job_id, "ok"),
                    ("ada", "interrupt", job_id, "ok")], rows

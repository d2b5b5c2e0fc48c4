"""One contract, two backends: the CLI's verbs give the same answers on the local home and
through the team server (RemoteBackend over a real server, as an admin)."""

from __future__ import annotations

import json

import pytest

from spotrun.backends.local import LocalBackend
from spotrun.backends.remote import RemoteBackend
from spotrun.config import load_settings
from spotrun.contracts import json_default
from spotrun.errors import BadInputError, NotFoundError, SpotrunError
from spotrun.states import JobState

from server.harness import Team, add_job


def _backends(team: Team) -> dict:
    return {"local": LocalBackend(load_settings(str(team.home))),
            "remote": RemoteBackend(team.url, team.tokens["ada"])}


def _same(data: object) -> str:
    return json.dumps(data, default=json_default, sort_keys=True)


def test_reads_are_the_same_json_either_way(team: Team) -> None:
    add_job(team.engine, "job-a", "alice")
    add_job(team.engine, "job-b", "bob", state=JobState.BUDGET_EXHAUSTED)
    b = _backends(team)
    assert _same(b["local"].status(None)) == _same(b["remote"].status(None))
    assert _same(b["local"].status("job-b", events=True)) == \
        _same(b["remote"].status("job-b", events=True))
    assert _same([a.to_dict() for a in b["local"].audit([], since=None, until=None,
                                                       hindsight=False)]) == \
        _same([a.to_dict() for a in b["remote"].audit([], since=None, until=None,
                                                     hindsight=False)])
    assert b["local"].budgets() == b["remote"].budgets() == []


@pytest.mark.parametrize("kind", ["local", "remote"])
def test_cancel_resume_and_bad_refs(team: Team, kind: str) -> None:
    add_job(team.engine, "job-q", "alice")
    add_job(team.engine, "job-x", "alice", state=JobState.BUDGET_EXHAUSTED)
    be = _backends(team)[kind]
    first = be.cancel("job-q")
    assert (first.job, first.was) == ({"id": "job-q", "state": "cancelled",
                                       "cancel_requested": True}, "queued")
    again = be.cancel("job-q")
    assert (again.job["state"], again.was) == ("cancelled", "cancelled")
    assert be.resume("job-x", 5.0) == {"id": "job-x", "state": "recovering", "budget_usd": 5.0}
    with pytest.raises(NotFoundError) as err:
        be.status("nope")
    assert str(err.value) == "JOB: no such job (see `spotrun status`)"
    with pytest.raises(NotFoundError):
        be.cancel("nope")
    with pytest.raises(BadInputError) as err:
        be.resume("job-q", None)
    assert str(err.value).startswith("JOB: job is cancelled; only budget_exhausted")


def test_logs_and_pull_are_the_same_either_way(team: Team, tmp_path) -> None:
    from server.test_server_streams import _job_with_output
    _job_with_output(team)
    b = _backends(team)
    assert b["local"].logs_json("job-l", None) == b["remote"].logs_json("job-l", None)
    assert list(b["local"].logs("job-l", 1, follow=False, poll_s=1)) == \
        list(b["remote"].logs("job-l", 1, follow=False, poll_s=1))
    got = {k: b[k].pull("job-l", tmp_path / k, checkpoint=False, show=False) for k in b}
    for k in b:
        assert got[k].pop("to") == str((tmp_path / k).resolve())
        assert (tmp_path / k / "model" / "out.txt").read_bytes() == b"weights\n"
    assert got["local"] == got["remote"]
    add_job(team.engine, "job-empty", "alice")
    for be in b.values():
        with pytest.raises(SpotrunError, match="nothing to pull"):
            be.pull("job-empty", tmp_path / "x", checkpoint=False, show=False)

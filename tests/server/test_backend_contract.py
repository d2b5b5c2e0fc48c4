"""One contract, two backends: the CLI's verbs give the same answers on the local home and
through the team server (RemoteBackend over a real server, as an admin)."""

from __future__ import annotations

import json

import pytest

from spotrun.backends.local import LocalBackend
from spotrun.backends.remote import RemoteBackend
from spotrun.config import load_settings
from spotrun.contracts import json_default
from spotrun.errors import BadInputError, NotFoundError
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

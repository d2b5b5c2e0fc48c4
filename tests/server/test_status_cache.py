"""The shared status list (spotrun.server.status_cache): who builds, when, and what a
caller sees, with an injected clock and real threads (no sleeps)."""

from __future__ import annotations

import json
import threading

import pytest

from spotrun.errors import DatabaseError
from spotrun.server.status_cache import StatusCache

from polling import wait_for


class Jobs:
    """A stand-in state: jobs by id, and a count of builds of the whole list."""

    def __init__(self, n: int = 3) -> None:
        self.jobs = {f"j{i}": {"id": f"j{i}", "state": "queued"} for i in range(n)}
        self.full_builds = 0
        self.gate: threading.Event | None = None     # set: a build waits for it
        self.started = threading.Event()
        self.fail: Exception | None = None

    def build_all(self) -> list[dict]:
        snapshot = [dict(j) for j in self.jobs.values()]   # read before any wait, as a query
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(30)
        if self.fail is not None:
            raise self.fail
        self.full_builds += 1
        return snapshot

    def build_one(self, job_id: str) -> dict:
        return dict(self.jobs[job_id])


def rig(max_age_s: float, *, background: bool = False, **kw: float
        ) -> tuple[Jobs, list[float], StatusCache]:
    """Jobs, a hand-moved clock and a cache over them."""
    jobs, clock = Jobs(), [0.0]
    return jobs, clock, StatusCache(jobs.build_all, jobs.build_one, max_age_s=max_age_s,
                                    clock=lambda: clock[0], background=background, **kw)


def listed(cache: StatusCache) -> dict[str, str]:
    return {j["id"]: j["state"] for j in json.loads(cache.body())}


def test_one_build_serves_every_call_until_it_is_older_than_max_age():
    jobs, clock, cache = rig(2.0)
    clock[0] = 100.0
    assert listed(cache) == {"j0": "queued", "j1": "queued", "j2": "queued"}
    jobs.jobs["j1"]["state"] = "running"        # the daemon's change, not this server's
    clock[0] += 1.9
    for _ in range(5):
        assert listed(cache)["j1"] == "queued"   # within max_age: the shared build
    assert jobs.full_builds == 1
    clock[0] += 0.2
    assert listed(cache)["j1"] == "running"      # older than max_age: rebuilt
    assert jobs.full_builds == 2


def test_this_servers_own_changes_show_at_once_new_jobs_last():
    jobs, clock, cache = rig(60.0)
    listed(cache)
    jobs.jobs["j9"] = {"id": "j9", "state": "queued"}      # a submit through this server
    cache.changed("j9")
    jobs.jobs["j0"]["state"] = "cancelled"                 # a cancel through this server
    cache.changed("j0")
    assert list(listed(cache).items()) == [("j0", "cancelled"), ("j1", "queued"),
                                           ("j2", "queued"), ("j9", "queued")]
    assert jobs.full_builds == 1


def test_a_change_made_while_a_build_runs_is_not_undone_by_that_build():
    jobs, clock, cache = rig(1.0, background=True)
    listed(cache)
    jobs.gate = threading.Event()
    jobs.started.clear()
    clock[0] += 5.0
    before = listed(cache)          # due: a rebuild starts on its own thread ...
    assert before["j1"] == "queued"
    assert jobs.started.wait(30)    # ... and has read the jobs as they were
    jobs.jobs["j1"]["state"] = "cancelled"
    cache.changed("j1")             # this server's cancel, while the build runs
    jobs.gate.set()
    # The build ends with j1 still queued in what it read; the cancel stays on top.
    wait_for(lambda: jobs.full_builds == 2, timeout_s=30, what="the second build")
    assert listed(cache)["j1"] == "cancelled"


def test_a_due_rebuild_never_holds_up_callers_while_a_recent_build_exists():
    jobs, clock, cache = rig(1.0, background=True, wait_after_s=30.0)
    listed(cache)
    jobs.gate = threading.Event()          # the next build blocks until released
    clock[0] += 1.5
    try:
        for _ in range(3):                 # due, but served the last build without waiting
            assert listed(cache) == {"j0": "queued", "j1": "queued", "j2": "queued"}
    finally:
        jobs.gate.set()


def test_with_nothing_built_a_failing_build_is_the_callers_error_and_later_builds_recover():
    jobs, clock = Jobs(), [0.0]
    jobs.fail = DatabaseError("database is locked", field="database")
    cache = StatusCache(jobs.build_all, jobs.build_one, max_age_s=1.0,
                        clock=lambda: clock[0], background=False)
    with pytest.raises(DatabaseError):
        cache.body()
    jobs.fail = None
    assert len(listed(cache)) == 3


def test_max_age_zero_builds_for_every_call():
    jobs = Jobs()
    cache = StatusCache(jobs.build_all, jobs.build_one, max_age_s=0.0)
    listed(cache)
    jobs.jobs["j2"]["state"] = "running"
    assert listed(cache)["j2"] == "running"
    assert jobs.full_builds == 2


def test_an_entry_that_cannot_be_built_makes_the_next_call_wait_for_a_whole_build():
    jobs, clock, cache = rig(60.0)
    listed(cache)
    jobs.jobs["j7"] = {"id": "j7", "state": "queued"}
    cache.changed("nope")           # the submit is done; its entry fails: no exception here
    assert "j7" in listed(cache)    # the next call rebuilt everything, within max_age
    assert jobs.full_builds == 2

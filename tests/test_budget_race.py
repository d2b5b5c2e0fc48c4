"""Two submitters and two scheduling passes racing for one project budget never pass it by
more than one launch's commitment, on SQLite and on a real PostgreSQL (docs/budgets.md).

Two submitter processes put jobs in at the same time through the product's submit path;
then two schedulers, each with a daemon context (and database engine) of its own, run
their passes at the same moment on two threads, again and again, against the real local
market. A launch commits the stop margin at the spot price ($0.50, budget_helpers): a
budget holding four commitments keeps four, whichever pass writes them. PostgreSQL is started as
tests/test_postgres.py starts it, and the case is skipped where it cannot be.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

import pytest
from sqlmodel import select

from budget_helpers import COMMIT_USD, MARGIN_S, BudgetRig
from spotrun.daemon.live_decision import placement_for
from spotrun.daemon.scheduler import SchedulerLoop
from spotrun.decide import MAX_CANDIDATES
from spotrun.db import Attempt, Job, session
from spotrun.ledger.committed import launch_commitment_usd
from spotrun.spec import job_spec
from spotrun.states import AttemptState, JobState
from pg_helpers import pg_db, pg_url  # noqa: F401  (fixtures)

BUDGET_USD = round(4.5 * COMMIT_USD, 4)   # room for four launches' commitments
PER_SUBMITTER = 5
SUBMITTER = r'''
import sys
from spotrun.config import load_settings
from spotrun.jobs import submit, validate_submission
from spotrun.db import open_settings_db
settings = load_settings()
engine = open_settings_db(settings)
for k in range(int(sys.argv[2])):
    submit(validate_submission(sys.argv[1], settings), engine)
'''


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str | None:
    """None: the home's SQLite file; else a PostgreSQL database, emptied."""
    if request.param == "sqlite":
        return None
    return request.getfixturevalue("pg_db")


@pytest.fixture
def rig(db_url, tmp_path: Path, instance_command: str,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[BudgetRig]:
    """A home on that database whose project `race` has a month's budget of BUDGET_USD."""
    monkeypatch.setenv("SPOTRUN_HOME", str(tmp_path / "rig" / "home"))
    if db_url:
        monkeypatch.setenv("SPOTRUN_DB_URL", db_url)
    else:
        monkeypatch.delenv("SPOTRUN_DB_URL", raising=False)
    rig = BudgetRig(tmp_path / "rig", instance_command,
                    datetime(2030, 3, 10, 12, 0, tzinfo=timezone.utc),
                    f'[budgets.project.race]\nusd = {BUDGET_USD}\nperiod = "month"\n')
    try:
        yield rig
    finally:
        rig.close()


def run_together(calls: list[Callable[[], None]]) -> list[BaseException]:
    """Start every call at one barrier, each on a thread of its own; what they raised."""
    start = threading.Barrier(len(calls))
    errors: list[BaseException] = []

    def run(call: Callable[[], None]) -> None:
        try:
            start.wait(timeout=30)
            call()
        except BaseException as exc:   # the caller's assertion reports it
            errors.append(exc)
    threads = [threading.Thread(target=run, args=(c,)) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return errors


def live_commitment(rig: BudgetRig) -> tuple[list[Attempt], float]:
    """The attempts not ended, and what their launches committed in all (USD)."""
    with session(rig.ctx.engine) as s:
        live = list(s.exec(select(Attempt).where(Attempt.state != AttemptState.ENDED)))
    return live, sum(launch_commitment_usd(a.price_usd_per_hour, a.nodes, MARGIN_S)
                     for a in live)


def test_racing_submitters_and_passes_never_pass_the_budget(db_url, rig: BudgetRig,
                                                            tmp_path: Path):
    home = tmp_path / "rig" / "home"
    env_db = {"SPOTRUN_DB_URL": db_url} if db_url else {}
    spec = tmp_path / "race.yaml"
    # Jobs without a cap of their own (a cap must hold one checkpoint interval's spend,
    # more than this budget): submit accepts them all; the launches race.
    spec.write_text("name: race\ncommand: 'true'\nproject: race\n"
                    "resources: {instance_types: [p3.2xlarge]}\n"
                    "work: {reference_hours: 1.0, reference_instance: p3.2xlarge}\n"
                    "policy: {market: spot}\n")
    script = tmp_path / "submitter.py"
    script.write_text(SUBMITTER)
    # The submitters import the spotrun this test runs (PYTHONPATH: a worktree's).
    env = {"PATH": "/usr/bin:/bin", "SPOTRUN_HOME": str(home), **env_db,
           **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}}
    submitters = [subprocess.Popen([sys.executable, str(script), str(spec),
                                    str(PER_SUBMITTER)], env=env, stderr=subprocess.PIPE,
                                   text=True) for _ in range(2)]
    for p in submitters:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
    assert len(rig.jobs()) == 2 * PER_SUBMITTER

    second = rig.context()   # another daemon's: an engine of its own
    passes = [rig.scheduler, SchedulerLoop(second)]
    errors: list[BaseException] = []
    for _ in range(3):
        rig.advance(3.0)   # past a waiting job's retry delay
        errors += run_together([lambda loop=loop: loop.tick(rig.now()) for loop in passes])
    assert not errors, errors
    live, committed = live_commitment(rig)
    with session(rig.ctx.engine) as s:
        jobs = list(s.exec(select(Job)))
    assert committed <= BUDGET_USD + COMMIT_USD, (len(live), committed)
    assert len(live) == int(BUDGET_USD // COMMIT_USD)   # and the room was used
    assert len({a.job_id for a in live}) == len(live)   # one attempt per job
    waiting = [j for j in jobs if j.state is JobState.QUEUED]
    assert len(waiting) == 2 * PER_SUBMITTER - len(live)
    assert all(j.reason.startswith("budget project race: ") for j in waiting)
    second.engine.dispose()


def test_launch_intents_written_at_the_same_moment_hold_the_budget(rig: BudgetRig):
    # The unit of the guarantee: eight launches reach their intent's transaction together,
    # each from a scheduler (and database engine) of its own, every one having read the whole
    # budget left at the start of its pass. The budget check inside the transaction lets four in.
    n = 8
    ids = [rig.submit(f"r{k}", project="race") for k in range(n)]
    loops = [SchedulerLoop(rig.context()) for _ in range(n)]
    now = rig.now()
    work = []
    for loop, job_id in zip(loops, ids):
        loop.scopes.pass_start(now)
        with session(loop.ctx.engine) as s:
            job = s.get(Job, job_id)
        placed = placement_for(loop.ctx, job, job_spec(job))
        assert loop.scopes.wait_reason(job, placed.candidates[0].price_usd_per_hour, 1) \
            is None   # each pass alone sees room
        work.append((loop, job, placed.candidates[:MAX_CANDIDATES]))
    errors = run_together([lambda loop=loop, job=job, choices=choices:
                           loop._start_attempt(job, [], choices, now)
                           for loop, job, choices in work])
    assert not errors, errors
    live, committed = live_commitment(rig)
    assert committed <= BUDGET_USD + COMMIT_USD, (len(live), committed)
    assert len(live) == int(BUDGET_USD // COMMIT_USD)
    for loop in loops:
        loop.ctx.engine.dispose()

"""Database backends: SQLite in WAL mode with a busy timeout and mode 0600; a PostgreSQL URL
works too, against a real PostgreSQL server the test starts (skipped where none is installed)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from sqlalchemy import text

from spotrun.config import load_settings
from spotrun.daemon.app import build_context, build_runner
from spotrun.daemon.lease import Lease
from spotrun.db import Job, open_db, session
from spotrun.jobs import submit, validate_submission
from spotrun.db.migrations import LATEST, missing_columns, stored_version
from spotrun.states import JobState

from conftest import kill_leftovers, write_trace
from daemon_helpers import live_instance_pids, write_home, write_job
from pg_helpers import pg_db, pg_url  # noqa: F401  (fixtures)
from polling import wait_for


def test_sqlite_is_wal_with_busy_timeout_and_owner_only(tmp_path: Path):
    path = tmp_path / "state" / "spotrun.db"
    old = os.umask(0o022)   # a permissive umask must not leak the database
    try:
        engine = open_db(f"sqlite:///{path}")
    finally:
        os.umask(old)
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA busy_timeout")).scalar() >= 5000
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    engine.dispose()


# ---------------------------------------------------------------- PostgreSQL
# The server and its per-test emptied database: tests/pg_helpers.py.


def test_postgres_old_schema_is_upgraded(pg_db: str):
    # An "older" database: today's tables made natively, then the columns added since v1
    # dropped again (native enum types stay as an older spotrun would have created them).
    engine = open_db(pg_db)
    with session(engine) as s:
        s.add(Job(id="old-1", name="old", state=JobState.RUNNING, spec_json="{}",
                  store_uri="file:///s", checkpoint_uri="file:///s/c", last_step=40))
        s.commit()
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE job DROP COLUMN budget_stop_requested"))
        conn.execute(text("ALTER TABLE attempt DROP COLUMN gpus, DROP COLUMN running_at"))
        conn.execute(text("DROP TABLE ledgermark"))
        conn.execute(text("UPDATE meta SET value = '1' WHERE key = 'schema_version'"))
    engine.dispose()
    engine = open_db(pg_db)
    assert missing_columns(engine) == {} and stored_version(engine) == LATEST
    with session(engine) as s:
        job = s.get(Job, "old-1")
        assert job.state is JobState.RUNNING and job.budget_stop_requested is False
        job.budget_stop_requested = True
        s.add(job)
        s.commit()
    with session(engine) as s:
        assert s.get(Job, "old-1").budget_stop_requested is True
    engine.dispose()


def test_postgres_lease_is_exclusive(pg_db: str):
    engine = open_db(pg_db)
    a, b = Lease(engine, ttl_s=30, owner="a"), Lease(engine, ttl_s=30, owner="b")
    assert a.try_acquire() and not b.try_acquire()
    a.release()
    assert b.try_acquire() and not a.renew()
    engine.dispose()


@pytest.mark.slow
def test_job_runs_to_completion_on_postgres(pg_db: str, tmp_home: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SPOTRUN_DB_URL", pg_db)
    trace = write_trace(tmp_path / "trace.csv", {"za": [1] * 100}, tick_s=600.0)
    write_home(tmp_home, trace)
    settings = load_settings(str(tmp_home))
    assert settings.database_url == pg_db
    ctx = build_context(settings)
    job = submit(validate_submission(write_job(tmp_path, "pg", steps=100), settings), ctx.engine)
    runner = build_runner(ctx)
    runner.start()
    try:
        def finished():
            with session(ctx.engine) as s:
                j = s.get(Job, job.id)
            return j if j.state.is_terminal() else None
        done = wait_for(finished, 90, "the job to finish on PostgreSQL")
    finally:
        runner.stop(wait=True)
        kill_leftovers(tmp_home / "market")
    assert done.state is JobState.SUCCEEDED, done.reason
    assert not live_instance_pids(tmp_home)
    ctx.engine.dispose()

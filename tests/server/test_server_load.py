"""What the team server's concurrency needs of the shared read code: a reader holds one
database connection at a time, so as many concurrent readers as the pool has connections
cannot deadlock waiting for a second one (bench/api.py found it at 20 clients)."""

from __future__ import annotations

from pathlib import Path

from sqlmodel import create_engine

from spotrun.config import load_settings
from spotrun.db import open_db
from spotrun.states import JobState
from spotrun.ui.views import status_view

from test_ledger_support import make_job


def test_status_of_a_queued_job_without_a_daemon_needs_one_connection(tmp_path: Path,
                                                                       monkeypatch) -> None:
    monkeypatch.delenv("SPOTRUN_HOME", raising=False)
    settings = load_settings(str(tmp_path / "home"))
    open_db(settings.database_url).dispose()
    engine = open_db(settings.database_url)
    make_job(engine, "job-q", state=JobState.QUEUED)   # no daemon: its reason says so
    engine.dispose()
    # One connection and a short wait: a second connection taken while the first is held
    # (the old lease check inside the view's session) times out here instead of after 30 s.
    one = create_engine(settings.database_url, pool_size=1, max_overflow=0, pool_timeout=1,
                        connect_args={"check_same_thread": False})
    try:
        listed = status_view(settings, engine=one)
        single = status_view(settings, "job-q", engine=one)
    finally:
        one.dispose()
    assert [j["id"] for j in listed] == ["job-q"]
    assert "spotrun daemon" in listed[0]["reason"]
    assert "spotrun daemon" in single["reason"]

"""CLI conventions on every verb: logs by attempt with separators, unknown attempts are bad
input, `--json` on logs and resume."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from spotrun import layout
from spotrun.cli import cli
from spotrun.config import load_settings
from spotrun.db import open_db
from spotrun.states import EndReason, JobState
from spotrun.store import open_store

from test_ledger_support import at, make_attempt, make_job


def _home(tmp_home: Path):
    settings = load_settings(str(tmp_home))
    engine = open_db(settings.database_url)
    store_uri = (tmp_home / "store").as_uri()
    make_job(engine, "job-l", state=JobState.BUDGET_EXHAUSTED, store_uri=store_uri,
             budget_usd=1.0)
    make_attempt(engine, "job-l", 1, start=at(0), end=at(60), reason=EndReason.RECLAIMED)
    make_attempt(engine, "job-l", 2, start=at(70), end=at(90), reason=EndReason.BUDGET)
    store = open_store(store_uri)
    store.put_bytes(f"{layout.log_prefix('job-l', 1)}/000000.log", b"step 1\nstep 2\n")
    return engine


def _run(tmp_home: Path, *args: str):
    return CliRunner().invoke(cli, list(args), env={"SPOTRUN_HOME": str(tmp_home)})


def test_logs_separate_attempts_and_say_when_one_printed_nothing(tmp_home: Path) -> None:
    _home(tmp_home)
    res = _run(tmp_home, "logs", "job-l")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].startswith("== attempt 1 (") and "reclaimed" in lines[0]
    assert lines[1:3] == ["step 1", "step 2"]
    assert lines[3].startswith("== attempt 2 (") and lines[4] == "(no output)"


def test_logs_of_an_unknown_attempt_is_bad_input(tmp_home: Path) -> None:
    _home(tmp_home)
    res = _run(tmp_home, "logs", "job-l", "--attempt", "99")
    assert res.exit_code == 2
    assert "--attempt" in res.output and "1-2" in res.output
    assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output


def test_logs_and_resume_speak_json(tmp_home: Path) -> None:
    _home(tmp_home)
    res = _run(tmp_home, "logs", "job-l", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert [(o["attempt"], o["end_reason"], o["output"]) for o in out] == [
        (1, "reclaimed", "step 1\nstep 2\n"), (2, "budget", "")]
    res = _run(tmp_home, "resume", "job-l", "--budget-usd", "5", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == {"id": "job-l", "state": "recovering", "budget_usd": 5.0}

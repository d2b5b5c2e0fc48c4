"""The first hour with a daemon (issue 22, point 4): `logs -f` before the first attempt, and a
command that cannot start, on the real local market with real agents, store and SQLite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from spotrun.config import load_settings
from spotrun.daemon.app import build_context, build_runner
from spotrun.db import Job, attempts_of, session
from spotrun.states import EndReason, JobState

from conftest import kill_leftovers, write_trace
from daemon_helpers import DaemonProc, submit_job, write_home, write_job
from polling import wait_for

pytestmark = pytest.mark.slow


class Lines:
    """A pipe read line by line on a thread, so a test can poll what came with a deadline."""

    def __init__(self, pipe) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe) -> None:
        for line in pipe:
            self.lines.append(line.rstrip("\n"))

    def having(self, text: str) -> list[str]:
        """The lines that contain text."""
        return [line for line in list(self.lines) if text in line]


def test_logs_follow_says_why_before_the_first_attempt_then_follows(tmp_home, tmp_path):
    trace = write_trace(tmp_path / "trace.csv", {"za": [1] * 300}, tick_s=600.0)
    write_home(tmp_home, trace)
    job_id = submit_job(tmp_home, write_job(tmp_path, "follow", steps=30))
    env = dict(os.environ, SPOTRUN_HOME=str(tmp_home))
    env.pop("SPOTRUN_DB_URL", None)
    logs = subprocess.Popen([sys.executable, "-m", "spotrun", "logs", "-f", job_id,
                             "--poll-s", "0.2"], env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    out, err = Lines(logs.stdout), Lines(logs.stderr)
    daemon = None
    try:
        said = wait_for(lambda: err.having("has no attempt yet"), 60,
                        "logs -f to say the job has no attempt")
        assert said[0].startswith(f"job {job_id} has no attempt yet (queued: no daemon is "
                                  "running") and said[0].endswith("waiting...")
        assert logs.poll() is None and out.lines == []     # it waits, it does not exit
        daemon = DaemonProc(tmp_home, tmp_path / "daemon.log")
        wait_for(lambda: logs.poll() is not None, 120, "logs -f to end with the job")
        assert logs.returncode == 0, err.lines
    finally:
        if logs.poll() is None:
            logs.kill()
        logs.wait(timeout=10)
        if daemon is not None:
            daemon.terminate()
        kill_leftovers(tmp_home / "market")
    wait_for(lambda: out.having("done"), 10, "the reader to drain the pipe")
    assert out.lines[0].startswith("== attempt 1 (") and out.having("start 0")
    assert len(err.having("has no attempt yet")) <= 3, err.lines   # once per reason, no spam


@pytest.fixture
def daemon(tmp_home: Path, tmp_path: Path):
    """An in-process daemon on a fast local market that always has capacity."""
    trace = write_trace(tmp_path / "trace.csv", {"za": [1] * 300, "zb": [1] * 300}, tick_s=600.0)
    write_home(tmp_home, trace, scale=600.0)
    ctx = build_context(load_settings(str(tmp_home)))
    runner = build_runner(ctx)
    yield ctx, runner
    runner.stop(wait=True)
    kill_leftovers(tmp_home / "market")


def _spec(tmp_path: Path, name: str, command: str, script: str | None = None,
          restarts: int | None = None) -> Path:
    lines = [f"name: {name}", f"command: {command}", "work: {total_steps: 10}",
             "policy: {market: spot"
             + (f", max_restarts_on_error: {restarts}" if restarts is not None else "") + "}"]
    if script is not None:
        code = tmp_path / f"code-{name}"
        code.mkdir()
        (code / "job.py").write_text(script)
        lines.append(f"workdir: {code}")
    spec = tmp_path / f"{name}.yaml"
    spec.write_text("\n".join(lines) + "\n")
    return spec


# A different exit code on each instance, before any step: not the same failure twice.
VARYING = '''
import os, sys
print("attempt", os.environ["SPOTRUN_ATTEMPT"], "cannot start", file=sys.stderr)
sys.exit(1 + int(os.environ["SPOTRUN_ATTEMPT"]))
'''
# The same exit code every time, but after the job reported a step.
AFTER_A_STEP = '''
import json, os, sys
with open(os.environ["SPOTRUN_PROGRESS_FILE"], "w") as f:
    json.dump({"step": 1, "total_steps": 10}, f)
print("crashed at step 1", file=sys.stderr)
sys.exit(3)
'''


def test_a_command_that_cannot_start_fails_after_two_attempts_saying_why(daemon, tmp_home,
                                                                        tmp_path):
    """`python trian.py` (a typo): the same exit before any step on two instances ends the job
    (not max_restarts_on_error + 1 paid launches), with python's own words in the reason.
    Failures that differ, or come after a step, still get the whole error budget."""
    ctx, runner = daemon
    typo = submit_job(tmp_home, _spec(tmp_path, "typo", "python trian.py"))
    varying = submit_job(tmp_home, _spec(tmp_path, "varying", "python job.py", VARYING,
                                         restarts=2))
    stepped = submit_job(tmp_home, _spec(tmp_path, "stepped", "python job.py", AFTER_A_STEP,
                                         restarts=2))
    runner.start()

    def job(job_id: str) -> Job:
        with session(ctx.engine) as s:
            return s.get(Job, job_id)
    wait_for(lambda: all(job(j).state.is_terminal() for j in (typo, varying, stepped)), 180,
             "the three jobs to end")
    runner.stop(wait=True)
    with session(ctx.engine) as s:
        atts = {j: attempts_of(s, j) for j in (typo, varying, stepped)}

    failed = job(typo)
    assert failed.state is JobState.FAILED, failed.reason
    assert [a.end_reason for a in atts[typo]] == [EndReason.ERROR] * 2
    assert "can't open file" in failed.reason and "trian.py" in failed.reason, failed.reason
    assert "exit code 2" in failed.reason and "failed 2 time(s)" in failed.reason
    assert "\n" not in failed.reason   # one line, as status shows it

    for job_id, last in ((varying, "attempt 3 cannot start"), (stepped, "crashed at step 1")):
        j = job(job_id)
        assert j.state is JobState.FAILED, j.reason
        assert [a.end_reason for a in atts[job_id]] == [EndReason.ERROR] * 3, j.reason
        assert "failed 3 time(s)" in j.reason and last in j.reason, j.reason

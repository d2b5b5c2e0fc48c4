"""The daemon's log is one JSON stream: structlog events and stdlib records alike, on stderr."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from spotrun.checkpoints import checkpoint_name, put_checkpoint_files
from spotrun.config import load_settings
from spotrun.db import open_db
from spotrun.store import open_store
from daemon_helpers import jobs_and_attempts, submit_job, write_home, write_job
from conftest import kill_leftovers, write_trace
from polling import wait_for

pytestmark = pytest.mark.slow


def test_daemon_stderr_is_json_only_including_stdlib_records(tmp_home: Path,
                                                             tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "trace.csv", {"za": [1] * 100}, tick_s=600.0)
    write_home(tmp_home, trace)
    job_id = submit_job(tmp_home, write_job(tmp_path, "logs", steps=40))
    # A checkpoint with a truncated file: the checkpoint library logs the skip through stdlib
    # logging, which must come out as JSON like everything else.
    settings = load_settings(str(tmp_home))
    engine = open_db(settings.database_url)
    job = jobs_and_attempts(engine)[0][job_id]
    store = open_store(job.checkpoint_uri)
    put_checkpoint_files(store, 5, {"state.json": json.dumps({"step": 5}).encode()})
    store.put_bytes(f"{checkpoint_name(5)}/state.json", b"{}")
    out, err = open(tmp_path / "out.log", "wb"), open(tmp_path / "err.log", "wb")
    env = dict(os.environ, SPOTRUN_HOME=str(tmp_home))
    proc = subprocess.Popen([sys.executable, "-m", "spotrun", "daemon"], env=env,
                            stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                            start_new_session=True)
    try:
        wait_for(lambda: any(a.instance_id for a in jobs_and_attempts(engine)[1]),
                 timeout_s=60, what="a launch")
        wait_for(lambda: b"spotrun.checkpoints" in (tmp_path / "err.log").read_bytes(),
                 timeout_s=30, what="the checkpoint library's stdlib record")
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        out.close()
        err.close()
        engine.dispose()
        kill_leftovers(tmp_home / "market")
    lines = (tmp_path / "err.log").read_text().splitlines()
    assert lines
    records = [json.loads(line) for line in lines]          # every line is one JSON object
    assert all({"event", "level", "timestamp"} <= set(r) for r in records)
    assert any(r.get("logger") == "spotrun.checkpoints" and r["level"] == "warning"
               for r in records)
    assert any(r["event"] == "launched" for r in records)

"""Security: credentials only from the AWS default chain; secrets never land in the database,
the store, the daemon log or the market's console logs; a job cannot reach another's prefix."""

from __future__ import annotations

import re
import secrets as pysecrets
from pathlib import Path

import pytest

from spotrun.config import Settings, load_settings
from spotrun.daemon.service import health
from spotrun.db import Job, open_db, session
from spotrun.errors import SpecError, StoreError
from spotrun.jobs import validate_submission
from spotrun.store import open_store

from conftest import kill_leftovers, write_trace
from daemon_helpers import DaemonProc, submit_job, write_home, write_job
from polling import wait_for

REPO = Path(__file__).resolve().parent.parent
CREDENTIAL_WORDS = re.compile(r"aws_access_key_id|aws_secret_access_key|AKIA[0-9A-Z]{16}",
                              re.IGNORECASE)


def test_credentials_come_only_from_the_default_chain():
    offenders = []
    for path in sorted((REPO / "spotrun").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if CREDENTIAL_WORDS.search(line):
                offenders.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert offenders == [], "credentials must come from the AWS default chain:\n" + \
        "\n".join(offenders)
    names = {f for f in Settings.__dataclass_fields__} | \
        {f for f in Settings().aws.__dataclass_fields__}
    assert not [n for n in names if re.search(r"key_id|secret|password|token", n)], names


def test_health_check_never_shows_a_database_password(tmp_home: Path):
    settings = load_settings(str(tmp_home), overrides={
        "db_url": "postgresql+psycopg://spotrun:hunter2-pw@127.0.0.1:1/spotrun"})
    ok, reason, detail = health(settings)
    assert not ok
    assert "hunter2-pw" not in reason + repr(detail)


def test_job_names_and_paths_cannot_reach_another_jobs_prefix(tmp_home: Path, tmp_path: Path):
    settings = load_settings(str(tmp_home))
    for bad in ("../other", "a/b", "Other", "x" * 70, "-lead"):
        spec = tmp_path / "bad.yaml"
        spec.write_text(f"name: '{bad}'\ncommand: echo\n")
        with pytest.raises(SpecError) as err:
            validate_submission(spec, settings)
        assert err.value.field == "name"
    spec = tmp_path / "dots.yaml"
    spec.write_text("name: dots\ncommand: echo\ncheckpoint: {uri: 'file:///tmp/a/../b'}\n")
    with pytest.raises(SpecError) as err:
        validate_submission(spec, settings)
    assert err.value.field == "checkpoint.uri"
    # Two jobs naming the same checkpoint URI still get a prefix each.
    spec = tmp_path / "shared.yaml"
    spec.write_text("name: shared\ncommand: echo\ncheckpoint: {uri: 'file:///tmp/ckpts'}\n")
    a, b = validate_submission(spec, settings), validate_submission(spec, settings)
    assert a.checkpoint_uri != b.checkpoint_uri
    assert not a.checkpoint_uri.startswith(b.checkpoint_uri + "/")
    # A job's view of the store cannot step out of its prefix.
    store = open_store((tmp_path / "store").as_uri())
    store.put_bytes("jobs/b/secret.json", b"{}")
    view = store.sub("jobs/a")
    for key in ("../b/secret.json", "/jobs/b/secret.json", "x/../../b/secret.json"):
        with pytest.raises(StoreError):
            view.get_bytes(key)


@pytest.mark.slow
def test_secret_values_are_never_written_down(tmp_home: Path, tmp_path: Path):
    secret = "tok-" + pysecrets.token_hex(12)
    trace = write_trace(tmp_path / "trace.csv", {"za": [1] * 100}, tick_s=600.0)
    write_home(tmp_home, trace)
    job_id = submit_job(tmp_home, write_job(tmp_path, "secretive", steps=60,
                                            secrets={"API_TOKEN": "env:SPOTRUN_TEST_SECRET"}))
    log = tmp_path / "daemon.log"
    d = DaemonProc(tmp_home, log, env={"SPOTRUN_TEST_SECRET": secret})
    engine = open_db(f"sqlite:///{tmp_home / 'spotrun.db'}")
    try:
        def finished():
            with session(engine) as s:
                j = s.get(Job, job_id)
            return j if j.state.is_terminal() else None
        done = wait_for(finished, 90, "the job to finish")
        assert d.terminate() == 0
    finally:
        if d.proc.poll() is None:
            d.kill()
        engine.dispose()
        kill_leftovers(tmp_home / "market")
    assert done.state.value == "succeeded", done.reason
    store_files = [p for p in (tmp_home / "store").rglob("*") if p.is_file()]
    shipped = b"".join(p.read_bytes() for p in store_files if "/logs/" in str(p))
    # The job did receive and print the secret (so the search below can find a leak) ...
    assert b"secret=***" in shipped, shipped[-500:]
    # ... and no copy of it was written anywhere spotrun writes.
    places = [tmp_home / "spotrun.db", tmp_home / "spotrun.db-wal", log, *store_files,
              *(tmp_home / "market").glob("*.log"),
              *(tmp_home / "market").glob("instances/*/console.log")]
    leaks = [str(p) for p in places if p.exists() and secret.encode() in p.read_bytes()]
    assert leaks == [], leaks

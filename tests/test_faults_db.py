"""Database faults: concurrent first opens, a frozen write-lock holder, broken database files,
bad settings that must write nothing, and what `daemon --check` and `doctor` say about them.

Real processes and real SQLite files throughout: a child takes `BEGIN IMMEDIATE` and is
SIGSTOPped; races are started from a barrier so they really overlap.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import kill_leftovers, write_trace
from daemon_helpers import DaemonProc, write_home
from faults_helpers import (CliZygote, FrozenLocker, assert_one_line_failure, break_db,
                            cli_env, fresh_db, proc_state, sqlite_rows)
from polling import wait_for
from pg_helpers import pg_db, pg_url  # noqa: F401  (a real PostgreSQL server, or a skip)

FAST_DB = "db_busy_timeout_s = 0.5\n"


# The CLI's processes (~100 here): each a fresh process of its own, forked from one
# interpreter per module that imported spotrun once (tests/zygote.py).
@pytest.fixture(scope="module")
def cli():
    zygote = CliZygote()
    yield zygote
    zygote.close()


@pytest.fixture(scope="module")
def cli_unprivileged():
    """As cli, without the capabilities that let root ignore file modes."""
    zygote = CliZygote(unprivileged=True)
    yield zygote
    zygote.close()


def _job_spec(tmp_path: Path, workdir: bool = False) -> Path:
    lines = ["name: faulty", f"command: {sys.executable} -c pass", "work: {total_steps: 10}"]
    if workdir:
        code = tmp_path / "code"
        code.mkdir(exist_ok=True)
        (code / "train.py").write_text("print('hi')\n" * 1000)
        lines.append(f"workdir: {code}")
    spec = tmp_path / "job.yaml"
    spec.write_text("\n".join(lines) + "\n")
    return spec


@contextlib.contextmanager
def _no_market_left(home: Path):
    try:
        yield
    finally:
        kill_leftovers(home / "market")


# ---------------------------------------------------------------- item 3: concurrent first open

def test_concurrent_first_open_of_a_fresh_database_never_fails(tmp_path: Path, cli: CliZygote):
    homes = [tmp_path / f"home{i}" for i in range(6)]
    for h in homes:
        h.mkdir()
    # Six races, one per fresh home: three fresh processes released from one barrier (forked
    # from the zygote: they race on the database's first open, not on interpreter start-up).
    # One home at a time, so that on a loaded box no racer starves behind other homes'.
    procs = [p for h in homes
             for p in cli.run_all([["status", "--json"]] * 3, [cli_env(h)] * 3, timeout_s=180)]
    failures = []
    for p in procs:
        out, err = p.stdout, p.stderr
        if p.returncode != 0 or "Traceback" in err or json.loads(out or "null") != []:
            failures.append((p.returncode, err.strip().splitlines()[-1:] if err else out[-200:]))
    assert failures == [], failures
    for h in homes:
        db = h / "spotrun.db"
        assert sqlite_rows(db, "SELECT value FROM meta WHERE key='schema_version'") != []


def test_concurrent_first_open_on_postgresql_never_fails(pg_url: str, tmp_path: Path,  # noqa: F811
                                                        cli: CliZygote):
    from sqlalchemy import create_engine, text
    failures = []
    homes = [tmp_path / f"home{round_no}" for round_no in range(4)]
    for home in homes:
        home.mkdir()
    for home in homes:   # each round: four fresh processes released from one barrier
        engine = create_engine(pg_url)
        with engine.begin() as conn:       # a fresh, empty database each round
            conn.execute(text("DROP SCHEMA public CASCADE"))
            conn.execute(text("CREATE SCHEMA public"))
        engine.dispose()
        env = cli_env(home, SPOTRUN_DB_URL=pg_url)
        for p in cli.run_all([["status", "--json"]] * 4, [env] * 4, timeout_s=180):
            if p.returncode != 0 or "Traceback" in p.stderr:
                failures.append((p.returncode, p.stderr.strip().splitlines()[-1:]))
    assert failures == [], failures


def test_two_daemons_started_together_one_runs_one_waits(tmp_path: Path, cli: CliZygote):
    homes = []
    for i in range(2):
        home = tmp_path / f"home{i}"
        home.mkdir()
        trace = write_trace(tmp_path / f"trace{i}.csv", {"za": [1] * 20}, tick_s=600.0)
        write_home(home, trace, lease_ttl=30.0)
        homes.append(home)
    # Two daemons on each home, all four released from one barrier.
    procs = cli.spawn_all([["daemon"]] * 4, [cli_env(h) for h in homes for _ in range(2)],
                          [tmp_path / f"daemon{i}.log" for i in range(4)])
    try:
        for i, home in enumerate(homes):
            pair = procs[2 * i:2 * i + 2]

            def settled() -> bool:
                # The lease row names one of the two, and both are still running.
                rows = sqlite_rows(home / "spotrun.db",
                                   "SELECT value FROM meta WHERE key='daemon_lease'") \
                    if (home / "spotrun.db").exists() else []
                return bool(rows) and all(p.poll() is None for p in pair) and \
                    json.loads(rows[0][0])["pid"] in {p.pid for p in pair}

            wait_for(lambda: settled() or any(p.poll() is not None for p in pair), 90,
                     "one daemon to hold the lease")
            dead = [(p.returncode, p.log_path.read_text()[-1500:]) for p in pair
                    if p.poll() is not None]
            assert dead == [], dead
            assert settled()
    finally:
        for p in procs:
            try:
                p.terminate(timeout_s=30)
            except subprocess.TimeoutExpired:
                p.kill()
        for home in homes:
            kill_leftovers(home / "market")


# ---------------------------------------------------------------- item 4: a frozen lock holder

def test_submit_against_a_frozen_write_lock_fails_in_one_line_and_leaves_no_bundle(
        tmp_home: Path, tmp_path: Path, cli: CliZygote):
    (tmp_home / "spotrun.toml").write_text(FAST_DB)
    db = fresh_db(tmp_home / "spotrun.db")
    spec = _job_spec(tmp_path, workdir=True)
    with FrozenLocker(db) as locker, _no_market_left(tmp_home):
        proc = cli.run(tmp_home, "submit", str(spec))
        line = assert_one_line_failure(proc, "locked")
        assert "0.5" in line                 # says how long it waited
        assert f"pid {locker.proc.pid} (stopped" in line    # and who holds the lock
        stored = list((tmp_home / "store").rglob("*")) if (tmp_home / "store").exists() else []
        assert [p for p in stored if p.is_file()] == []   # no bundle without a job row
        cancel = cli.run(tmp_home, "cancel", "nosuch")
        assert cancel.returncode in (1, 2) and "Traceback" not in cancel.stderr
        once = cli.run(tmp_home, "daemon", "--once")     # must write its lease: bounded
        assert_one_line_failure(once, "locked")
        # Readers are not blocked by a writer (WAL): status still answers.
        status = cli.run(tmp_home, "status", "--json")
        assert status.returncode == 0 and json.loads(status.stdout) == [], status.stderr
    assert sqlite_rows(db, "SELECT id FROM job") == []
    # Once the lock is gone the same submit works: bundle and row together.
    ok = cli.run(tmp_home, "submit", "--json", str(spec))
    assert ok.returncode == 0, ok.stderr
    job_id = json.loads(ok.stdout)["id"]
    assert sqlite_rows(db, "SELECT bundle_key FROM job") == [(f"jobs/{job_id}/bundle.tar.gz",)]
    assert (tmp_home / "store" / "jobs" / job_id / "bundle.tar.gz").is_file()


def test_waiting_daemon_takes_over_from_a_frozen_lease_holder(tmp_home: Path, tmp_path: Path):
    trace = write_trace(tmp_path / "trace.csv", {"za": [1] * 20}, tick_s=600.0)
    write_home(tmp_home, trace, lease_ttl=2.0)
    toml = tmp_home / "spotrun.toml"
    toml.write_text(FAST_DB + toml.read_text())   # top-level keys before the tables
    db = fresh_db(tmp_home / "spotrun.db")
    log = tmp_path / "b.log"
    daemon = None
    with FrozenLocker(db, lease_ttl_s=2.0) as holder:
        try:
            daemon = DaemonProc(tmp_home, log)
            wait_for(lambda: '"lease_acquired"' in log.read_text(errors="replace")
                     or daemon.proc.poll() is not None, 90,
                     "the waiting daemon to take the lease over")
            assert daemon.proc.poll() is None, log.read_text()[-3000:]
            rows = sqlite_rows(db, "SELECT value FROM meta WHERE key='daemon_lease'")
            assert json.loads(rows[0][0])["pid"] == daemon.proc.pid
            wait_for(lambda: holder.proc.poll() is not None, 30, "the frozen holder to be gone")
            assert '"lease_holder_killed"' in log.read_text()
            assert daemon.terminate() == 0
        finally:
            if daemon is not None and daemon.proc.poll() is None:
                daemon.kill()
            kill_leftovers(tmp_home / "market")


# ---------------------------------------------------------------- item 5: unreadable database

FAULTS = ["garbage", "truncated", "directory", "readonly-file", "readonly-dir"]


@pytest.mark.parametrize("fault", FAULTS)
def test_every_command_gives_one_line_for_a_broken_database(fault: str, tmp_home: Path,
                                                            tmp_path: Path, request):
    trace = write_trace(tmp_path / "trace.csv", {"za": [1] * 20}, tick_s=600.0)
    write_home(tmp_home, trace)
    toml = (tmp_home / "spotrun.toml").read_text()
    break_db(tmp_home, fault)
    if fault == "readonly-dir":   # break_db pointed db_url at the read-only folder
        (tmp_home / "spotrun.toml").write_text(
            (tmp_home / "spotrun.toml").read_text() + toml)
    spec = _job_spec(tmp_path)
    ro = fault.startswith("readonly")
    cli = request.getfixturevalue("cli_unprivileged" if ro else "cli")
    try:
        for args in (["status"], ["status", "--json"], ["submit", str(spec)], ["audit"],
                     ["cancel", "somejob"], ["daemon"], ["daemon", "--once"]):
            proc = cli.run(tmp_home, *args)
            assert_one_line_failure(proc, "database")
    finally:
        kill_leftovers(tmp_home / "market")
        if fault == "readonly-dir":
            (tmp_home / "ro").chmod(0o700)


# ---------------------------------------------------------------- item 11a: bad input writes nothing

def test_unknown_provider_writes_nothing(tmp_home: Path, tmp_path: Path, cli: CliZygote):
    (tmp_home / "spotrun.toml").write_text('provider = "nope"\n')
    spec = _job_spec(tmp_path)
    for args in (["daemon", "--once"], ["daemon"], ["status"], ["submit", str(spec)],
                 ["audit"], ["daemon", "--check"]):
        proc = cli.run(tmp_home, *args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert "provider" in proc.stderr and "local" in proc.stderr and "Traceback" not in \
            proc.stderr
        assert sorted(p.name for p in tmp_home.iterdir()) == ["spotrun.toml"], args


def test_looking_up_a_missing_job_on_a_fresh_home_writes_nothing(tmp_home: Path,
                                                                  cli: CliZygote):
    for args in (["cancel", "nosuch"], ["resume", "nosuch"], ["logs", "nosuch"],
                 ["status", "nosuch"], ["audit", "nosuch"]):
        proc = cli.run(tmp_home, *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "nosuch" in proc.stderr and "Traceback" not in proc.stderr
        assert list(tmp_home.iterdir()) == [], args


def test_bad_database_url_is_bad_input(tmp_home: Path, cli: CliZygote):
    proc = cli.run(tmp_home, "status", SPOTRUN_DB_URL="nosuchdialect://x/y")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "db_url" in proc.stderr or "SPOTRUN_DB_URL" in proc.stderr
    assert list(tmp_home.iterdir()) == []


# ---------------------------------------------------------------- daemon --check and doctor

def _newer_schema(home: Path) -> None:
    db = fresh_db(home / "spotrun.db")
    import sqlite3
    conn = sqlite3.connect(db)
    conn.execute("UPDATE meta SET value='999' WHERE key='schema_version'")
    conn.commit()
    conn.close()


@pytest.mark.parametrize("fault,words", [("garbage", ["not a SQLite database"]),
                                         ("directory", ["directory"]),
                                         ("newer", ["v999", "newer"]),
                                         ("locked", ["locked"])])
def test_check_and_doctor_name_the_database_fault(fault: str, words: list[str],
                                                  tmp_home: Path, cli: CliZygote):
    (tmp_home / "spotrun.toml").write_text(FAST_DB)
    locker = None
    if fault == "newer":
        _newer_schema(tmp_home)
    elif fault == "locked":
        locker = FrozenLocker(fresh_db(tmp_home / "spotrun.db"))
    else:
        break_db(tmp_home, fault)
    before = sorted((p.name, p.stat().st_size) for p in tmp_home.iterdir() if p.is_file())
    try:
        check = cli.run(tmp_home, "daemon", "--check", "--json")
        assert check.returncode == 1 and "Traceback" not in check.stderr, check.stderr
        reason = json.loads(check.stdout)["reason"]
        assert "database" in reason and all(w in reason for w in words), reason
        doctor = cli.run(tmp_home, "doctor")
        assert doctor.returncode == 1 and "Traceback" not in doctor.stderr, doctor.stderr
        db_lines = [ln for ln in doctor.stdout.splitlines() if ln.startswith("database")]
        assert len(db_lines) == 1 and all(w in db_lines[0] for w in words), doctor.stdout
        if locker is not None:
            assert f"pid {locker.proc.pid} (stopped" in db_lines[0]
        dj = cli.run(tmp_home, "doctor", "--json")
        checks = json.loads(dj.stdout)["checks"]
        assert [c["status"] for c in checks if c["name"] == "database"] == ["fix"]
    finally:
        if locker is not None:
            assert proc_state(locker.proc.pid) == "T"
            locker.close()
    after = sorted((p.name, p.stat().st_size) for p in tmp_home.iterdir() if p.is_file())
    assert after == before    # a check writes nothing


def test_check_and_doctor_say_ok_for_a_healthy_database(tmp_home: Path, cli: CliZygote):
    fresh_db(tmp_home / "spotrun.db")
    doctor = cli.run(tmp_home, "doctor", "--json")
    assert doctor.returncode == 0, doctor.stderr
    checks = json.loads(doctor.stdout)["checks"]
    assert [c["status"] for c in checks if c["name"] == "database"] == ["ok"]
    check = cli.run(tmp_home, "daemon", "--check", "--json")
    assert check.returncode == 1 and "no daemon holds the lease" in json.loads(check.stdout)[
        "reason"]
    assert os.path.exists(tmp_home / "spotrun.db")


def test_a_job_row_that_cannot_be_written_takes_its_bundle_with_it(tmp_home: Path,
                                                                    tmp_path: Path):
    from spotrun.config import load_settings
    from spotrun.db import open_db
    from spotrun.jobs import submit, validate_submission
    settings = load_settings(str(tmp_home))
    engine = open_db(settings.database_url)
    # A real SQLite failure at the moment the row is written (after the upload).
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TRIGGER refuse_jobs BEFORE INSERT ON job "
                             "BEGIN SELECT RAISE(ABORT, 'refused by the fault test'); END")
    sub = validate_submission(_job_spec(tmp_path, workdir=True), settings)
    with pytest.raises(Exception, match="refused by the fault test"):
        submit(sub, engine)
    store = tmp_home / "store"
    left = [p for p in store.rglob("*") if p.is_file()] if store.exists() else []
    assert left == []                   # no bundle without its row
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TRIGGER refuse_jobs")
    job = submit(sub, engine)           # the same submission once the database takes it
    assert (store / "jobs" / job.id / "bundle.tar.gz").is_file()
    with pytest.raises(Exception, match="already taken"):
        submit(sub, engine)             # a taken id: its bundle is neither replaced nor lost
    assert (store / "jobs" / job.id / "bundle.tar.gz").is_file()
    engine.dispose()


def test_an_unreachable_postgresql_server_is_one_line(tmp_home: Path, cli: CliZygote):
    pytest.importorskip("psycopg")
    import socket
    with socket.socket() as s:          # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql+psycopg://spotrun:secretpw@127.0.0.1:{port}/spotrun"
    (tmp_home / "spotrun.toml").write_text(FAST_DB)
    for args in (["status"], ["daemon", "--check"], ["doctor"]):
        proc = cli.run(tmp_home, *args, SPOTRUN_DB_URL=url)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert "secretpw" not in proc.stdout + proc.stderr     # never echo the password
        said = proc.stderr if args == ["status"] else proc.stdout
        assert f"127.0.0.1:{port}" in said and "unreachable" in said, said
    assert sorted(p.name for p in tmp_home.iterdir()) == ["spotrun.toml"]


def test_daemon_check_reads_as_one_line_without_json(tmp_home: Path, cli: CliZygote) -> None:
    """A person at a terminal gets one line; `--json` gives the object (tests above)."""
    check = cli.run(tmp_home, "daemon", "--check")
    assert check.returncode == 1 and "Traceback" not in check.stderr, check.stderr
    assert check.stdout.startswith("not ok: ") and len(check.stdout.strip().splitlines()) == 1

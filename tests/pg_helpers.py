"""A real, throwaway PostgreSQL server for tests (skipped where none is installed).

Import the fixtures into a test module: `from pg_helpers import pg_db, pg_url  # noqa: F401`.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text


def _pg_bin() -> Path | None:
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    return Path(dirs[-1]) if dirs else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def pg_url(tmp_path_factory: pytest.TempPathFactory):
    """A throwaway PostgreSQL server on 127.0.0.1; its SQLAlchemy URL."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed (pip install 'psycopg[binary]', the dev extra)")
    bindir = _pg_bin()
    if bindir is None or not (bindir / "initdb").exists():
        pytest.skip("no PostgreSQL server binaries (pg_ctl/initdb) on this machine")
    # Not under pytest's tmp dir: that is private to this user, and the server may run as another.
    root = Path(tempfile.mkdtemp(prefix="spotrun-pg-"))
    data, sock = root / "data", root / "sock"
    sock.mkdir()
    prefix: list[str] = []
    if os.geteuid() == 0:
        # initdb refuses to run as root: run the server as an unprivileged user.
        runuser = shutil.which("runuser")
        if runuser is None:
            pytest.skip("running as root without runuser: cannot start PostgreSQL")
        prefix = [runuser, "-u", "nobody", "--"]
        os.chmod(root, 0o777)
        os.chown(sock, 65534, 65534)
    port = _free_port()
    log = root / "pg.log"
    run = lambda *argv: subprocess.run(prefix + list(argv), capture_output=True,  # noqa: E731
                                       text=True, timeout=120)
    out = run(str(bindir / "initdb"), "-D", str(data), "-U", "spotrun", "--auth=trust",
              "--no-sync")
    if out.returncode != 0:
        pytest.skip(f"initdb failed here: {out.stderr.strip()[-300:]}")
    out = run(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60", "-o",
              f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off", "start")
    if out.returncode != 0:
        pytest.skip(f"PostgreSQL did not start: {out.stderr.strip()[-300:]}")
    yield f"postgresql+psycopg://spotrun@127.0.0.1:{port}/postgres"
    run(str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop")
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_db(pg_url: str):
    """The server's database, emptied for each test."""
    engine = create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()
    return pg_url

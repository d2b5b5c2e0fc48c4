"""Helpers for the database fault suite: CLI processes, a frozen write-lock holder, broken files."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from polling import wait_for
from zygote import Zygote

# Holds SQLite's write lock (BEGIN IMMEDIATE plus a write), says so, then freezes itself.
# With argv[2] it first takes the daemon lease for argv[2] seconds, as a daemon would.
LOCKER = r'''
import os, signal, sqlite3, sys
url = "sqlite:///" + sys.argv[1]
if len(sys.argv) > 2:
    from spotrun.daemon.lease import Lease
    from spotrun.db import open_db
    engine = open_db(url)
    assert Lease(engine, ttl_s=float(sys.argv[2]), owner="frozen-holder").try_acquire()
    engine.dispose()
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
conn.execute("BEGIN IMMEDIATE")
conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('fault_probe', 'held')")
print("locked", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
conn.execute("COMMIT")
'''

def cli_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a CLI process on home."""
    env = dict(os.environ, SPOTRUN_HOME=str(home))
    env.pop("SPOTRUN_DB_URL", None)
    env.update(extra)
    return env


class CliZygote(Zygote):
    """The CLI's processes on a test home, forked from a zygote (tests/zygote.py)."""

    def run(self, home: Path, *args: str, timeout_s: float = 120.0,
            **extra_env: str) -> subprocess.CompletedProcess:
        """`python -m spotrun ARGS` on home (one fresh process); the finished process."""
        return self.run_all([list(args)], [cli_env(home, **extra_env)], timeout_s)[0]


def assert_one_line_failure(proc: subprocess.CompletedProcess, *words: str) -> str:
    """Exit 1, no traceback, exactly one line on stderr that mentions each word."""
    err = proc.stderr.strip()
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    assert proc.returncode == 1, (proc.returncode, proc.stdout[-500:], err[-2000:])
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def proc_state(pid: int) -> str:
    """The kernel's one-letter state of pid ('T' when stopped), '' when gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


class FrozenLocker:
    """A real process holding the database's write lock, frozen with SIGSTOP."""

    def __init__(self, db_path: Path, lease_ttl_s: float | None = None) -> None:
        args = [sys.executable, "-c", LOCKER, str(db_path)]
        if lease_ttl_s is not None:
            args.append(str(lease_ttl_s))
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True,
                                     env=dict(os.environ), start_new_session=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.strip() == "locked", line
        wait_for(lambda: proc_state(self.proc.pid) == "T", 30, "the locker to stop itself")

    def close(self) -> None:
        """SIGKILL (a stopped process dies too) and reap."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def __enter__(self) -> "FrozenLocker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def fresh_db(path: Path) -> Path:
    """A database made by spotrun itself at path (then closed)."""
    from spotrun.db import open_db
    engine = open_db(f"sqlite:///{path}")
    engine.dispose()
    return path


def break_db(home: Path, fault: str) -> Path:
    """Put the database of home into one of the fault states; returns its path."""
    path = home / "spotrun.db"
    if fault == "garbage":
        path.write_bytes(b"this is not a database, only bytes\n" * 40)
    elif fault == "truncated":
        fresh_db(path)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 3])
    elif fault == "directory":
        path.mkdir()
    elif fault == "readonly-file":
        fresh_db(path)
        path.chmod(0o400)
    elif fault == "readonly-dir":
        sub = home / "ro"
        sub.mkdir()
        path = fresh_db(sub / "spotrun.db")
        for side in sub.glob("spotrun.db-*"):
            side.unlink()
        sub.chmod(0o500)
        (home / "spotrun.toml").write_text(f'db_url = "sqlite:///{path}"\n')
    else:
        raise ValueError(fault)
    for side in path.parent.glob("spotrun.db-*") if fault in ("garbage", "truncated") else []:
        side.unlink()
    return path


def sqlite_rows(path: Path, sql: str) -> list[tuple]:
    """Rows of one query on a SQLite file, read with the plain sqlite3 module."""
    conn = sqlite3.connect(path, timeout=30)
    try:
        return conn.execute(sql).fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):   # a database still being created
            return []
        raise
    finally:
        conn.close()

"""A look at the state database that changes nothing: readable, write lock free, which schema
version (`spotrun doctor`, `daemon --check`)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import inspect, text

from spotrun.db.engine import make_engine
from spotrun.db.faults import (check_sqlite_file, database_error, describe_holders, sqlite_path,
                               where)
from spotrun.errors import DatabaseError


@dataclass(frozen=True)
class Probe:
    """What a look at the database found, without writing anything."""

    ok: bool
    kind: str            # ok | missing | unreadable | locked | newer | older | unreachable
    message: str
    schema_version: int | None = None


def probe(url: str, *, timeout_s: float, latest: int) -> Probe:
    """Look at the database without changing it: readable, write lock free, schema version."""
    what = where(url)
    path = sqlite_path(url)
    if path is not None:
        if not path.exists() and not path.is_dir():
            return Probe(False, "missing", f"database {what} does not exist yet")
        try:
            check_sqlite_file(path)
        except DatabaseError as exc:
            return Probe(False, "locked" if "locked" in exc.message else "unreadable",
                         f"database {exc.message}")
        return _probe_sqlite(path, what, timeout_s, latest)
    return _probe_sqlalchemy(url, what, timeout_s, latest)


def _probe_sqlite(path: Path, what: str, timeout_s: float, latest: int) -> Probe:
    try:
        conn = sqlite3.connect(path, timeout=timeout_s, isolation_level=None)
    except sqlite3.Error as exc:
        return Probe(False, "unreadable", f"database {what} cannot be opened: {exc}")
    try:
        version = _version(conn.execute)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                holders = describe_holders(path) or " by another process"
                return Probe(False, "locked", f"database {what} is locked{holders} "
                             f"(its write lock was not free for {timeout_s:g} s)", version)
            raise
    except sqlite3.Error as exc:
        err = database_error(exc, what=what, timeout_s=timeout_s)
        kind = "locked" if err is not None and "locked" in err.message else "unreadable"
        return Probe(False, kind, f"database {err.message if err else exc}")
    finally:
        conn.close()
    return _judge(what, version, latest)


def _version(execute: Any) -> int | None:
    try:
        row = execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return None
        raise
    return int(row[0]) if row else None


def _probe_sqlalchemy(url: str, what: str, timeout_s: float, latest: int) -> Probe:
    try:
        engine = make_engine(url, busy_timeout_s=timeout_s)   # bounded connect and lock waits
        try:
            with engine.connect() as conn:
                version = None
                if inspect(conn).has_table("meta"):
                    row = conn.execute(text("SELECT value FROM meta WHERE key='schema_version'")
                                       ).fetchone()
                    version = int(row[0]) if row else None
        finally:
            engine.dispose()
    except Exception as exc:  # any failure to reach the database is the answer itself
        err = database_error(exc, what=what, timeout_s=timeout_s)
        msg = err.message if err else f"{what} is unreachable: {type(exc).__name__}"
        return Probe(False, "unreachable", f"database {msg}")
    return _judge(what, version, latest)


def _judge(what: str, version: int | None, latest: int) -> Probe:
    if version is not None and version > latest:
        return Probe(False, "newer", f"database {what} has schema v{version}, newer than this "
                     f"spotrun (v{latest}): upgrade spotrun", version)
    if version is not None and version < latest:
        return Probe(False, "older", f"database {what} has schema v{version}; this spotrun "
                     f"upgrades it to v{latest} on its next open", version)
    return Probe(True, "ok", f"database {what} is readable, its write lock is free, "
                 f"schema v{version if version is not None else latest}", version)

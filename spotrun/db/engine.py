"""The state database's engine: SQLite tuned for one writer and many readers (WAL, a bounded
busy timeout) or any SQLAlchemy URL; opening runs the schema upgrade under the schema lock."""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import event as sa_event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import ArgumentError, NoSuchModuleError
from sqlmodel import Session, create_engine

from spotrun.db.faults import check_sqlite_file, database_error, remember, schema_lock, sqlite_path
from spotrun.db.migrations import upgrade
from spotrun.errors import ConfigError, NotFoundError

DEFAULT_BUSY_TIMEOUT_S = 10.0   # settings.db_busy_timeout_s overrides it


def _sqlite_pragmas(busy_timeout_s: float) -> Any:
    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        # The timeout first, so even switching to WAL waits out a racing opener.
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        # WAL lets the CLI read while the daemon writes.
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()
    return on_connect


def make_engine(url: str, *, busy_timeout_s: float | None = None,
                check_file: bool = True) -> Engine:
    """An engine for url with SQLite tuned for one writer and many readers (no schema work).

    Every lock wait is bounded by busy_timeout_s; a file that cannot be a database, or a URL
    that cannot be parsed, is refused here with one clear line. check_file=False is for a
    second engine on a database this process already has open: looking at the file opens and
    closes it, and closing any descriptor of it drops the POSIX locks SQLite's open
    connections hold on it (another process may then reset the WAL under them).
    """
    timeout_s = DEFAULT_BUSY_TIMEOUT_S if busy_timeout_s is None else busy_timeout_s
    remember(url, timeout_s)
    path = sqlite_path(url)
    if path is not None and not check_file:
        engine = create_engine(url, connect_args={"check_same_thread": False,
                                                  "timeout": timeout_s})
        sa_event.listen(engine, "connect", _sqlite_pragmas(timeout_s))
        return engine
    if path is not None:
        check_sqlite_file(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            # The database holds the job history and spend: readable by its owner only.
            fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
            os.close(fd)
        engine = create_engine(url, connect_args={"check_same_thread": False,
                                                  "timeout": timeout_s})
        sa_event.listen(engine, "connect", _sqlite_pragmas(timeout_s))
        return engine
    try:
        connect_args: dict[str, Any] = {}
        if url.startswith("postgresql"):
            # Bounded waits on PostgreSQL too: for locks and for the connection itself.
            connect_args = {"options": f"-c lock_timeout={max(1, int(timeout_s * 1000))}",
                            "connect_timeout": max(2, int(timeout_s + 0.999))}
        return create_engine(url, pool_pre_ping=True, connect_args=connect_args)
    except (ArgumentError, NoSuchModuleError, ValueError) as exc:
        raise ConfigError(f"not a usable database URL ({exc})", field="db_url",
                          value=url.split("@")[-1],
                          hint="sqlite:///ABS/PATH or postgresql+psycopg://USER@HOST/DB; "
                               "set in spotrun.toml or SPOTRUN_DB_URL") from None


def init_db(engine: Engine, *, busy_timeout_s: float | None = None) -> None:
    """Create missing tables, upgrade an older schema, record the version (several processes
    may do this at once: it runs under the schema lock, with a bounded wait)."""
    timeout_s = DEFAULT_BUSY_TIMEOUT_S if busy_timeout_s is None else busy_timeout_s
    try:
        with schema_lock(engine, timeout_s):
            upgrade(engine)
    except Exception as exc:
        err = database_error(exc, timeout_s=timeout_s)
        if err is None:
            raise
        raise err from None


def open_db(url: str, *, busy_timeout_s: float | None = None) -> Engine:
    """make_engine + init_db: a database ready for use, or one clear DatabaseError."""
    engine = make_engine(url, busy_timeout_s=busy_timeout_s)
    try:
        init_db(engine, busy_timeout_s=busy_timeout_s)
    except BaseException:
        engine.dispose()
        raise
    return engine


def open_settings_db(settings: Any) -> Engine:
    """open_db for settings: its database URL and its `db_busy_timeout_s`."""
    return open_db(settings.database_url, busy_timeout_s=settings.db_busy_timeout_s)


def database_missing(settings: Any) -> bool:
    """True when the settings' SQLite database file does not exist yet (nothing to look up)."""
    path = sqlite_path(settings.database_url)
    return path is not None and not path.exists() and not path.is_dir()


def open_state_db(settings: Any, job_ref: str | None = None) -> Engine:
    """The state database for a verb (bounded waits from settings).

    A verb that looks up job_ref on a home with no database yet finds nothing, and creates
    nothing: bad input writes nothing.
    """
    if job_ref is not None and database_missing(settings):
        raise NotFoundError(f"no such job {job_ref!r}", field="JOB", value=job_ref,
                            hint="no job has been submitted to this database yet")
    return open_settings_db(settings)


def session(engine: Engine) -> Session:
    """A new session; callers use it as a context manager."""
    return Session(engine, expire_on_commit=False)

"""Database faults turned into one clear line: file checks, error wording, the schema lock.

Every open of the state database goes through here, so a broken file (garbage, truncated,
a directory, read-only), a lock held by another process, or a schema from a newer spotrun
becomes a `DatabaseError` (exit 1) naming the database and what to do, never a traceback.
Waits are bounded by the `db_busy_timeout_s` setting.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sqlite3
import struct
from pathlib import Path
from typing import Any, Callable, Iterator

from spotrun.errors import DatabaseError

SQLITE_HEADER = b"SQLite format 3\x00"
LOCK_SUFFIX = ".lock"
_POLL_S = 0.02

# The database this process opened last, for errors raised far from the open.
_last: dict[str, Any] = {"where": "the state database", "timeout_s": None}


def sqlite_path(url: str) -> Path | None:
    """The file of a sqlite:/// URL, else None."""
    return Path(url[len("sqlite:///"):]) if url.startswith("sqlite:///") else None


def where(url: str) -> str:
    """How messages name the database: the file for SQLite, the URL without password else."""
    path = sqlite_path(url)
    if path is not None:
        return str(path)
    try:
        from sqlalchemy.engine import make_url
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparsable URL is reported elsewhere; never echo a password
        return url.split("@")[-1]


def remember(url: str, timeout_s: float) -> None:
    """Record the database being opened, so later errors can name it."""
    _last.update(where=where(url), timeout_s=timeout_s)


def _fail(what: str, message: str, hint: str) -> DatabaseError:
    return DatabaseError(f"{what} {message}", field="database", value=what, hint=hint)


def check_sqlite_file(path: Path, *, need_write: bool = True) -> None:
    """Raise DatabaseError if path cannot be a usable SQLite database (missing is fine)."""
    what = str(path)
    if path.is_dir():
        raise _fail(what, "is a directory, not a database file",
                    "move it aside; spotrun creates a fresh database there")
    if not path.exists():
        parent = _existing_parent(path.parent)
        if not parent.is_dir():
            raise _fail(what, f"cannot be created: {parent} is a file, not a folder",
                        "point SPOTRUN_HOME (or db_url) at a folder")
        if need_write and not os.access(parent, os.W_OK | os.X_OK):
            raise _fail(what, f"cannot be created: folder {parent} is read-only",
                        "give spotrun's user write access to that folder")
        return
    if not os.access(path, os.R_OK):
        raise _fail(what, "cannot be read (permission denied)",
                    "give spotrun's user read and write access to the file")
    try:
        with open(path, "rb") as f:
            head = f.read(100)
    except OSError as exc:
        raise _fail(what, f"cannot be read ({exc.strerror})",
                    "check the file and its disk") from None
    if head and not head.startswith(SQLITE_HEADER[:len(head)]):
        raise _fail(what, "is not a SQLite database (unreadable: garbage or another format)",
                    "move it aside and restore a backup, or let spotrun create a fresh one")
    # The page count is only trusted with no -wal file: a checkpoint in progress writes the
    # new header before the pages that extend the file.
    if head and (len(head) < 100 or (not Path(f"{path}-wal").exists()
                                     and _truncated(path, head))):
        raise _fail(what, "is damaged: the file is truncated (unreadable)",
                    "move it aside and restore a backup")
    if need_write:
        if not os.access(path, os.W_OK):
            raise _fail(what, "is read-only", "give spotrun's user write access to the file")
        if not os.access(path.parent, os.W_OK | os.X_OK):
            raise _fail(what, f"is in a read-only folder ({path.parent})",
                        "SQLite writes its -wal, -shm and lock files beside the database")


def _existing_parent(p: Path) -> Path:
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _truncated(path: Path, head: bytes) -> bool:
    """True when the header's page count says the file should be longer than it is."""
    page_size = struct.unpack(">H", head[16:18])[0]
    page_size = 65536 if page_size == 1 else page_size
    change_counter, pages = struct.unpack(">II", head[24:32])
    valid_for = struct.unpack(">I", head[92:96])[0]
    # The page count is only meaningful when written by the same change as the counter.
    if valid_for != change_counter or pages == 0 or page_size < 512:
        return False
    return path.stat().st_size < pages * page_size


def lock_holders(path: Path) -> list[int]:
    """Processes holding a SQLite write lock on path (from /proc/locks; [] where unknown).

    WAL mode: the write lock is byte 120 of the -shm file; rollback mode: a WRITE lock on
    the database file itself.
    """
    targets: dict[tuple[str, int], str] = {}
    for p, kind in ((Path(f"{path}-shm"), "shm"), (path, "db")):
        try:
            st = p.stat()
        except OSError:
            continue
        targets[(f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}", st.st_ino)] = kind
    pids: list[int] = []
    try:
        with open("/proc/locks", encoding="ascii") as f:
            lines = f.readlines()
    except OSError:
        return []
    for line in lines:
        parts = line.split()
        if "->" in parts:           # a waiter, not a holder
            continue
        try:
            kind_i = parts.index("ADVISORY") if "ADVISORY" in parts else parts.index("MANDATORY")
            mode, pid, dev_ino, start = parts[kind_i + 1:kind_i + 5]
            major_minor, ino = dev_ino.rsplit(":", 1)
            kind = targets.get((major_minor, int(ino)))
        except (ValueError, IndexError):
            continue
        if mode != "WRITE" or kind is None or (kind == "shm" and start != "120"):
            continue
        if int(pid) != os.getpid() and int(pid) not in pids:
            pids.append(int(pid))
    return pids


def describe_holders(path: Path | None) -> str:
    """' by pid N (stopped: cmd)' for the write-lock holders of path, '' when unknown."""
    if path is None:
        return ""
    pids = lock_holders(path)
    if not pids:
        return ""
    out = []
    for pid in pids[:3]:
        state = _proc_state(pid)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = " ".join(f.read().replace(b"\0", b" ").decode(errors="replace").split())
        except OSError:
            cmd = ""
        how = "stopped" if state in ("T", "t") else "running"
        out.append(f"pid {pid} ({how}{': ' + cmd[:60] if cmd else ''})")
    return " by " + ", ".join(out)


def _proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def database_error(exc: BaseException, *, what: str | None = None,
                   timeout_s: float | None = None) -> DatabaseError | None:
    """The one-line DatabaseError for a driver error about access to the database, else None.

    Constraint violations and programming errors are not access faults and stay as they are.
    """
    if isinstance(exc, DatabaseError):
        return exc
    from sqlalchemy.exc import DBAPIError, IntegrityError, ProgrammingError
    if isinstance(exc, (IntegrityError, ProgrammingError)):
        return None
    if isinstance(exc, DBAPIError):
        orig = exc.orig
    elif isinstance(exc, (sqlite3.OperationalError, sqlite3.DatabaseError)) \
            and not isinstance(exc, sqlite3.IntegrityError):
        orig = exc
    else:
        return None
    what = what or _last["where"]
    timeout_s = timeout_s if timeout_s is not None else _last["timeout_s"]
    text = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    low = text.lower()
    waited = f" (gave up after {timeout_s:g} s)" if timeout_s is not None else ""
    if "locked" in low or "lock timeout" in low:
        holders = describe_holders(Path(what)) if what.startswith("/") else ""
        return _fail(what, f"is locked{holders or ' by another process'}{waited}",
                     "a process holds its write lock: end it, or wake it if stopped")
    if "not a database" in low:
        return _fail(what, "is not a SQLite database (unreadable)",
                     "move it aside and restore a backup")
    if "malformed" in low or "disk image" in low:
        return _fail(what, "is damaged (malformed or truncated: unreadable)",
                     "move it aside and restore a backup")
    if "readonly" in low or "read-only" in low:
        return _fail(what, "is read-only", "give spotrun's user write access to it")
    if "unable to open" in low:
        return _fail(what, "cannot be opened", "check that it is a file spotrun may write")
    if "disk i/o" in low or "disk is full" in low or "database or disk is full" in low:
        return _fail(what, f"cannot be written: {text}", "check the disk")
    from sqlalchemy.exc import OperationalError, DatabaseError as SaDatabaseError
    if isinstance(exc, (OperationalError, SaDatabaseError, sqlite3.Error)):
        return _fail(what, f"is unreachable or failing: {text}",
                     "check the database server and db_url")
    return None


# ---------------------------------------------------------------- the schema lock

@contextlib.contextmanager
def schema_lock(engine: Any, timeout_s: float) -> Iterator[None]:
    """Serialise schema creation and upgrades between processes (bounded wait).

    SQLite: an flock on `<file>.lock` beside the database. PostgreSQL: a session advisory
    lock. Other databases: none (the upgrade's DDL is idempotent and retried).
    """
    url = engine.url.render_as_string(hide_password=False)
    path = sqlite_path(url)
    if path is not None:
        with _file_lock(Path(str(path) + LOCK_SUFFIX), timeout_s, str(path)):
            yield
        return
    if engine.dialect.name == "postgresql":
        with _pg_lock(engine, timeout_s):
            yield
        return
    yield


@contextlib.contextmanager
def _file_lock(lock_path: Path, timeout_s: float, what: str) -> Iterator[None]:
    try:
        fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o600)
    except OSError as exc:
        raise _fail(what, f"cannot create its lock file {lock_path} ({exc.strerror})",
                    "give spotrun's user write access to the database's folder") from None
    def locked() -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            return False
        return True

    try:
        if not _poll(locked, timeout_s, _POLL_S):
            raise _fail(what, f"is locked by another process setting up its schema "
                        f"(gave up after {timeout_s:g} s)",
                        f"a process holds {lock_path}; is one frozen?")
        yield
    finally:
        os.close(fd)   # closing drops the flock


def _poll(try_once: Callable[[], bool], timeout_s: float, pause_s: float) -> bool:
    """try_once() until it returns True or timeout_s has passed (tenacity); False on timeout."""
    from tenacity import RetryError, Retrying, retry_if_result, stop_after_delay, wait_fixed
    try:
        Retrying(stop=stop_after_delay(timeout_s), wait=wait_fixed(pause_s),
                 retry=retry_if_result(lambda ok: not ok))(try_once)
    except RetryError:
        return False
    return True


_PG_LOCK_KEY = 0x5370_6F74   # "Spot": one advisory lock id for spotrun's schema


@contextlib.contextmanager
def _pg_lock(engine: Any, timeout_s: float) -> Iterator[None]:
    from sqlalchemy import text
    with engine.connect() as conn:
        def locked() -> bool:
            if conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": _PG_LOCK_KEY}).scalar():
                return True
            conn.rollback()
            return False

        if not _poll(locked, timeout_s, _POLL_S * 5):
            raise _fail(where(str(engine.url)), "is locked by another process setting up "
                        f"its schema (gave up after {timeout_s:g} s)",
                        "another spotrun is upgrading it; is one stuck?")
        conn.commit()
        try:
            yield
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_LOCK_KEY})
            conn.commit()


def check_writable(engine: Any) -> None:
    """Take and drop the write lock once (bounded wait): fail before doing anything costly."""
    if engine.dialect.name != "sqlite":
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        return
    with engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        cur = raw.cursor()
        try:
            if raw.in_transaction:
                raw.rollback()
            cur.execute("BEGIN IMMEDIATE")
            cur.execute("ROLLBACK")
        finally:
            cur.close()


# ---------------------------------------------------------------- the probe (--check, doctor)

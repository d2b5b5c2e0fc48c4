"""The market's durable state: one SQLite file in the state dir (clock epoch, options, instances).

A market restarted on the same dir reads its epoch and instances back from here.
Times are market-clock unix seconds unless a column says wall.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from spotrun.errors import ProviderError
from spotrun.states import InstanceState, Market, TerminationCause

DB_FILE = "market.db"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS instances (
  instance_id TEXT PRIMARY KEY,
  client_token TEXT UNIQUE,
  instance_type TEXT NOT NULL,
  zone TEXT NOT NULL,
  market TEXT NOT NULL,
  state TEXT NOT NULL,
  launched_at REAL NOT NULL,
  ended_at REAL,
  cause TEXT,
  tags TEXT NOT NULL,
  price_usd_per_hour REAL,
  notice_at REAL,
  reclaim_at REAL,
  pid INTEGER,
  pid_start_ticks INTEGER,
  term_wall_s REAL
);
"""


@dataclass(frozen=True)
class InstanceRecord:
    """One instance as the market stores it."""

    instance_id: str
    client_token: str | None
    instance_type: str
    zone: str
    market: Market
    state: InstanceState
    launched_at: float
    ended_at: float | None = None
    cause: TerminationCause | None = None
    tags: dict[str, str] = field(default_factory=dict)
    price_usd_per_hour: float | None = None
    notice_at: float | None = None        # when IMDS starts serving the notice
    reclaim_at: float | None = None       # when the market kills it (spot)
    pid: int | None = None                # process group leader
    pid_start_ticks: int | None = None    # /proc/<pid>/stat start time, guards against pid reuse
    term_wall_s: float | None = None      # wall time SIGTERM was sent (terminate in progress)

    def with_(self, **changes: Any) -> "InstanceRecord":
        """A copy with fields replaced."""
        return replace(self, **changes)


def _to_row(rec: InstanceRecord) -> dict[str, Any]:
    row = asdict(rec)
    row["market"] = rec.market.value
    row["state"] = rec.state.value
    row["cause"] = rec.cause.value if rec.cause else None
    row["tags"] = json.dumps(rec.tags, sort_keys=True)
    return row


def _from_row(row: sqlite3.Row) -> InstanceRecord:
    d = dict(row)
    d["market"] = Market(d["market"])
    d["state"] = InstanceState(d["state"])
    d["cause"] = TerminationCause(d["cause"]) if d["cause"] else None
    d["tags"] = json.loads(d["tags"])
    return InstanceRecord(**d)


_COLUMNS = [f.name for f in fields(InstanceRecord)]


class MarketState:
    """Thread-safe access to the market's SQLite file."""

    def __init__(self, state_dir: Path) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        self.path = state_dir / DB_FILE
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None,
                                       timeout=10.0)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise ProviderError(f"cannot open market state: {exc}", field="state_dir",
                                value=str(state_dir)) from None
        self._lock = threading.RLock()

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()

    def get_meta(self, key: str) -> str | None:
        """A stored meta value, or None."""
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else str(row["value"])

    def set_meta(self, key: str, value: str) -> None:
        """Store a meta value."""
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))

    def insert(self, rec: InstanceRecord) -> None:
        """Add a new instance."""
        row = _to_row(rec)
        cols = ", ".join(_COLUMNS)
        marks = ", ".join("?" for _ in _COLUMNS)
        with self._lock:
            self._db.execute(f"INSERT INTO instances ({cols}) VALUES ({marks})",
                             [row[c] for c in _COLUMNS])

    def save(self, rec: InstanceRecord) -> None:
        """Write every field of an existing instance."""
        row = _to_row(rec)
        sets = ", ".join(f"{c}=?" for c in _COLUMNS if c != "instance_id")
        with self._lock:
            self._db.execute(f"UPDATE instances SET {sets} WHERE instance_id=?",
                             [row[c] for c in _COLUMNS if c != "instance_id"] + [rec.instance_id])

    def get(self, instance_id: str) -> InstanceRecord | None:
        """One instance, or None."""
        with self._lock:
            row = self._db.execute("SELECT * FROM instances WHERE instance_id=?",
                                   (instance_id,)).fetchone()
        return None if row is None else _from_row(row)

    def by_token(self, client_token: str) -> InstanceRecord | None:
        """The instance a client token started, or None."""
        with self._lock:
            row = self._db.execute("SELECT * FROM instances WHERE client_token=?",
                                   (client_token,)).fetchone()
        return None if row is None else _from_row(row)

    def all(self, *, live_only: bool = False) -> list[InstanceRecord]:
        """Instances in launch order (optionally only those not yet terminated)."""
        sql = "SELECT * FROM instances"
        if live_only:
            sql += f" WHERE state != '{InstanceState.TERMINATED.value}'"
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY launched_at, instance_id").fetchall()
        return [_from_row(r) for r in rows]


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON to a temp file and rename it over path (readers never see half a file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2), encoding="utf-8")
    os.replace(tmp, path)

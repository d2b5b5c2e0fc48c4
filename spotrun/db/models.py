"""State database: tables and engine (SQLite by default, any SQLAlchemy URL).

The CLI writes requests (jobs, cancels); only the daemon acts on clouds.
"""

from __future__ import annotations

import json
import os
import secrets as _secrets
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable, Iterator, Sequence

from sqlalchemy import DateTime, TypeDecorator, UniqueConstraint
from sqlalchemy import event as sa_event
from sqlalchemy.engine import Engine
from sqlmodel import Field, Session, SQLModel, create_engine, select

from spotrun.errors import ConfigError
from spotrun.states import AttemptState, EndReason, JobState, Market, NodeState

SCHEMA_VERSION = 1


def utcnow() -> datetime:
    """The current UTC time (naive datetimes are never stored)."""
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator):
    """Stores UTC, returns timezone-aware datetimes (SQLite would drop the zone)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc).replace(tzinfo=None)

    def process_result_value(self, value: Any, dialect: Any) -> Any:
        if value is None:
            return None
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


def new_job_id(name: str) -> str:
    """A readable, unique job id: `<name>-<6 hex>`."""
    return f"{name[:55]}-{_secrets.token_hex(3)}"


class Job(SQLModel, table=True):
    """A submitted job and its current state."""

    id: str = Field(primary_key=True)
    name: str = Field(index=True)
    state: JobState = Field(default=JobState.QUEUED, index=True)
    spec_json: str
    store_uri: str                      # daemon store holding bundle, logs, heartbeats
    checkpoint_uri: str                 # where the job's checkpoints go
    bundle_key: str | None = None
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    cancel_requested: bool = False
    budget_usd: float | None = None
    error_restarts: int = 0
    last_step: int = 0
    total_steps: int | None = None
    reason: str | None = None           # why the job ended, for failed/budget states
    # The deadline on the provider's clock, fixed at the first scheduling pass (the local
    # market's clock runs faster than the wall); None = use the spec's deadline as written.
    deadline_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    budget_stop_requested: bool = False  # spend loop: stop (checkpoint, terminate) for budget
    # Who and what it spends for (spotrun.budgets): the submitting OS user, the spec's project.
    # Rows from before owners existed read "unknown" (the migration's column default).
    owner: str = Field(default="unknown", index=True)
    project: str = Field(default="default", index=True)
    # Set with budget_stop_requested when a project or owner budget stopped the job:
    # "<scope>:<name>@<period key>" (the next period resumes it; spotrun.budgets.guard).
    budget_stop_scope: str | None = None

    @property
    def spec(self) -> dict[str, Any]:
        """The validated spec as a mapping."""
        return json.loads(self.spec_json)


class Attempt(SQLModel, table=True):
    """One launch of a job on one instance."""

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="job.id", index=True)
    number: int                         # 1, 2, ... within the job
    state: AttemptState = Field(default=AttemptState.LAUNCHING, index=True)
    market: Market
    instance_type: str
    zone: str
    price_usd_per_hour: float           # price in effect at launch
    client_token: str = Field(index=True, unique=True)
    instance_id: str | None = Field(default=None, index=True)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    started_at: datetime | None = Field(default=None, sa_type=UTCDateTime)  # provider clock
    ended_at: datetime | None = Field(default=None, sa_type=UTCDateTime)    # provider clock
    end_reason: EndReason | None = None
    detail: str | None = None
    candidates: str | None = None       # JSON list of the pool keys the launch may try
    start_step: int = 0
    last_step: int = 0
    steps_per_s: float | None = None   # measured by the training library
    checkpoint_save_s: float | None = None  # blocking cost of one save, from heartbeats
    gpus: int = 1                       # GPUs the job uses on this instance (SPOTRUN_GPUS)
    checkpoint_interval_s: float | None = None  # chosen at launch, provider-clock seconds
    stop_requested_at: datetime | None = Field(default=None, sa_type=UTCDateTime)  # wall clock
    last_heartbeat_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    notice_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    running_at: datetime | None = Field(default=None, sa_type=UTCDateTime)  # provider clock:
    #   first heartbeat in phase "running" (boot, setup and restore are over); audit overhead
    checkpoint_stall_s: float | None = None  # training seconds paused for checkpoint saves
    instance_cause: str | None = None  # the provider's termination cause (TerminationCause)
    checkpoint_failures: int = 0        # checkpoint saves that failed (every try), per heartbeats
    checkpoint_error: str | None = None  # the last failed save: "step N: error"
    # Multi-node (resources.nodes > 1 or elastic): the instances are AttemptNode rows and
    # instance_id stays None; the membership the agents read is nodes.json (daemon/nodes.py).
    nodes: int = 1                      # nodes launched (MAX for an elastic job)
    nodes_min: int | None = None        # elastic: the fewest nodes the attempt runs on
    nodes_version: int = 0              # version of the last nodes.json written
    nodes_members: str | None = None    # JSON [[rank, instance id], ...] of that nodes.json
    rdzv_host_rank: int | None = None   # the rank whose host runs the c10d rendezvous
    rdzv_endpoint: str | None = None    # host:port of the rendezvous in that nodes.json


class AttemptNode(SQLModel, table=True):
    """One instance of a multi-node attempt, for one node rank; a replacement is a new row.

    One writer per fact: the scheduler writes the launch (intent, then instance id), the
    node loop (daemon/nodes.py) everything after.
    """

    id: int | None = Field(default=None, primary_key=True)
    attempt_id: int = Field(foreign_key="attempt.id", index=True)
    job_id: str = Field(index=True)
    node_rank: int
    state: NodeState = Field(default=NodeState.LAUNCHING, index=True)
    client_token: str = Field(index=True, unique=True)
    instance_id: str | None = Field(default=None, index=True)
    market: Market
    instance_type: str
    zone: str
    price_usd_per_hour: float
    private_ip: str | None = None
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)   # wall clock
    launched_at: datetime | None = Field(default=None, sa_type=UTCDateTime)    # provider clock
    running_at: datetime | None = Field(default=None, sa_type=UTCDateTime)     # provider clock
    ended_at: datetime | None = Field(default=None, sa_type=UTCDateTime)       # provider clock
    end_reason: EndReason | None = None
    cause: str | None = None            # the provider's termination cause (TerminationCause)
    detail: str | None = None
    last_heartbeat_at: datetime | None = Field(default=None, sa_type=UTCDateTime)  # wall
    notice_at: datetime | None = Field(default=None, sa_type=UTCDateTime)  # provider clock
    last_step: int = 0
    replaces: int | None = None         # the AttemptNode id this one replaces


class Event(SQLModel, table=True):
    """A job's history, one row per thing that happened."""

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(index=True)
    attempt_id: int | None = None
    ts: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    kind: str
    detail: str = ""


class SpendEntry(SQLModel, table=True):
    """A ledger row: a billed span at one price (the open one grows until the price changes)."""

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(index=True)
    attempt_id: int | None = Field(default=None, index=True)
    instance_id: str | None = None
    kind: str = "compute"               # compute | storage | volume | correction
    #   | adjustment | requests: spotrun.ledger.rules.SpendKind
    market: str | None = None
    instance_type: str | None = None
    zone: str | None = None
    start: datetime = Field(sa_type=UTCDateTime)
    end: datetime = Field(sa_type=UTCDateTime)
    billed_seconds: float
    price_usd_per_hour: float
    usd: float
    price_source: str = ""
    note: str = ""
    booked_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class LedgerMark(SQLModel, table=True):
    """How far the ledger has booked one thing (an attempt, a job's storage): its watermark.

    Written in the same transaction as the rows it covers; `version` makes the update a
    compare-and-set so two bookers can never book the same seconds twice.
    """

    key: str = Field(primary_key=True)  # "attempt:<id>" | "storage:<job id>"
    job_id: str = Field(index=True)
    booked_until: datetime = Field(sa_type=UTCDateTime)   # provider clock
    closed: bool = False                # final billing rules applied; nothing more to book
    version: int = 0
    state_json: str = "{}"              # small booker state (e.g. keys seen in the store)


class PricePoint(SQLModel, table=True):
    """A recorded spot price change point of one pool (the daemon's PriceLoop writes them)."""

    __table_args__ = (UniqueConstraint("instance_type", "zone", "ts",
                                       name="uq_pricepoint_type_zone_ts"),)

    id: int | None = Field(default=None, primary_key=True)
    instance_type: str = Field(index=True)
    zone: str
    ts: datetime = Field(sa_type=UTCDateTime, index=True)   # provider clock
    price_usd_per_hour: float
    source: str = ""                    # provider name the point came from
    recorded_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class Meta(SQLModel, table=True):
    """Key/value facts about the database itself (schema version, daemon lease)."""

    key: str = Field(primary_key=True)
    value: str


# ---------------------------------------------------------------- engine

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
    from spotrun.db.faults import check_sqlite_file, remember, sqlite_path
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
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError
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
    from spotrun.db.faults import database_error, schema_lock
    from spotrun.db.migrations import upgrade
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
    from spotrun.db.faults import sqlite_path
    path = sqlite_path(settings.database_url)
    return path is not None and not path.exists() and not path.is_dir()


def session(engine: Engine) -> Session:
    """A new session; callers use it as a context manager."""
    return Session(engine, expire_on_commit=False)


def add_event(s: Session, job_id: str, kind: str, detail: str = "", *,
              attempt_id: int | None = None, ts: datetime | None = None) -> Event:
    """Append one event to a job's history (caller commits)."""
    ev = Event(job_id=job_id, attempt_id=attempt_id, kind=kind, detail=detail, ts=ts or utcnow())
    s.add(ev)
    return ev


def find_job(s: Session, ref: str) -> Job | None:
    """A job by exact id, else by unique name (newest first)."""
    job = s.get(Job, ref)
    if job is not None:
        return job
    rows = s.exec(select(Job).where(Job.name == ref).order_by(Job.created_at.desc())).all()
    return rows[0] if rows else None


def attempts_of(s: Session, job_id: str) -> list[Attempt]:
    """A job's attempts in launch order."""
    return list(s.exec(select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.number)))


def nodes_of(s: Session, attempt_id: int) -> list[AttemptNode]:
    """A multi-node attempt's node rows (replacements included), by rank then launch order."""
    return list(s.exec(select(AttemptNode).where(AttemptNode.attempt_id == attempt_id)
                       .order_by(AttemptNode.node_rank, AttemptNode.id)))


def iter_jobs(s: Session) -> Iterator[Job]:
    """All jobs, oldest first."""
    yield from s.exec(select(Job).order_by(Job.created_at))


# ---------------------------------------------------------------- bulk reads
# The read views (status, audit, the dashboard, /metrics) build every job's view from a
# fixed number of queries, one per table, never one per job (issue 24).

# A longer id list reads the whole table instead: SQLite caps bound parameters per statement.
MAX_IN_IDS = 500


def where_ids(q: Any, column: Any, ids: Sequence[Any] | None) -> Any:
    """q restricted to ids (None or a long list: every row; callers look their ids up)."""
    if ids is not None and len(ids) <= MAX_IN_IDS:
        q = q.where(column.in_(list(ids)))
    return q


def jobs_by_ref(s: Session, refs: Sequence[str]) -> list[Job | None]:
    """Each ref's job as find_job resolves it (None: no such job), ids in one query."""
    by_id = {j.id: j for j in s.exec(where_ids(select(Job), Job.id, sorted(set(refs))))}
    return [by_id.get(r) or find_job(s, r) for r in refs]


def attempts_by_job(s: Session, job_ids: Sequence[str] | None = None) -> dict[str, list[Attempt]]:
    """Jobs' attempts in launch order, in one query (job_ids None: every job's)."""
    if job_ids is not None and not job_ids:
        return {}
    out: dict[str, list[Attempt]] = {}
    q = where_ids(select(Attempt), Attempt.job_id, job_ids).order_by(Attempt.job_id,
                                                                    Attempt.number)
    for a in s.exec(q):
        out.setdefault(a.job_id, []).append(a)
    return out


def nodes_by_attempt(s: Session, job_ids: Sequence[str] | None = None
                     ) -> dict[int, list[AttemptNode]]:
    """Jobs' node rows by attempt id, each list ordered as nodes_of orders it, in one query."""
    if job_ids is not None and not job_ids:
        return {}
    out: dict[int, list[AttemptNode]] = {}
    q = where_ids(select(AttemptNode), AttemptNode.job_id, job_ids).order_by(
        AttemptNode.attempt_id, AttemptNode.node_rank, AttemptNode.id)
    for n in s.exec(q):
        out.setdefault(n.attempt_id, []).append(n)
    return out


def spend_rows_by_job(s: Session, job_ids: Sequence[str] | None = None
                      ) -> dict[str, list[SpendEntry]]:
    """Jobs' ledger rows ordered by end then id, in one query."""
    if job_ids is not None and not job_ids:
        return {}
    out: dict[str, list[SpendEntry]] = {}
    q = where_ids(select(SpendEntry), SpendEntry.job_id, job_ids).order_by(SpendEntry.end,
                                                                           SpendEntry.id)
    for r in s.exec(q):
        out.setdefault(r.job_id, []).append(r)
    return out


def events_by_job(s: Session, job_ids: Sequence[str] | None = None, *,
                  kind: str | None = None) -> dict[str, list[Event]]:
    """Jobs' events (of one kind, if given) in the order written, in one query."""
    if job_ids is not None and not job_ids:
        return {}
    out: dict[str, list[Event]] = {}
    q = where_ids(select(Event), Event.job_id, job_ids)
    if kind is not None:
        q = q.where(Event.kind == kind)
    for e in s.exec(q.order_by(Event.id)):
        out.setdefault(e.job_id, []).append(e)
    return out


def price_points_by_pool(s: Session, instance_types: Iterable[str]
                         ) -> dict[tuple[str, str], list[PricePoint]]:
    """Recorded price points of these instance types by (type, zone), oldest first, one query."""
    types = sorted(set(instance_types))
    if not types:
        return {}
    out: dict[tuple[str, str], list[PricePoint]] = {}
    q = select(PricePoint).where(PricePoint.instance_type.in_(types)).order_by(
        PricePoint.ts, PricePoint.id)
    for p in s.exec(q):
        out.setdefault((p.instance_type, p.zone), []).append(p)
    return out


@dataclass
class JobRows:
    """One job's rows of every table a read view needs, read in bulk (`rows_by_job`)."""

    attempts: list[Attempt] = field(default_factory=list)
    nodes: dict[int, list[AttemptNode]] = field(default_factory=dict)   # by attempt id
    spend: list[SpendEntry] = field(default_factory=list)
    waiting: list[Event] | None = None      # "waiting" events; None = not read
    prices: "PricePointsOnce | None" = None  # shared by every job of one read

    def nodes_of(self, attempt_id: int | None) -> list[AttemptNode]:
        """An attempt's node rows (as nodes_of orders them)."""
        return self.nodes.get(attempt_id or -1, [])


class PricePointsOnce:
    """Recorded price points of a set of instance types, read on first use in one query."""

    def __init__(self, instance_types: Iterable[str]) -> None:
        self.types = set(instance_types)
        self._by_pool: dict[tuple[str, str], list[PricePoint]] | None = None

    def of(self, s: Session, instance_type: str, zone: str) -> list[PricePoint]:
        """The pool's points, oldest first."""
        if instance_type not in self.types:   # a type not announced up front: its own query
            return list(s.exec(select(PricePoint).where(
                PricePoint.instance_type == instance_type, PricePoint.zone == zone)
                .order_by(PricePoint.ts, PricePoint.id)))
        if self._by_pool is None:
            self._by_pool = price_points_by_pool(s, self.types)
        return self._by_pool.get((instance_type, zone), [])


def _multi(a: Attempt) -> bool:
    """spotrun.daemon.nodes.is_multi (that module imports this one)."""
    return (a.nodes or 1) > 1 or a.nodes_min is not None


def rows_by_job(s: Session, job_ids: Sequence[str] | None = None, *,
                spend: bool = True) -> dict[str, JobRows]:
    """Attempts, nodes and (if asked) ledger rows of these jobs (None: all), a query each."""
    out: dict[str, JobRows] = {}
    for jid, atts in attempts_by_job(s, job_ids).items():
        out.setdefault(jid, JobRows()).attempts = atts
    if any(_multi(a) for r in out.values() for a in r.attempts):
        nodes = nodes_by_attempt(s, job_ids)
        for r in out.values():
            r.nodes = {a.id: nodes.get(a.id, []) for a in r.attempts if _multi(a)}
    if spend:
        for jid, rows in spend_rows_by_job(s, job_ids).items():
            out.setdefault(jid, JobRows()).spend = rows
    return out

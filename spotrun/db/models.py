"""State database tables: jobs, attempts, nodes, events, the ledger, price points, meta.

The CLI writes requests (jobs, cancels); only the daemon acts on clouds. The engine is in
spotrun.db.engine, the reads every view shares in spotrun.db.queries.
"""

from __future__ import annotations

import json
import secrets as _secrets
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import DateTime, TypeDecorator, UniqueConstraint
from sqlmodel import Field, SQLModel

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
    # A budget stop: wall seconds from the job's stop request to its instance seen gone
    # (the stop margin follows them: spotrun.ledger.stopmargin).
    budget_stop_wall_s: float | None = None
    last_heartbeat_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    notice_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    running_at: datetime | None = Field(default=None, sa_type=UTCDateTime)  # provider clock:
    #   first heartbeat in phase "running" (boot, setup and restore are over); audit overhead
    checkpoint_stall_s: float | None = None  # training seconds paused for checkpoint saves
    instance_cause: str | None = None  # the provider's termination cause (TerminationCause)
    checkpoint_failures: int = 0        # checkpoint saves that failed (every try), per heartbeats
    checkpoint_error: str | None = None  # the last failed save: "step N: error"
    # The provider it was launched on (several clouds, docs/clouds.md); None: a row from
    # before clouds were recorded, launched on the daemon's one provider.
    cloud: str | None = None
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
    #   | adjustment | requests: spotrun.providers.billing_rules.SpendKind
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


class CheckpointMove(SQLModel, table=True):
    """A resume checkpoint copied from one cloud's store to another's before an attempt
    (docs/clouds.md): one row per attempt that moved, written once the copy is complete."""

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(index=True)
    attempt_id: int = Field(unique=True)   # the attempt the copy was for: at most one each
    checkpoint: str                        # ckpt-<step> copied
    src_cloud: str
    dst_cloud: str
    nbytes: int                            # bytes the copy sent (those already there: none)
    seconds: float                         # wall seconds the copy took (throughput measured)
    usd: float                             # egress billed by the source cloud
    at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class Meta(SQLModel, table=True):
    """Key/value facts about the database itself (schema version, daemon lease)."""

    key: str = Field(primary_key=True)
    value: str

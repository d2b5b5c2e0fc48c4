"""Schema versions and upgrades: a database made by an older spotrun keeps working.

The tables are declared once (spotrun.db); an upgrade creates missing tables, adds
every missing column (nullable, with the model's scalar default for old rows), then
runs the numbered steps above the stored version and records the new version in Meta.
Works on SQLite and PostgreSQL; safe to run from several processes at once. It logs
nothing: it runs under every CLI verb, whose stdout may be JSON.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable

from sqlalchemy import Column, inspect, literal, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlmodel import Session, SQLModel

from spotrun.db.budget_rows import BudgetRow   # budgets set through `spotrun budgets set`
from spotrun.db.identity import ApiToken, TeamUser, TrailEntry, WebSession   # team server's
from spotrun.db.models import AttemptNode, CheckpointMove, Job, Meta
from spotrun.db.outbox import NotifyOutbox   # its table is part of the schema
from spotrun.errors import ConfigError

VERSION_KEY = "schema_version"


@dataclass(frozen=True)
class Step:
    """One numbered upgrade: what it does and the function that does it."""

    version: int
    what: str
    apply: Callable[[Connection], None]


def _columns_added_by_helpers(conn: Connection) -> None:
    """Version 2: columns added to Job/Attempt/SpendEntry after version 1 (added generically)."""


def _end_reason_moved(conn: Connection) -> None:
    """Version 3: EndReason.MOVED; PostgreSQL's native enum type needs the new label."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("ALTER TYPE endreason ADD VALUE IF NOT EXISTS 'MOVED'"))


def _notify_outbox(conn: Connection) -> None:
    """Version 4: the alerts outbox (spotrun.db.outbox), one row per event and webhook."""
    NotifyOutbox.__table__.create(conn, checkfirst=True)


def _attempt_nodes(conn: Connection) -> None:
    """Version 5: multi-node attempts: the AttemptNode table (Attempt's node columns are added
    generically)."""
    AttemptNode.__table__.create(conn, checkfirst=True)


def _measured_stops(conn: Connection) -> None:
    """Version 7: the stop margin follows measured budget stops; `Attempt.budget_stop_wall_s`
    comes generically (old attempts: not measured)."""


def _owners_and_projects(conn: Connection) -> None:
    """Version 6: budgets per project and owner. The columns come generically, old rows
    reading their defaults (owner "unknown", project "default"); their indexes here."""
    for index in Job.__table__.indexes:
        if {c.name for c in index.columns} & {"owner", "project"}:
            index.create(conn, checkfirst=True)


def _team_server(conn: Connection) -> None:
    """Version 7: the team server's users, API tokens and action trail (spotrun.db.identity)."""
    for model in (TeamUser, ApiToken, TrailEntry):
        model.__table__.create(conn, checkfirst=True)


def _web_sessions(conn: Connection) -> None:
    """Version 8: the dashboard's login sessions on the team server (spotrun.db.identity)."""
    WebSession.__table__.create(conn, checkfirst=True)


def _budget_rows(conn: Connection) -> None:
    """Version 10: budgets set through `spotrun budgets set` (spotrun.db.budget_rows)."""
    BudgetRow.__table__.create(conn, checkfirst=True)


def _attempt_clouds(conn: Connection) -> None:
    """Version 11: the cloud of each attempt (`Attempt.cloud`, added generically; old rows
    read None: the daemon's one provider) and the checkpoints moved between clouds."""
    CheckpointMove.__table__.create(conn, checkfirst=True)


STEPS: list[Step] = [
    Step(2, "columns added after v1 (budget stop, checkpoint figures, running_at, ...)",
         _columns_added_by_helpers),
    Step(3, "end reason 'moved' (placement policy moves)", _end_reason_moved),
    Step(4, "alerts outbox table", _notify_outbox),
    Step(5, "multi-node: attempt nodes table, node columns on attempts", _attempt_nodes),
    Step(6, "owner and project on jobs (budgets per project and owner)",
         _owners_and_projects),
    Step(7, "team server: users, API tokens, action trail", _team_server),
    Step(8, "measured budget stops on attempts (the stop margin)", _measured_stops),
    Step(9, "team server: dashboard login sessions", _web_sessions),
    Step(10, "budgets set through the CLI or the team server", _budget_rows),
    Step(11, "the cloud of each attempt (several clouds in one daemon)", _attempt_clouds),
]
LATEST = max(s.version for s in STEPS)


def stored_version(engine: Engine) -> int | None:
    """The schema version recorded in the database, or None for a database without one."""
    if not inspect(engine).has_table(Meta.__tablename__):
        return None
    with Session(engine) as s:
        row = s.get(Meta, VERSION_KEY)
    return int(row.value) if row is not None else None


def missing_columns(engine: Engine) -> dict[str, list[str]]:
    """Per table: the model's columns the database lacks."""
    insp = inspect(engine)
    out: dict[str, list[str]] = {}
    for table in SQLModel.metadata.sorted_tables:
        if not insp.has_table(table.name):
            continue
        have = {c["name"] for c in insp.get_columns(table.name)}
        lacking = [c.name for c in table.columns if c.name not in have]
        if lacking:
            out[table.name] = lacking
    return out


def upgrade(engine: Engine) -> int:
    """Bring the database to LATEST (create tables, add columns, run steps); returns it."""
    SQLModel.metadata.create_all(engine)
    before = stored_version(engine) or 1
    if before > LATEST:
        raise ConfigError(f"database schema v{before} is newer than this spotrun (v{LATEST})",
                          field="database_url", value=str(engine.url.render_as_string()),
                          hint="upgrade spotrun before using this database")
    for table, names in missing_columns(engine).items():
        for name in names:
            _add_column(engine, SQLModel.metadata.tables[table].c[name])
    for step in STEPS:
        if step.version > before:
            with engine.begin() as conn:
                step.apply(conn)
    _record(engine, LATEST)
    return LATEST


def _add_column(engine: Engine, col: Column) -> None:
    dialect = engine.dialect
    ddl_type = col.type.compile(dialect=dialect)
    default = _scalar_default(col)
    sql = f"ALTER TABLE {_q(engine, col.table.name)} ADD COLUMN {_q(engine, col.name)} {ddl_type}"
    if default is not None:
        sql += " DEFAULT " + str(literal(default).compile(
            dialect=dialect, compile_kwargs={"literal_binds": True}))
    try:
        with engine.begin() as conn:
            create_type = getattr(col.type, "create", None)
            if dialect.name == "postgresql" and create_type is not None:
                create_type(conn, checkfirst=True)   # a native enum type must exist first
            conn.execute(text(sql))
    except DBAPIError:
        # Another process may have added it meanwhile; only a column still missing is an error.
        if col.name in {c["name"] for c in inspect(engine).get_columns(col.table.name)}:
            return
        raise


def _scalar_default(col: Column) -> Any:
    d = col.default
    if d is None or not getattr(d, "is_scalar", False):
        return None
    value = d.arg
    if isinstance(value, enum.Enum):
        return value.name   # SQLAlchemy stores enums by member name
    return value


def _q(engine: Engine, name: str) -> str:
    return engine.dialect.identifier_preparer.quote(name)


def _record(engine: Engine, version: int) -> None:
    with Session(engine) as s:
        row = s.get(Meta, VERSION_KEY)
        if row is None:
            s.add(Meta(key=VERSION_KEY, value=str(version)))
        elif int(row.value) < version:
            row.value = str(version)
            s.add(row)
        else:
            return
        try:
            s.commit()
        except DBAPIError:
            s.rollback()   # a concurrent upgrade recorded it first

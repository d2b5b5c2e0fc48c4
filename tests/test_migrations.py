"""Schema versions: a database made by an older spotrun is upgraded on open and keeps working."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from spotrun.db import Attempt, Job, Meta, attempts_of, open_db, session
from spotrun.errors import ConfigError
from spotrun.db.migrations import LATEST, missing_columns, stored_version, upgrade
from spotrun.states import AttemptState, JobState

# The v1 schema as first released (before budget stops, checkpoint figures and the ledger mark).
V1_SQL = [
    """CREATE TABLE job (id VARCHAR NOT NULL PRIMARY KEY, name VARCHAR NOT NULL,
       state VARCHAR(16) NOT NULL, spec_json VARCHAR NOT NULL, store_uri VARCHAR NOT NULL,
       checkpoint_uri VARCHAR NOT NULL, bundle_key VARCHAR, created_at DATETIME NOT NULL,
       updated_at DATETIME NOT NULL, cancel_requested BOOLEAN NOT NULL, budget_usd FLOAT,
       error_restarts INTEGER NOT NULL, last_step INTEGER NOT NULL, total_steps INTEGER,
       reason VARCHAR)""",
    """CREATE TABLE attempt (id INTEGER NOT NULL PRIMARY KEY, job_id VARCHAR NOT NULL
       REFERENCES job (id), number INTEGER NOT NULL, state VARCHAR(11) NOT NULL,
       market VARCHAR(9) NOT NULL, instance_type VARCHAR NOT NULL, zone VARCHAR NOT NULL,
       price_usd_per_hour FLOAT NOT NULL, client_token VARCHAR NOT NULL UNIQUE,
       instance_id VARCHAR, created_at DATETIME NOT NULL, started_at DATETIME,
       ended_at DATETIME, end_reason VARCHAR(13), detail VARCHAR,
       start_step INTEGER NOT NULL, last_step INTEGER NOT NULL)""",
    """CREATE TABLE meta (key VARCHAR NOT NULL PRIMARY KEY, value VARCHAR NOT NULL)""",
    "INSERT INTO meta VALUES ('schema_version', '1')",
    """INSERT INTO job VALUES ('old-1', 'old', 'RUNNING', '{"name": "old"}', 'file:///s',
       'file:///s/c', NULL, '2025-01-01 00:00:00', '2025-01-01 00:00:00', 0, NULL, 0, 40,
       100, NULL)""",
    """INSERT INTO attempt VALUES (1, 'old-1', 1, 'RUNNING', 'SPOT', 'p3.2xlarge', 'za', 0.9,
       'tok-1', 'i-1', '2025-01-01 00:00:00', '2025-01-01 00:00:00', NULL, NULL, NULL, 0, 40)""",
]


@pytest.fixture
def old_db(tmp_path: Path) -> str:
    """A SQLite file with the v1 schema and one running job."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    raw = create_engine(url)
    with raw.begin() as conn:
        for sql in V1_SQL:
            conn.execute(text(sql))
    raw.dispose()
    return url


def test_old_database_is_upgraded_on_open_and_keeps_its_rows(old_db):
    before = create_engine(old_db)
    lacking = missing_columns(before)
    assert "budget_stop_requested" in lacking["job"] and "gpus" in lacking["attempt"]
    assert stored_version(before) == 1
    before.dispose()
    engine = open_db(old_db)
    assert missing_columns(engine) == {}
    assert stored_version(engine) == LATEST
    assert inspect(engine).has_table("ledgermark")
    with session(engine) as s:
        job = s.get(Job, "old-1")
        att = attempts_of(s, "old-1")[0]
    assert job.state is JobState.RUNNING and job.last_step == 40
    assert job.budget_stop_requested is False          # the model's default for old rows
    assert att.state is AttemptState.RUNNING and att.gpus == 1 and att.instance_id == "i-1"
    # The daemon's queries over new columns work on the upgraded database.
    with session(engine) as s:
        s.add(Attempt(job_id="old-1", number=2, state=AttemptState.LAUNCHING, market=att.market,
                      instance_type="p3.2xlarge", zone="za", price_usd_per_hour=1.0,
                      client_token="tok-2", checkpoint_interval_s=60.0,
                      stop_requested_at=datetime.now(timezone.utc)))
        job.budget_stop_requested = True
        s.add(job)
        s.commit()
    with session(engine) as s:
        assert s.get(Job, "old-1").budget_stop_requested is True
        assert [a.number for a in attempts_of(s, "old-1")] == [1, 2]
    engine.dispose()


def test_upgrade_is_idempotent(old_db):
    engine = open_db(old_db)
    assert upgrade(engine) == LATEST
    assert upgrade(engine) == LATEST
    with session(engine) as s:
        assert s.get(Meta, "schema_version").value == str(LATEST)
    engine.dispose()


def test_newer_database_is_refused(tmp_path: Path):
    engine = open_db(f"sqlite:///{tmp_path / 'new.db'}")
    with session(engine) as s:
        row = s.get(Meta, "schema_version")
        row.value = str(LATEST + 1)
        s.add(row)
        s.commit()
    with pytest.raises(ConfigError) as err:
        upgrade(engine)
    assert err.value.field == "database_url" and "newer" in err.value.message
    engine.dispose()


def test_old_database_gains_the_attempt_nodes_table(old_db):
    from spotrun.db import AttemptNode, nodes_of
    from spotrun.states import NodeState
    engine = open_db(old_db)
    assert inspect(engine).has_table("attemptnode")
    with session(engine) as s:
        att = attempts_of(s, "old-1")[0]
        assert att.nodes == 1 and att.nodes_min is None    # single-node, as before
        s.add(AttemptNode(attempt_id=att.id, job_id="old-1", node_rank=1, client_token="t-1",
                          market=att.market, instance_type="p3.2xlarge", zone="za",
                          price_usd_per_hour=1.0))
        s.commit()
    with session(engine) as s:
        [node] = nodes_of(s, att.id)
    assert node.state is NodeState.LAUNCHING and node.instance_id is None

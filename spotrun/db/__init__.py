"""The state database: its tables (models), engine, shared queries, faults, migrations, outbox."""

from spotrun.db.engine import (  # noqa: F401
    DEFAULT_BUSY_TIMEOUT_S, database_missing, init_db, make_engine, open_db, open_settings_db,
    open_state_db, session)
from spotrun.db.models import (  # noqa: F401
    SCHEMA_VERSION, Attempt, AttemptNode, CheckpointMove, Event, Job, LedgerMark, Meta,
    PricePoint, SpendEntry, UTCDateTime, new_job_id, utcnow)
from spotrun.db.queries import (  # noqa: F401
    MAX_IN_IDS, JobRows, PricePointsOnce, add_event, attempts_by_job, attempts_of, events_by_job,
    find_job, iter_jobs, job_named, jobs_by_ref, nodes_by_attempt, nodes_of, price_points_by_pool,
    rows_by_job, spend_rows_by_job, where_ids)

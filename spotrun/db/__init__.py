"""The state database: tables, engine, queries (spotrun.db.models), faults, migrations, outbox."""

from spotrun.db.models import (  # noqa: F401
    DEFAULT_BUSY_TIMEOUT_S, MAX_IN_IDS, SCHEMA_VERSION, Attempt, AttemptNode, Event, Job,
    JobRows, LedgerMark, Meta, PricePoint, PricePointsOnce, SpendEntry, UTCDateTime, add_event,
    attempts_by_job, attempts_of, database_missing, events_by_job, find_job, init_db,
    iter_jobs, jobs_by_ref, make_engine, new_job_id, nodes_by_attempt, nodes_of, open_db,
    open_settings_db, price_points_by_pool, rows_by_job, session, spend_rows_by_job, utcnow,
    where_ids)

"""Helpers shared by CLI verbs: settings, database, JSON output."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from spotrun.config import Settings, load_settings
from spotrun.contracts import json_default
from spotrun.db import database_missing, open_settings_db
from spotrun.errors import NotFoundError

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


def get_settings() -> Settings:
    """Settings for this invocation ($SPOTRUN_HOME, spotrun.toml)."""
    return load_settings()


def open_state_db(settings: Settings, job_ref: str | None = None) -> "Engine":
    """The state database for a verb (bounded waits from settings).

    A verb that looks up job_ref on a home with no database yet finds nothing, and creates
    nothing: bad input writes nothing.
    """
    if job_ref is not None and database_missing(settings):
        raise NotFoundError(f"no such job {job_ref!r}", field="JOB", value=job_ref,
                            hint="no job has been submitted to this database yet")
    return open_settings_db(settings)


def echo_json(data: Any) -> None:
    """Print data as indented JSON on stdout."""
    click.echo(json.dumps(data, indent=2, default=json_default))


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")

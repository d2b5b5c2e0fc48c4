"""Helpers shared by CLI verbs: settings, database, JSON output."""

from __future__ import annotations

import json
from datetime import datetime
from enum import Enum
from typing import Any

import click

from spotrun.config import Settings, load_settings


def get_settings() -> Settings:
    """Settings for this invocation ($SPOTRUN_HOME, spotrun.toml)."""
    return load_settings()


def json_default(o: Any) -> Any:
    """json.dumps default for datetimes and enums."""
    if isinstance(o, datetime):
        return o.isoformat()
    if isinstance(o, Enum):
        return o.value
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def echo_json(data: Any) -> None:
    """Print data as indented JSON on stdout."""
    click.echo(json.dumps(data, indent=2, default=json_default))


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")

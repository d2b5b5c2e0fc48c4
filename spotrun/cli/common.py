"""Helpers shared by CLI verbs: settings, database, JSON output."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from spotrun.clouds import check_clouds
from spotrun.config import Settings, load_settings
from spotrun.contracts import json_default
from spotrun.db import open_state_db  # noqa: F401 (the verbs' way in)

if TYPE_CHECKING:
    from spotrun.backends import Backend


def get_settings() -> Settings:
    """Settings for this invocation ($SPOTRUN_HOME, spotrun.toml); several clouds checked
    for what they need together (each its store, no zone in two)."""
    settings = load_settings()
    check_clouds(settings)
    return settings


def echo_json(data: Any) -> None:
    """Print data as indented JSON on stdout."""
    click.echo(json.dumps(data, indent=2, default=json_default))


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def backend() -> "Backend":
    """Where this invocation's remote-capable verbs act: chosen once (the local home, or the
    server `spotrun login` stored; `--local` and SPOTRUN_HOME keep it local)."""
    ctx = click.get_current_context()
    root = ctx.find_root()
    if "spotrun.backend" not in root.meta:
        from spotrun.backends import choose   # lazy: start-up cost (httpx when remote)
        root.meta["spotrun.backend"] = choose(local=local_only())
    return root.meta["spotrun.backend"]


def local_only() -> bool:
    """Whether `--local` was given to this invocation."""
    return bool(click.get_current_context().find_root().meta.get("spotrun.local"))

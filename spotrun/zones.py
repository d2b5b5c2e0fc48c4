"""Zones a provider knows, without starting or calling the provider (for validation)."""

from __future__ import annotations

from spotrun.config import Settings
from spotrun.providers.aws import DEFAULT_ZONES as DEFAULT_AWS_ZONES
from spotrun.providers.facts import facts_for
from spotrun.providers.local import local_trace_path

__all__ = ["DEFAULT_AWS_ZONES", "known_zones", "local_trace_path"]


def known_zones(settings: Settings) -> list[str]:
    """Zones the configured provider can launch into."""
    return facts_for(settings).known_zones(settings)

"""Zones a provider knows, without starting or calling the provider (for validation)."""

from __future__ import annotations

from spotrun.config import Settings
from spotrun.providers.facts import facts_for


def known_zones(settings: Settings) -> list[str]:
    """Zones the configured provider can launch into."""
    return facts_for(settings).known_zones(settings)


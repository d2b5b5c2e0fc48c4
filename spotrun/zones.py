"""Zones a provider knows, and how its catalog is named, without starting or calling the
provider (for validation)."""

from __future__ import annotations

from spotrun.config import Settings
from spotrun.providers.facts import facts_for


def known_zones(settings: Settings) -> list[str]:
    """Zones the configured provider can launch into."""
    return facts_for(settings).known_zones(settings)


def catalog_label(settings: Settings) -> str:
    """The configured provider's catalog as an error names it: "the gcp provider's catalog
    (gcp.yaml)" (local runs on the aws catalog)."""
    return f"the {settings.provider} provider's catalog ({facts_for(settings).catalog}.yaml)"

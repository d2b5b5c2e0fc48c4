"""Providers, found by name in FACTS (spotrun.providers.facts)."""

from __future__ import annotations

from typing import Any

from spotrun.providers.base import (TAG_ATTEMPT, TAG_JOB, TAG_MANAGED, InstanceInfo,
                                    LaunchPlan, LaunchRequest, Pool, PricePoint, Provider,
                                    ProviderFacts)
from spotrun.providers.facts import FACTS, facts_for

PROVIDERS = {name: f.make for name, f in FACTS.items()}


def make_provider(settings: Any, **kw: Any) -> Provider:
    """The provider named by settings.provider."""
    return facts_for(settings).make(settings, **kw)


__all__ = ["FACTS", "PROVIDERS", "InstanceInfo", "LaunchPlan", "LaunchRequest", "Pool",
           "PricePoint", "Provider", "ProviderFacts", "TAG_ATTEMPT", "TAG_JOB", "TAG_MANAGED",
           "facts_for", "make_provider"]

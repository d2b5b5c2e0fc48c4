"""The providers by name, and what the rest of spotrun may know of one without calling it.

Each provider is one folder under `spotrun/providers/` whose `__init__` declares its
`ProviderFacts` (zones, clock, billing rules, factory, ...); adding a provider is adding a
folder and a line here. No module outside `spotrun/providers/` asks which provider it is.
"""

from __future__ import annotations

from typing import Any, Callable

from spotrun.catalog import Catalog, catalog_od_price, load_catalog
from spotrun.errors import ConfigError
from spotrun.providers.billing_rules import BillingRules
from spotrun.providers import aws, gcp, local
from spotrun.providers.base import ProviderFacts

FACTS: dict[str, ProviderFacts] = {f.name: f for f in (local.FACTS, aws.FACTS, gcp.FACTS)}


def facts_for(settings: Any) -> ProviderFacts:
    """The facts of the provider settings name; ConfigError for an unknown one."""
    facts = FACTS.get(settings.provider)
    if facts is None:
        raise ConfigError(f"unknown provider; allowed: {', '.join(FACTS)}", field="provider",
                          value=settings.provider)
    return facts


def rules_for(provider: str) -> BillingRules:
    """The billing rules a provider declares; ConfigError if it declares none."""
    facts = FACTS.get(provider)
    rules = facts.billing_rules() if facts is not None else None
    if rules is None:
        raise ConfigError(f"no billing rules for provider {provider!r}; allowed: "
                          f"{', '.join(FACTS)}", field="provider", value=provider)
    return rules


def catalog_for(settings: Any) -> Catalog:
    """The packaged catalog of the configured provider (its facts name the file)."""
    return load_catalog(facts_for(settings).catalog)


def od_price_for(settings: Any) -> Callable[[str], float | None]:
    """On-demand USD/h by instance type in the configured provider's catalog and region (with
    several clouds, `providers`: the catalog of the cloud whose type it is)."""
    prices = [catalog_od_price(FACTS[c].price_region(settings), FACTS[c].catalog)
              for c in settings.clouds]
    if len(prices) == 1:
        return prices[0]

    def price(instance_type: str) -> float | None:
        return next((p for p in (f(instance_type) for f in prices) if p is not None), None)
    return price

"""Providers, found by name in PROVIDERS."""

from __future__ import annotations

from typing import Any, Callable

from spotrun.errors import ConfigError
from spotrun.providers.base import (TAG_ATTEMPT, TAG_JOB, TAG_MANAGED, InstanceInfo,
                                    LaunchPlan, LaunchRequest, Pool, PricePoint, Provider)

ProviderFactory = Callable[..., Provider]


def _local(settings: Any, **kw: Any) -> Provider:
    from spotrun.providers.local import LocalProvider
    return LocalProvider.from_settings(settings, **kw)


def _aws(settings: Any, **kw: Any) -> Provider:
    from spotrun.providers.aws import AwsProvider  # boto3 only when asked for
    return AwsProvider.from_settings(settings, **kw)


PROVIDERS: dict[str, ProviderFactory] = {"local": _local, "aws": _aws}


def make_provider(settings: Any, **kw: Any) -> Provider:
    """The provider named by settings.provider."""
    factory = PROVIDERS.get(settings.provider)
    if factory is None:
        raise ConfigError(f"unknown provider; allowed: {', '.join(PROVIDERS)}", field="provider",
                          value=settings.provider)
    return factory(settings, **kw)


__all__ = ["PROVIDERS", "InstanceInfo", "LaunchPlan", "LaunchRequest", "Pool", "PricePoint",
           "Provider", "TAG_ATTEMPT", "TAG_JOB", "TAG_MANAGED", "make_provider"]

"""What the rest of spotrun may know about a provider from settings alone, without calling it.

Each provider declares its facts here next to its factory, so no module outside
`spotrun/providers/` ever asks which provider it is talking to.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from spotrun.errors import ConfigError

DEFAULT_AWS_ZONES = {
    "us-east-1": ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1e",
                  "us-east-1f"],
    "us-east-2": ["us-east-2a", "us-east-2b", "us-east-2c"],
    "us-west-2": ["us-west-2a", "us-west-2b", "us-west-2c", "us-west-2d"],
}


@dataclass(frozen=True)
class ProviderFacts:
    """Static facts of one provider kind, read from settings."""

    name: str
    make: Callable[..., Any]                          # settings, **kw -> Provider
    known_zones: Callable[[Any], list[str]]           # zones it can launch into
    time_scale: Callable[[Any], float]                # provider-clock seconds per wall second
    billed_volume_gb: Callable[[Any], float]          # disk billed per instance beside the GPU
    agent_extras: Callable[[Any], dict[str, Any]]     # provider-specific agent settings
    clock_name: str = "wall"                          # how the CLI labels the provider's clock
    billing_rules: Callable[[], Any] = lambda: None   # spotrun.ledger.rules.BillingRules
    # What the cloud itself bills (the audit's truth where a provider has one), or None.
    market_truth: Callable[[Any], Any] = lambda st: None
    doctor: Callable[[Any], list[Any]] | None = None  # cloud checks for `spotrun doctor`
    bills_cost_explorer: bool = False                 # `audit --reconcile` can ask the cloud
    # The c10d rendezvous port of a multi-node job on its host node; 0: a free port the daemon
    # picks (every local node shares 127.0.0.1, so a fixed port would collide across jobs).
    rdzv_port: int = 0


def local_trace_path(settings: Any) -> Path:
    """The availability trace the local market replays (the packaged demo extract by default)."""
    if settings.local.trace:
        return Path(settings.local.trace)
    from spotrun.market.options import DEMO_TRACE
    return Path(str(resources.files("spotrun.data").joinpath("traces", DEMO_TRACE)))


def _local_zones(settings: Any) -> list[str]:
    try:
        header = local_trace_path(settings).read_text(encoding="utf-8").splitlines()[0].split(",")
    except (OSError, IndexError):
        return []
    pools = header[2:]
    if settings.local.pools:
        pools = [p for p in pools if p in settings.local.pools]
    return pools


def _aws_zones(settings: Any) -> list[str]:
    # Configured subnets ("zone=subnet-id") say where launches can go.
    subnets = [s.split("=", 1)[0].strip() for s in settings.aws.subnets if "=" in s]
    if subnets:
        return sorted(set(subnets))
    return list(DEFAULT_AWS_ZONES.get(settings.region, []))


def _make_local(settings: Any, **kw: Any) -> Any:
    from spotrun.providers.local import LocalProvider
    return LocalProvider.from_settings(settings, **kw)


def _make_aws(settings: Any, **kw: Any) -> Any:
    from spotrun.providers.aws import AwsProvider  # boto3 only when asked for
    return AwsProvider.from_settings(settings, **kw)


def _aws_rules() -> Any:
    from spotrun.ledger.rules import AWS_RULES
    return AWS_RULES


def _local_rules() -> Any:
    # The local market imitates AWS, so its bill follows the same rules.
    from dataclasses import replace
    from spotrun.ledger.rules import AWS_RULES
    return replace(AWS_RULES, provider="local")


def _local_truth(settings: Any) -> Any:
    from spotrun.audit.market_truth import LocalMarketTruth
    return LocalMarketTruth.from_settings(settings)


def _aws_doctor(settings: Any) -> list[Any]:
    from spotrun.providers.aws_doctor import AwsDoctor  # boto3 only when asked for
    return AwsDoctor(settings).run()


FACTS: dict[str, ProviderFacts] = {
    "local": ProviderFacts(
        name="local", make=_make_local, known_zones=_local_zones,
        time_scale=lambda st: float(st.local.time_scale), billed_volume_gb=lambda st: 0.0,
        agent_extras=lambda st: {}, clock_name="market", billing_rules=_local_rules,
        market_truth=_local_truth),
    "aws": ProviderFacts(
        name="aws", make=_make_aws, known_zones=_aws_zones, time_scale=lambda st: 1.0,
        billed_volume_gb=lambda st: float(st.aws.volume_size_gb),
        agent_extras=lambda st: ({"imds_endpoint": st.aws.imds_endpoint}
                                 if st.aws.imds_endpoint else {}),
        billing_rules=_aws_rules, doctor=_aws_doctor, bills_cost_explorer=True,
        rdzv_port=29400),
}


def facts_for(settings: Any) -> ProviderFacts:
    """The facts of the provider settings name; ConfigError for an unknown one."""
    facts = FACTS.get(settings.provider)
    if facts is None:
        raise ConfigError(f"unknown provider; allowed: {', '.join(FACTS)}", field="provider",
                          value=settings.provider)
    return facts

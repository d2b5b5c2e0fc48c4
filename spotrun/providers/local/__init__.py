"""The `local` provider: a simulated spot market on this machine, and what it bills.

Control plane: `provider` (LocalProvider, the market's HTTP client side). Instance side:
`market/` (the durable market process: trace replay on its own clock, instances as
process groups, IMDS with notices, reclaims). `truth` reads back what the market offered,
for the audit. This module is cheap to import: it declares the provider's facts only.
"""

from __future__ import annotations

from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

from spotrun.providers.aws import AWS_RULES
from spotrun.providers.base import ProviderFacts, ProviderFeature

# The market answers for every pool at once, moves on its trace's rows, and can be read from
# its trace without starting it (plan, dry-run).
LOCAL_FEATURES = frozenset({ProviderFeature.MARKET_VIEW, ProviderFeature.DECISION_GRID,
                            ProviderFeature.RESTING_MARKET})

# The local market imitates AWS, so its bill follows the same rules.
LOCAL_RULES = replace(AWS_RULES, provider="local")


def local_trace_path(settings: Any) -> Path:
    """The availability trace the local market replays (the packaged demo extract by default)."""
    if settings.local.trace:
        return Path(settings.local.trace)
    from spotrun.providers.local.market.options import DEMO_TRACE  # lazy: cheap facts
    return Path(str(resources.files("spotrun.data").joinpath("traces", DEMO_TRACE)))


def _zones(settings: Any) -> list[str]:
    try:
        header = local_trace_path(settings).read_text(encoding="utf-8").splitlines()[0].split(",")
    except (OSError, IndexError):
        return []
    pools = header[2:]
    if settings.local.pools:
        pools = [p for p in pools if p in settings.local.pools]
    return pools


def _agent_extras(settings: Any) -> dict[str, Any]:
    """A paced market hears from the agent when the job trains, and runs its notices at their
    own rate (docs/local-provider.md): the agent times the job's deadline by it."""
    if settings.local.pacing != "rehearsal":
        return {}
    from spotrun.providers.local.market.options import MarketOptions  # lazy: cheap facts
    return {"report_phases": True,
            "notice_time_scale": MarketOptions.from_settings(settings).notice_rate()}


def _terminate_wall_s(settings: Any) -> float:
    from spotrun.providers.local.market.options import MarketOptions  # lazy: cheap facts
    return float(MarketOptions.from_settings(settings).grace_s)


def _make(settings: Any, **kw: Any) -> Any:
    from spotrun.providers.local.provider import LocalProvider  # lazy: cheap facts
    return LocalProvider.from_settings(settings, **kw)


def _truth(settings: Any) -> Any:
    from spotrun.providers.local.truth import LocalMarketTruth  # lazy: cheap facts
    return LocalMarketTruth.from_settings(settings)


FACTS = ProviderFacts(
    name="local", make=_make, known_zones=_zones,
    time_scale=lambda st: float(st.local.time_scale), billed_volume_gb=lambda st: 0.0,
    agent_extras=_agent_extras, clock_name="market", billing_rules=lambda: LOCAL_RULES,
    market_truth=_truth,
    # The market posts a notice `local.notice_s` before every reclaim, except one asked for
    # with `spotrun interrupt --notice-s 0` or one that comes sooner after launch than that.
    notice_window_s=lambda st: float(st.local.notice_s), notice_prior=0.99,
    # A terminated instance gets SIGTERM, then SIGKILL after the market's grace (wall
    # seconds): the budget stop margin's prior until stops are measured.
    terminate_wall_s=_terminate_wall_s,
    # The market replays AWS traces with AWS's 2-minute notice: AWS's quarantine, in market
    # seconds (aws/__init__.py).
    notice_quarantine_s=720.0,
    # Every local instance shares this machine's disk: one folder per job and node, outside
    # the instances' own folders, so an attempt finds the path the last one used.
    job_dir=lambda st: str(st.home_path / "market" / "jobs" / "{job_id}" / "node-{node_rank}"),
    catalog="aws",   # the market replays AWS traces of AWS types
    features=LOCAL_FEATURES,
    # One whole simulated market on this machine, on its own clock, with AWS's types: no
    # other cloud can share its daemon.
    runs_alone=True)

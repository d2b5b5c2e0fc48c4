"""The one decision on settings alone: the market view, the history, the deadline.

`spotrun plan` and `spotrun submit --dry-run` read the market exactly as the daemon
will (a running local market, or its trace without starting it; EC2 prices on AWS), so the
first candidate they print is what the daemon launches first when the market holds still.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from spotrun.catalog import Catalog
from spotrun.config import Settings
from spotrun.costmodel.history import DbHistory, HistorySource, NoHistory
from spotrun.costmodel.notice_loss import notice_prior_of
from spotrun.decide import (Placement, catalog_snapshot, decide, hours_left,
                            refusal)
from spotrun.decide.deadline import DEFAULT_TICK_S, first_decision, policy_places
from spotrun.decide.market import MarketSnapshot, peek_snapshot
from spotrun.decide.quarantine import recent_notices
from spotrun.errors import SpotrunError
from spotrun.providers.facts import facts_for
from spotrun.spec import JobSpec


def history(settings: Settings) -> HistorySource:
    """The state database's history when there is one; reading never creates it."""
    engine = _engine(settings)
    return NoHistory() if engine is None else DbHistory(engine)


def _engine(settings: Settings) -> Any:
    """The state database's engine, or None when there is none (reading never creates it)."""
    # lazy: start-up cost: no database code for plan on a fresh home
    from spotrun.db import database_missing, make_engine
    if database_missing(settings):
        return None
    return make_engine(settings.database_url)


def with_notices(settings: Settings, market: MarketSnapshot, engine: Any) -> MarketSnapshot:
    """The provider's market with the recent notices the daemon would see with it (engine:
    the state database's, None: none yet). Read at the snapshot's time, the provider's clock,
    as the daemon's pass reads them."""
    if engine is None:
        return market
    window_s = facts_for(settings).notice_quarantine_s
    return replace(market, quarantine=recent_notices(engine, market.at, window_s))


def live_market(settings: Settings, catalog: Catalog, zones: list[str] | None
                ) -> tuple[MarketSnapshot, Any]:
    """The provider's market as the daemon reads it (nothing started, nothing written)."""
    # lazy: start-up cost: a provider (and its SDK) only when a live market is read
    from spotrun.providers import make_provider
    provider = make_provider(settings)
    return peek_snapshot(provider, catalog.names(), zones), provider


def offline_market(settings: Settings, catalog: Catalog, zones: list[str]) -> MarketSnapshot:
    """The packaged catalog's prices in the provider's zones (in its pricing region)."""
    region = facts_for(settings).price_region(settings)
    return catalog_snapshot(catalog, region, zones, datetime.now(timezone.utc))


def decide_for_cli(spec: JobSpec, settings: Settings, catalog: Catalog, market: MarketSnapshot,
                   *, provider: Any = None, refuse: bool = True,
                   history: HistorySource | None = None) -> Placement:
    """decide() on the CLI's inputs; raises the refusal (exit 2) for a job that never runs
    (history: the pool history to read, default the state database's where there is one)."""
    engine = _engine(settings) if history is None or provider is not None else None
    hist: HistorySource = history or (NoHistory() if engine is None else DbHistory(engine))
    left = hours_left(spec.policy.deadline, datetime.now(timezone.utc))
    facts = facts_for(settings)
    scale = facts.time_scale(settings)
    notice = notice_prior_of(facts, settings)
    hints = {}
    if provider is not None:
        types = list(spec.resources.instance_types or catalog.names())
        hints = provider.risk_hints(types, list(market.zones))
        # The daemon's market: with the pools its recent notices close (not on catalog prices,
        # whose time is the wall's, not the provider's).
        market = with_notices(settings, market, engine)
    # lazy: start-up cost (numpy, the priors), only when a risk is read
    from spotrun.costmodel.risk import risk_model
    placed = decide(spec, catalog=catalog, market=market, history=hist, hours_left=left,
                    time_scale=scale, risk=risk_model(catalog, hints=hints), notice=notice)
    if refuse:
        err = refusal(spec, placed.ranking, catalog=catalog, market=market, history=hist,
                      hours_left=left, notice=notice)
        if err is not None:
            raise err
    if policy_places(spec, has_measured_speed=False):
        placed = _with_policy(spec, settings, placed, market, provider)
    return placed


def _with_policy(spec: JobSpec, settings: Settings, placed: Placement, market: MarketSnapshot,
                 provider: Any) -> Placement:
    """A deadline job's first launch: the policy's pick for the ranked type (as the daemon)."""
    tick_s = settings.daemon.policy_tick_s or _natural_tick(provider) or DEFAULT_TICK_S
    first = first_decision(spec, placed.ranking.candidates, market,
                           policy_name=settings.daemon.policy, tick_s=tick_s,
                           changeover_s=settings.daemon.policy_changeover_s or None,
                           now=datetime.now(timezone.utc))
    if first is None:
        return placed
    decision, target = first
    if target is None:
        return replace(placed, candidates=[], policy_decision=decision,
                       wait_reason=f"the deadline policy {settings.daemon.policy} waits "
                                   f"(idle) this interval")
    return replace(placed, candidates=[target], policy_decision=decision)


def _natural_tick(provider: Any) -> float | None:
    if provider is None:
        return None
    try:
        return provider.offline_tick_s()
    except SpotrunError:
        return None

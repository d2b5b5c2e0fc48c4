"""Deadline jobs: the shared policy (decide.policy) picks market and zone for the ranked type.

Pure pieces used by the daemon's placer (one decision per interval, with the market it
recorded) and by the dry-run (the first decision, on a one-row market): so both put the
same pool first when the market has not changed in between.
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime

import numpy as np

from spotrun.decide.market import MarketSnapshot
from spotrun.decide.policy import (Decision, JobProgress, MarketHistory, Mode, make_policy,
                                   policy_step)
from spotrun.decide.rank import Candidate
from spotrun.errors import SpotrunError
from spotrun.spec import JobSpec
from spotrun.states import Market, MarketPolicy

DEFAULT_TICK_S = 300.0      # decision interval where the provider has no natural one


def policy_places(spec: JobSpec, has_measured_speed: bool) -> bool:
    """True for jobs the policy places: a deadline, market auto, and a work estimate."""
    if not spec.policy.deadline or spec.policy.market is not MarketPolicy.AUTO:
        return False
    if spec.work.reference_hours is not None:
        return True
    # Steps only: the policy takes over once the agent has measured a speed.
    return spec.work.total_steps is not None and has_measured_speed


def deadline_on_provider_clock(deadline: datetime, created_at: datetime, provider_now: datetime,
                               time_scale: float) -> datetime:
    """The job's deadline on the provider's clock, computed once per job.

    A cloud's clock is the wall's, so the deadline stays as written; an accelerated market
    (time_scale > 1) keeps the deadline's distance from submission in its own hours.
    """
    if time_scale == 1.0:
        return deadline
    return provider_now + (deadline - created_at)


def market_rows(market: MarketSnapshot, itype: str, zones: list[str]
                ) -> list[tuple[str, bool, float]]:
    """(zone, spot available now, spot USD/h) per zone of the type, in the provider's order.

    Without an availability feed (AWS) a priced pool counts as available; a refused launch
    shows up as a failed attempt, and the next interval decides again.
    """
    rows: list[tuple[str, bool, float]] = []
    for z in market.zones:
        if zones and z not in zones:
            continue
        price = market.spot_price(itype, z)
        rows.append((z, price is not None and market.is_available(itype, z),
                     float(price) if price is not None else math.nan))
    return rows


def one_row_history(rows: list[tuple[str, bool, float]], od_price: float,
                    tick_s: float) -> MarketHistory:
    """The market of one interval as the policy's history (what a first decision sees)."""
    return MarketHistory([z for z, _, _ in rows],
                         np.asarray([[u for _, u, _ in rows]], dtype=bool),
                         np.asarray([[p for _, _, p in rows]], dtype=np.float64),
                         od_price, tick_s)


def work_seconds(spec: JobSpec, mine: list[Candidate], measured_steps_per_s: float | None,
                 steps_done: int, clock_done_s: float) -> tuple[float, float] | None:
    """(total, done) productive seconds on the type; None when the work cannot be told."""
    if spec.work.total_steps and measured_steps_per_s:
        return (spec.work.total_steps / measured_steps_per_s,
                steps_done / measured_steps_per_s)
    if spec.work.reference_hours is not None:
        speedup = mine[0].speedup if mine else 1.0
        return spec.work.reference_hours * 3600.0 / speedup, clock_done_s
    return None


def policy_target(decision: Decision, itype: str, mine: list[Candidate]) -> Candidate | None:
    """The launch pool and the cost model's figures for a decision (None for idle)."""
    if decision.mode is Mode.IDLE:
        return None
    market = Market.SPOT if decision.mode is Mode.SPOT else Market.ON_DEMAND
    same_market = [c for c in mine if c.market is market]
    if market is Market.SPOT:
        exact = [c for c in same_market if c.zone == decision.pool]
        figures = (exact or same_market or mine or [None])[0]
        zone = decision.pool or ""
    else:
        figures = (same_market or mine or [None])[0]
        zone = figures.zone if figures is not None else ""
    if figures is None:
        raise SpotrunError("the cost model offers no pool of this type", field="instance_type",
                           value=itype)
    if figures.market is not market or figures.zone != zone:
        figures = replace(figures, market=market, zone=zone)
    return figures


def first_decision(spec: JobSpec, ranked: list[Candidate], market: MarketSnapshot, *,
                   policy_name: str, tick_s: float, changeover_s: float | None,
                   now: datetime) -> tuple[Decision, Candidate | None] | None:
    """The policy's decision for a job that has never run (the dry-run's first launch)."""
    if not ranked:
        return None
    itype = ranked[0].instance_type
    mine = [c for c in ranked if c.instance_type == itype]
    rows = market_rows(market, itype, list(spec.resources.zones))
    od = market.on_demand_price(itype)
    history = one_row_history(rows, od if od is not None else math.nan, tick_s)
    change = changeover_s or (mine[0].restart_s if mine else 0.0)
    work = work_seconds(spec, mine, None, 0, 0.0)
    if work is None or not spec.policy.deadline:
        return None
    deadline = datetime.fromisoformat(spec.policy.deadline)
    progress = JobProgress(work_total_s=round(work[0], 3), work_done_s=0.0,
                           time_left_s=round((deadline - now).total_seconds(), 3),
                           elapsed_s=0.0, changeover_s=round(change, 3), tick_s=tick_s)
    decision = policy_step(make_policy(policy_name), progress, history.view(0),
                           closed=market.closed_zones(itype))
    return decision, policy_target(decision, itype, mine)


__all__ = ["DEFAULT_TICK_S", "deadline_on_provider_clock", "first_decision", "market_rows",
           "one_row_history", "policy_places", "policy_step", "policy_target", "work_seconds"]

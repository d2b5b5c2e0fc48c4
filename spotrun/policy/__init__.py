"""Scheduling policies: one decision interface for the daemon and `spotrun simulate`.

`POLICIES` maps each name to a factory of a fresh policy (one per job or run).
`optimal` is not here: it needs the whole trace, so only the simulator runs it.
"""

from __future__ import annotations

from typing import Callable

from spotrun.errors import BadInputError
from spotrun.policy.base import (IDLE, ON_DEMAND, Decision, JobProgress, Mode, Policy,
                                 SafePolicy, safety_net)
from spotrun.policy.market import MarketHistory, MarketView
from spotrun.policy.rules import GreedyPolicy, OnDemandPolicy, UniformProgressPolicy
from spotrun.policy.select import SpotrunPolicy
from spotrun.policy.spotrun import ReservePolicy

POLICIES: dict[str, Callable[[], Policy]] = {
    "on-demand": OnDemandPolicy,
    "greedy": GreedyPolicy,
    "uniform-progress": UniformProgressPolicy,
    "reserve": ReservePolicy,
    "spotrun": SpotrunPolicy,
}

OPTIMAL = "optimal"
ALL_POLICY_NAMES = ["on-demand", "greedy", "uniform-progress", "optimal", "reserve", "spotrun"]
DEFAULT_POLICY = "spotrun"


def make_policy(name: str) -> Policy:
    """A fresh online policy by name; raises BadInputError for unknown (or hindsight) names."""
    factory = POLICIES.get(name)
    if factory is None:
        raise BadInputError(f"unknown online policy {name!r}; allowed: {', '.join(POLICIES)}",
                            field="policy", value=name)
    return factory()


__all__ = ["ALL_POLICY_NAMES", "DEFAULT_POLICY", "Decision", "IDLE", "JobProgress",
           "MarketHistory", "MarketView", "Mode", "ON_DEMAND", "OPTIMAL", "POLICIES", "Policy",
           "SafePolicy", "make_policy", "safety_net"]

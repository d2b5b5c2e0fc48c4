"""Deadline policies: one decision interface for the daemon and `spotrun simulate`.

The policy belongs to the decision (spotrun.decide): for a deadline job it picks, once per
interval, idle, on-demand or spot in one pool; `decide.deadline` turns that into a launch.
`POLICIES` maps each name to a factory of a fresh policy (one per job or run).
`optimal` is not here: it needs the whole trace, so only the simulator runs it
(spotrun.simulate.optimal).
"""

from __future__ import annotations

from typing import Callable

from spotrun.decide.policy.base import (IDLE, ON_DEMAND, Decision, JobProgress, Mode, Policy,
                                        SafePolicy, policy_step, safety_net)
from spotrun.decide.policy.history import MarketHistory, MarketView
from spotrun.decide.policy.markov import MarkovTiersPolicy
from spotrun.decide.policy.reserve import ReservePolicy
from spotrun.decide.policy.rules import GreedyPolicy, OnDemandPolicy, UniformProgressPolicy
from spotrun.decide.policy.spotrun import SpotrunPolicy
from spotrun.errors import BadInputError

POLICIES: dict[str, Callable[[], Policy]] = {
    "on-demand": OnDemandPolicy,
    "greedy": GreedyPolicy,
    "uniform-progress": UniformProgressPolicy,
    "reserve": ReservePolicy,
    "markov-tiers": MarkovTiersPolicy,
    "spotrun": SpotrunPolicy,
}

OPTIMAL = "optimal"
# What `spotrun simulate` runs by default; it also takes "markov-tiers" (spotrun's plan without
# the shadow-run guard) by name.
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
           "SafePolicy", "make_policy", "policy_step", "safety_net"]

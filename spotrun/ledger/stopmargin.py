"""The stop margin: provider seconds of spend a budget leaves for stopping a running job.

A budget stops its jobs while there is room for the stop still to come; the margin is that
room, per node, at the job's price (spotrun.ledger.committed). It follows what a stop takes:

- each budget stop is measured: wall seconds from the job's stop request (its
  `budget_stop_requested` event) to the reconcile loop seeing the instance gone, kept on
  the attempt (`Attempt.budget_stop_wall_s`, `record_stop`);
- the stop time is the prior, raised by any longer one among the last `RECENT_STOPS`
  measured (measured stops never lower it); the prior is the longest stop the daemon
  allows (`prior_stop_wall_s`): the reconcile loop's save window
  (`SAVE_WINDOW_S`: it terminates an instance that has not stopped by then), a reconcile
  tick before the window opens and one after it closes, then the provider's stated
  terminate time (`ProviderFacts.terminate_wall_s`). A budget is never overrun: the margin
  covers a job that never saves and has to be terminated;
- to it comes one check interval of the daemon (the longer of the spend and schedule
  loops'): a crossing is seen at the next check, not the moment it happens;
- wall seconds become provider seconds at the market's time scale (x60: a 4 s stop is 240
  market seconds of spend);
- never below the floor: the provider's minimum billed seconds per instance (EC2 and the
  local market: 60 s, per-second billing with a 60-second minimum), which any launch costs.

`StopMargin.seconds(s)` is the one place the margin is computed; the spend loop's job
budgets and the project and owner budgets (spotrun.budgets.standing) both read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlmodel import select

from spotrun.db import Attempt, Event
from spotrun.providers.facts import facts_for, rules_for

RECENT_STOPS = 20     # measured stops the margin follows (the longest of them)
STOP_GRACE_S = 10.0   # the agent's own SIGTERM-to-SIGKILL grace (AgentConfig.stop_grace_s)
# The reconcile loop terminates a budget-stopped instance that has not stopped by itself
# this many wall seconds after asking it to save (spotrun/daemon/reconcile.py): the save,
# then the agent's grace for the job to exit.
SAVE_WINDOW_S = 2 * STOP_GRACE_S


@dataclass(frozen=True)
class StopMargin:
    """How a daemon computes its stop margin (provider seconds) from the stops it measured."""

    time_scale: float = 1.0       # provider seconds per wall second
    prior_wall_s: float = 0.0     # the stop time before any is measured
    check_wall_s: float = 0.0     # a crossing is seen within this long
    floor_s: float = 60.0         # provider seconds, whatever is measured

    @classmethod
    def fixed(cls, seconds: float) -> "StopMargin":
        """A margin of `seconds` on a real-time clock, raised only by longer measured stops."""
        return cls(floor_s=seconds)

    def of_stop(self, stop_wall_s: float) -> float:
        """The margin for a stop that takes stop_wall_s wall seconds."""
        return max(self.floor_s, (self.check_wall_s + stop_wall_s) * self.time_scale)

    def seconds(self, s: Any) -> float:
        """The margin now: the prior, raised by a longer stop measured in this database (one
        query). Measured stops only raise it: a quick stop seen on a quiet box must not let
        a budget be overrun by a slower one later (a loaded daemon's stop took longer)."""
        return self.of_stop(max([self.prior_wall_s, *recent_stops_wall_s(s)]))


def stop_margin_for(settings: Any) -> StopMargin:
    """The margin rule of the configured provider and the daemon's loop intervals."""
    facts = facts_for(settings)
    d = settings.daemon
    return StopMargin(time_scale=facts.time_scale(settings),
                      prior_wall_s=prior_stop_wall_s(d.reconcile_interval_s,
                                                     facts.terminate_wall_s(settings)),
                      check_wall_s=max(d.spend_interval_s, d.schedule_interval_s),
                      floor_s=rules_for(settings.provider).minimum_s)


def prior_stop_wall_s(reconcile_interval_s: float, terminate_wall_s: float) -> float:
    """The longest stop the daemon allows, wall seconds from the stop request to the
    instance gone: the request is taken up at the next reconcile tick, the instance is
    terminated at the first tick past the save window, and the provider takes its stated
    terminate time to stop it."""
    return reconcile_interval_s + SAVE_WINDOW_S + reconcile_interval_s + terminate_wall_s


def recent_stops_wall_s(s: Any) -> list[float]:
    """The wall seconds the last RECENT_STOPS measured budget stops took."""
    return [float(v) for v in s.exec(
        select(Attempt.budget_stop_wall_s).where(Attempt.budget_stop_wall_s.is_not(None))
        .order_by(Attempt.id.desc()).limit(RECENT_STOPS))]


def record_stop(s: Any, attempt: Attempt, now: datetime) -> float | None:
    """On a budget-stopped attempt's end (wall `now`): how long its stop took since the job's
    stop request, kept on the attempt; None when no request is recorded. Caller commits."""
    asked = s.exec(select(Event.ts).where(Event.job_id == attempt.job_id,
                                          Event.kind == "budget_stop_requested")
                   .order_by(Event.id.desc()).limit(1)).first()
    if asked is None:
        return None
    attempt.budget_stop_wall_s = max((now - asked).total_seconds(), 0.0)
    return attempt.budget_stop_wall_s

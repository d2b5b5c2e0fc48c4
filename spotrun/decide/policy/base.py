"""The decision interface shared by the daemon and `spotrun simulate`.

A policy is asked once per decision interval (`tick_s` seconds) what the job should
run on *for the coming interval*: nothing (idle), on-demand, or spot in one pool.
It sees only what is known at that moment: the job's progress (`JobProgress`) and
the market up to now (`MarketView`). Times are seconds throughout, so the daemon
(market seconds) and the simulator (whole ticks of `tick_s`) use the same code.

Every decision passes through `safety_net`, which keeps an on-demand finish
feasible whatever the spot market does next: that is what guarantees deadlines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterable, NamedTuple, Protocol

from spotrun.decide.policy.history import ClosedView, MarketView
from spotrun.errors import SpotrunError

# Float slack when comparing seconds that are sums of whole ticks.
_EPS_S = 1e-6
# Guards ceil/floor of seconds over ticks against float noise (as simulate.model rounds).
_ROUND_EPS = 1e-9


class Mode(str, Enum):
    """What the job runs on during one interval."""

    IDLE = "idle"
    ON_DEMAND = "on-demand"
    SPOT = "spot"


@dataclass(frozen=True)
class Decision:
    """One decision: a mode, and for spot the pool (a trace column / zone name)."""

    mode: Mode
    pool: str | None = None

    def __post_init__(self) -> None:
        if (self.mode is Mode.SPOT) != (self.pool is not None):
            raise ValueError("a spot decision names a pool; other modes name none")


IDLE = Decision(Mode.IDLE)
ON_DEMAND = Decision(Mode.ON_DEMAND)


class JobProgress(NamedTuple):
    """The job as the scheduler knows it now (all durations in seconds)."""

    work_total_s: float          # reference work (seconds of productive running)
    work_done_s: float           # productive seconds done (survives reclaims)
    time_left_s: float           # from now to the deadline
    elapsed_s: float             # from the job's start to now
    changeover_s: float          # paid, unproductive time of every launch or move
    tick_s: float                # decision interval
    mode: Mode = Mode.IDLE       # what the job is on now
    pool: str | None = None      # the spot pool it is on, if any
    changeover_left_s: float = 0.0  # of the current launch, still to pay (0 = productive)

    @property
    def remaining_s(self) -> float:
        """Productive seconds still needed."""
        r = self.work_total_s - self.work_done_s
        return r if r > 0.0 else 0.0

    @property
    def slack_s(self) -> float:
        """Time to spare if the job moved to on-demand now (changeover included)."""
        r = self.work_total_s - self.work_done_s
        return self.time_left_s - (r if r > 0.0 else 0.0) - self.changeover_s

    @property
    def deadline_s(self) -> float:
        """Deadline measured from the job's start."""
        return self.elapsed_s + self.time_left_s

    @property
    def current(self) -> Decision:
        """The current placement as a Decision (to 'stay', return this)."""
        if self.mode is Mode.SPOT:
            return Decision(Mode.SPOT, self.pool)
        return Decision(self.mode)


class Policy(Protocol):
    """Decides each interval; may keep state between calls of one job."""

    name: str

    def decide(self, job: JobProgress, market: "MarketView") -> Decision:
        """What to run on for the coming interval."""
        ...


def job_shape(job: JobProgress) -> tuple[int, int, int]:
    """(work, deadline, changeover) in ticks, rounded as the simulator rounds hours."""
    tick = job.tick_s
    return (max(1, math.ceil(job.work_total_s / tick - _ROUND_EPS)),
            max(1, math.floor(job.deadline_s / tick + _ROUND_EPS)),
            max(0, math.floor(job.changeover_s / tick + 0.5)))


def spot_is_safe(job: JobProgress, pool: str) -> bool:
    """True when running spot in pool this interval leaves on-demand able to finish in time.

    Worst case: the pool reclaims right after this interval's work (or changeover), and
    the reclaim itself costs one interval; the fallback then pays a full changeover.
    """
    tick = job.tick_s
    if job.mode is Mode.SPOT and job.pool == pool:
        still_to_pay = job.changeover_left_s
    else:
        still_to_pay = job.changeover_s
    return job.slack_s + _EPS_S >= still_to_pay + tick


def idle_is_safe(job: JobProgress) -> bool:
    """True when waiting one interval still leaves an on-demand finish in time."""
    return job.slack_s + _EPS_S >= job.tick_s


def safety_net(job: JobProgress, decision: Decision) -> Decision:
    """Replace decision by on-demand when it could make the deadline unreachable."""
    if decision.mode is Mode.ON_DEMAND:
        return decision
    if decision.mode is Mode.IDLE:
        return decision if idle_is_safe(job) else ON_DEMAND
    return decision if spot_is_safe(job, decision.pool or "") else ON_DEMAND


class SafePolicy:
    """Base class: subclasses implement `choose`; `decide` applies the safety net."""

    name = "base"

    def choose(self, job: JobProgress, market: "MarketView") -> Decision:
        """The policy's own wish for the coming interval."""
        raise NotImplementedError

    def decide(self, job: JobProgress, market: "MarketView") -> Decision:
        """The wish, made deadline-safe; done jobs idle."""
        if job.remaining_s <= _EPS_S:
            return IDLE
        return safety_net(job, self.choose(job, market))


def policy_step(policy: Any, progress: JobProgress, view: "MarketView", *,
                field: str = "policy", closed: Iterable[str] = ()) -> Decision:
    """The one place a deadline decision is taken, by the daemon's placer and the simulator.

    The policy sees the job's progress and the market up to now; a spot decision must name a
    pool that is available now (a policy that breaks this is a bug, reported as such). A
    pool closed by a recent notice (`closed`: the daemon's notices; and every reclaim the
    history saw within its quarantine) looks unavailable, unless the job is on it already.
    """
    view = closed_view(progress, view, closed)
    d = policy.decide(progress, view)
    if d.mode is Mode.SPOT:
        pools = view.pools
        if d.pool not in pools or not view.up_now()[pools.index(d.pool)]:
            raise SpotrunError(f"policy {getattr(policy, 'name', policy)!r} chose unavailable "
                               f"pool {d.pool!r}", field=field)
    return d


def closed_view(progress: JobProgress, view: "MarketView", closed: Iterable[str] = ()
                ) -> "MarketView":
    """The view a policy decides on: pools closed to launches look unavailable now.

    Staying is not a launch, so the pool the job runs on stays as it is.
    """
    names = set(closed)
    shut = view.closed_now()
    if not names and (shut is None or not any(shut)):
        return view
    here = progress.pool if progress.mode is Mode.SPOT else None
    blocked = {j for j, p in enumerate(view.pools)
               if p != here and (p in names or (shut is not None and shut[j]))}
    return ClosedView(view, blocked) if blocked else view

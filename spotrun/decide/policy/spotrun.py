"""spotrun's policy: follow the plan unless the market seen so far showed a rule beating it.

Candidates: `markov-tiers` (the plan: the job's exact remaining work and slack solved on a
model of the market seen so far, with the pools in price tiers, markov.py) and the two
simple rules, greedy and Uniform Progress. It follows the plan unless the better rule
beat it by more than twice the standard error of the difference over the windows (plus
the changeover when the plan is already followed). With no window, the plan. (Issue 26;
the rule-first selector it replaced, and why it lost: docs/benchmarks.md.)

The policy cannot know the future, so it asks the past: it replays each candidate, in
shadow, on the job's own shape (work, deadline, changeover, in ticks) placed on the most
recent windows of the market seen so far.

- Windows: the last `WINDOWS` (16) spans of the job's deadline, ending on a grid of a
  quarter deadline (so runs and restarts share them): about the last 4.75 deadlines of
  the market. With less history than one deadline, one window of all the history so far,
  the job scaled to it (work and deadline in the same ratio, the same changeover); with
  less than that, none.
- Choice points: the job's start and every quarter deadline after it, so a market that
  changes regime mid-job is followed. The better rule is the one with the lower mean
  shadow cost; a switch between the rules must save more than one changeover at the
  on-demand price (the move it may cost). Ties keep the simpler rule.
- State: only a cache. The choice at every point is a function of the market rows up to it
  and the job's shape, so a restarted daemon with the same recorded market decides the same.
- Deadlines: every decision passes the same safety net as the rules' (an on-demand finish
  stays feasible whatever the market does next).
"""

from __future__ import annotations

import weakref

import numpy as np

from spotrun.decide.policy.base import IDLE, Decision, JobProgress, Policy, job_shape, safety_net
from spotrun.decide.policy.history import MarketHistory, MarketView
from spotrun.decide.policy.markov import MarkovTiersPolicy
from spotrun.decide.policy.replay import replay
from spotrun.decide.policy.rules import GreedyPolicy, UniformProgressPolicy

PLAN = "markov-tiers"
# The candidates by name, in order of preference on a tie: the simplest first.
CANDIDATES: dict[str, type] = {"greedy": GreedyPolicy, "uniform-progress": UniformProgressPolicy,
                               PLAN: MarkovTiersPolicy}
RULES = ("greedy", "uniform-progress")
WINDOWS = 16
# The plan is left only for a rule that beat it by this many standard errors: at one, the
# windows' noise alone often sent it to a rule that then lost (issue 26 figures).
PLAN_GUARD_SE = 2.0
# Choice points and window grid per deadline.
POINTS_PER_DEADLINE = 4
_EPS = 1e-9

# Shadow costs per history: {(start, work, deadline, changeover, name): USD}.
_SHADOW: "weakref.WeakKeyDictionary[MarketHistory, dict]" = weakref.WeakKeyDictionary()


def shadow_cost(h: MarketHistory, start: int, work: int, deadline: int, changeover: int,
                name: str) -> float:
    """Cost (USD) of candidate `name` on the job shape run over rows start..start+deadline-1."""
    per = _SHADOW.setdefault(h, {})
    key = (start, work, deadline, changeover, name)
    hit = per.get(key)
    if hit is None:
        hit = per[key] = replay(h, CANDIDATES[name](), start, work, deadline,
                                changeover).cost_usd
    return hit


def windows(now: int, work: int, deadline: int, changeover: int) -> list[tuple[int, int, int]]:
    """(start, work, deadline) of the shadow windows that end by tick `now` (inclusive)."""
    grid = max(1, -(-deadline // POINTS_PER_DEADLINE))
    end = (now + 1) // grid * grid                    # windows cover rows < end <= now + 1
    out = []
    for k in range(WINDOWS):
        e = end - k * grid
        if e - deadline < 0:
            break
        out.append((e - deadline, work, deadline))
    if out or end <= 0:
        return out
    # less history than one deadline: the job scaled to all of it
    w = max(1, round(work * end / deadline))
    if end >= w + changeover + 1 and w > changeover:
        out.append((0, w, end))
    return out


def choose_candidate(market: MarketView, shape: tuple[int, int, int],
                     current: str | None) -> str:
    """The candidate to follow from here (see the module docstring)."""
    work, deadline, changeover = shape
    wins = windows(market.now, work, deadline, changeover)
    if not wins:
        return current or PLAN
    h = market.h
    costs = {name: np.array([shadow_cost(h, s, w, d, changeover, name) for s, w, d in wins])
             for name in CANDIDATES}
    current = current or PLAN
    margin = changeover * h.tick_s / 3600.0 * h.od_price_usd_per_hour
    mean = {n: float(c.mean()) for n, c in costs.items()}
    # the better rule: the one with the lower mean (a switch between rules must still save
    # more than one changeover at the on-demand price, the move it may cost)
    rule = min(RULES, key=lambda n: mean[n])
    if current in RULES and rule != current and mean[rule] >= mean[current] - margin:
        rule = current
    # the plan unless that rule beat it beyond the windows' own noise (and the move)
    leave = margin if current == PLAN else 0.0
    return rule if beats(costs[rule], costs[PLAN], leave, PLAN_GUARD_SE) else PLAN


def beats(ours: np.ndarray, theirs: np.ndarray, margin_usd: float, se: float = 1.0) -> bool:
    """Whether ours saved more than margin_usd plus `se` standard errors of the saving, on
    average over the windows (their own noise)."""
    saving = theirs - ours
    noise = float(saving.std(ddof=1) / np.sqrt(len(saving))) if len(saving) > 1 else 0.0
    return float(saving.mean()) > margin_usd + se * noise


class SpotrunPolicy:
    """Follows the plan unless a rule beat it on the market seen so far (the daemon's default)."""

    name = "spotrun"

    def __init__(self) -> None:
        self._followers: dict[str, Policy] = {n: cls() for n, cls in CANDIDATES.items()}
        self._shape: tuple[int, int, int] | None = None
        self._start = 0                          # market row of the job's first tick
        self._choices: list[str] = []            # the choice at each choice point so far

    def following(self, job: JobProgress, market: MarketView) -> str:
        """The candidate followed at this tick (choice points replayed as needed)."""
        shape = job_shape(job)
        tau = max(0, round(job.elapsed_s / job.tick_s))
        if shape != self._shape:
            # a new job shape (the daemon's work estimate moved): every choice anew. The
            # start stays as first seen, so a recorded market a row short of the elapsed
            # ticks (a missed interval) does not recompute the choices each tick.
            self._shape, self._start, self._choices = shape, market.now - tau, []
        start = self._start
        grid = max(1, -(-shape[1] // POINTS_PER_DEADLINE))
        points = tau // grid + 1
        while len(self._choices) < points:
            at = start + len(self._choices) * grid
            prev = self._choices[-1] if self._choices else None
            view = market.h.view(min(max(at, 0), market.now))
            self._choices.append(choose_candidate(view, shape, prev))
        return self._choices[points - 1]

    def decide(self, job: JobProgress, market: MarketView) -> Decision:
        """The followed candidate's decision, made deadline-safe; done jobs idle."""
        if job.remaining_s <= _EPS:
            return IDLE
        name = self.following(job, market)
        return safety_net(job, self._followers[name].decide(job, market))

"""The interruption notice in the progress model: how much work a reclaim is expected to lose.

A reclaim that brings a usable notice loses little: the time since the last finished step
plus the emergency save (spotrun.torch saves the last finished step on the notice). One
without a usable notice loses the work since the last periodic save. So, per reclaim:

    loss = P(usable) x (step_s / 2 + save_s)
         + (1 - P(usable)) x min(max(interval_s, step_s) / 2, mtbf)

P(usable) starts from the provider's prior (ProviderFacts.notice_prior) and learns from the
job's own reclaimed attempts (a Beta update): see docs/cost-model.md, "Work lost per reclaim".
Pure functions of numbers; spotrun.decide.rank feeds them, history.py the job's record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

# The provider's prior counts as this many pseudo-reclaims against the job's own record: after
# five reclaims of its own the job's record weighs as much as the provider's word.
PRIOR_RECLAIMS = 5.0
# Step time when the job has neither measured speed nor `work.total_steps` with
# `work.reference_hours`: the long end of a GPU training step (most take 0.1-10 s), so an
# unknown step does not flatter the notice.
DEFAULT_STEP_S = 10.0


@dataclass(frozen=True)
class NoticePrior:
    """A provider's interruption notice: its lead time and the prior chance a reclaim has one."""

    window_s: float      # provider-clock seconds from the notice to the reclaim (0: none)
    prior: float         # P(a reclaim brings a notice the job can use), before any record
    source: str = ""     # whose prior (the provider's name)


# When the decision is made without a provider (tests, simulations, a caller that names none):
# EC2's 2-minute notice with its best-effort prior (spotrun/providers/aws/__init__.py).
GENERIC_NOTICE = NoticePrior(window_s=120.0, prior=0.9, source="generic")


def notice_prior_of(facts: Any, settings: Any) -> NoticePrior:
    """The notice prior a provider declares in its ProviderFacts (window read from settings)."""
    return NoticePrior(window_s=float(facts.notice_window_s(settings)),
                       prior=float(facts.notice_prior), source=str(facts.name))


@dataclass(frozen=True)
class ReclaimRecord:
    """One of the job's reclaimed attempts, as the state database recorded it."""

    notice_seen: bool              # the daemon recorded a notice (Attempt.notice_at)
    start_step: int                # where the attempt resumed
    reached_step: int              # the newest step it reported
    resumed_step: int | None       # where the job went on from after it (None: not known yet)
    steps_per_s: float | None = None


def notice_was_used(r: ReclaimRecord, window_s: float) -> bool:
    """Did this reclaim lose only what an honoured notice loses?

    When where the job went on from is known and the attempt had work to keep, that decides:
    the emergency save completed if the job resumed at (about) the step the attempt reached,
    a notice window's worth of steps allowed for steps reported after the last save. Otherwise
    only whether a notice came is known.
    """
    if r.resumed_step is None or r.reached_step <= r.start_step:
        return r.notice_seen
    slack = (r.steps_per_s or 0.0) * max(window_s, 0.0)
    return r.resumed_step + slack >= r.reached_step


def usable_notice_chance(prior: NoticePrior, record: Sequence[ReclaimRecord]) -> float:
    """P(a reclaim brings a usable notice): the prior's Beta updated by the job's reclaims."""
    if prior.window_s <= 0:
        return 0.0
    p = min(max(prior.prior, 0.0), 1.0)
    used = sum(1 for r in record if notice_was_used(r, prior.window_s))
    return (p * PRIOR_RECLAIMS + used) / (PRIOR_RECLAIMS + len(record))


@dataclass(frozen=True)
class ReclaimLoss:
    """Work one reclaim is expected to lose, in seconds, and the chance behind it."""

    usable: float       # P(usable notice) for this pool: 0 when the save cannot fit the window
    honoured_s: float   # lost when the notice is honoured: half a step plus the emergency save
    missed_s: float     # lost without one: half an interval, at most a mean up stretch
    detail: str = ""    # why no notice is usable here, when none is

    @property
    def expected_s(self) -> float:
        """The mix of the two by the chance of a usable notice."""
        return self.usable * self.honoured_s + (1.0 - self.usable) * self.missed_s


def reclaim_loss(*, usable: float, window_s: float, step_s: float, save_s: float,
                 interval_s: float, mtbf_h: float | None) -> ReclaimLoss:
    """Expected work lost per reclaim (seconds) with and without a usable notice.

    A notice is usable only when the step in progress and the emergency save both fit in its
    window. Without one a reclaim loses half the time between saves, which land on step
    boundaries (so that time is at least a step), and at most what an up stretch holds on average.
    """
    step_s, save_s = max(step_s, 0.0), max(save_s, 0.0)
    missed = max(interval_s, step_s, 0.0) / 2.0
    if mtbf_h is not None:
        missed = min(missed, mtbf_h * 3600.0)
    if window_s <= 0:
        detail = "the provider gives no notice"
    elif step_s + save_s > window_s:
        detail = (f"a step ({step_s:.0f} s) and the emergency save ({save_s:.0f} s) do not fit "
                  f"the {window_s:.0f} s notice")
    else:
        detail = ""
    return ReclaimLoss(usable=0.0 if detail else min(max(usable, 0.0), 1.0),
                       honoured_s=step_s / 2.0 + save_s, missed_s=missed, detail=detail)

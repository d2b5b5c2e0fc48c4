"""Where each project and owner budget stands: spent this period, committed, left.

`read_standing` reads every budget's figures set-based, in a fixed number of queries
whatever the number of jobs (per period kind in use: the ledger rows inside the period
summed by (project, owner), plus the few rows that straddle its start; then the live
attempts of the budgeted scopes and their commitments, spotrun.ledger.committed):

- spent: the ledger's rows inside the period (provider clock); a row straddling the
  period's start counts in proportion to its seconds inside (an open row lengthens for as
  long as the price holds, so one row may span days);
- committed: what the scope's live attempts will still spend before they can be stopped
  (the spend loop's notion: unbooked seconds plus the stop margin; a launch not yet made
  commits the margin);
- left: budget - spent - committed. A launch needs its own commitment to fit in it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable

from sqlalchemy import func, or_
from sqlmodel import select

from spotrun.config import ScopeBudget, scope_key
from spotrun.budgets.periods import Window, window
from spotrun.db import Attempt, Job, SpendEntry
from spotrun.ledger.committed import committed_by_attempt
from spotrun.ledger.stopmargin import StopMargin
from spotrun.states import AttemptState

Pair = tuple[str, str]     # (project, owner)
EPSILON_USD = 1e-9         # float noise: a launch that fits exactly is not over


@dataclass
class ScopeStanding:
    """One budget's figures now."""

    scope: str                  # "project" | "owner"
    name: str
    budget_usd: float
    window: Window
    spent_usd: float = 0.0
    committed_usd: float = 0.0
    running: list[str] = field(default_factory=list)   # jobs with a live attempt
    unflagged: list[str] = field(default_factory=list)  # ... not yet asked to stop

    @property
    def key(self) -> str:
        """`project:ml`."""
        return scope_key(self.scope, self.name)

    @property
    def left_usd(self) -> float:
        """Budget less spent and committed (negative: over)."""
        return self.budget_usd - self.spent_usd - self.committed_usd

    @property
    def over(self) -> bool:
        """Whether spend plus commitments pass the budget (its running jobs must stop)."""
        return self.spent_usd + self.committed_usd > self.budget_usd + EPSILON_USD

    def fits(self, need_usd: float) -> bool:
        """Whether a launch committing need_usd fits in what is left."""
        return need_usd <= self.left_usd + EPSILON_USD

    def figures(self) -> str:
        """`$12.30 spent + $1.20 committed of $2,000 this month (2030-01)`."""
        return (f"{usd(self.spent_usd)} spent + {usd(self.committed_usd)} committed of "
                f"{usd(self.budget_usd)} {self.window.phrase()}")

    def wait_reason(self, need_usd: float) -> str:
        """A waiting job's reason (its kind: spotrun.decide.waitkind, `budget`)."""
        return (f"budget {self.scope} {self.name}: {self.figures()}; a launch commits "
                f"{usd(need_usd)}, {usd(max(self.left_usd, 0.0))} left")

    def stop_reason(self) -> str:
        """Why the scope's running jobs are stopped."""
        return f"budget {self.scope} {self.name} reached: {self.figures()}"

    def to_dict(self) -> dict[str, Any]:
        """The `spotrun budgets --json` element (times on the provider clock: `_market`)."""
        return {"scope": self.scope, "name": self.name, "period": self.window.period,
                "period_key": self.window.key, "period_start_market": self.window.start,
                "period_end_market": self.window.end, "budget_usd": self.budget_usd,
                "spent_usd": self.spent_usd, "committed_usd": self.committed_usd,
                "left_usd": self.left_usd,
                "used_fraction": (self.spent_usd + self.committed_usd) / self.budget_usd,
                "running_jobs": sorted(self.running)}


def usd(v: float) -> str:
    """Dollars as a reason prints them: `$0.2500`, `$12.30`, `$2,000.00`."""
    return f"${v:,.2f}" if abs(v) >= 10 else f"${v:.4f}"


def _scoped(budgets: list[tuple[str, str, ScopeBudget]]) -> Any:
    """The SQL condition of the jobs these budgets cover."""
    projects = sorted({n for sc, n, _ in budgets if sc == "project"})
    owners = sorted({n for sc, n, _ in budgets if sc == "owner"})
    return or_(Job.project.in_(projects), Job.owner.in_(owners))


def spend_by_pair(s: Any, win: Window, scoped: Any) -> dict[Pair, float]:
    """Ledger spend inside the window, per (project, owner), in two queries."""
    pair = (Job.project, Job.owner)
    base = (select(*pair, func.sum(SpendEntry.usd)).join(Job, Job.id == SpendEntry.job_id)
            .where(scoped).group_by(*pair))
    out: dict[Pair, float] = defaultdict(float)
    if win.start is None or win.end is None:
        for project, owner, total in s.exec(base):
            out[(project, owner)] += float(total or 0.0)
        return out
    inside = base.where(SpendEntry.start >= win.start, SpendEntry.end <= win.end)
    for project, owner, total in s.exec(inside):
        out[(project, owner)] += float(total or 0.0)
    # Rows across an edge of the window: their share by seconds (start < end for these).
    across = (select(*pair, SpendEntry.start, SpendEntry.end, SpendEntry.usd)
              .join(Job, Job.id == SpendEntry.job_id)
              .where(scoped, SpendEntry.start < win.end, SpendEntry.end > win.start,
                     or_(SpendEntry.start < win.start, SpendEntry.end > win.end)))
    for project, owner, start, end, amount in s.exec(across):
        span = (end - start).total_seconds()
        inner = (min(end, win.end) - max(start, win.start)).total_seconds()
        if span > 0:
            out[(project, owner)] += amount * inner / span
    return out


def live_by_pair(s: Any, scoped: Any, now: datetime, margin_s: float
                 ) -> tuple[dict[Pair, float], dict[Pair, dict[str, bool]]]:
    """Committed USD per (project, owner), and each pair's jobs with a live attempt (job id ->
    already asked to stop), in three queries."""
    rows = list(s.exec(select(Attempt, Job.project, Job.owner, Job.budget_stop_requested)
                       .join(Job, Job.id == Attempt.job_id)
                       .where(scoped, Attempt.state != AttemptState.ENDED,
                              Attempt.ended_at.is_(None))))
    per = committed_by_attempt(s, [a for a, *_ in rows], now, margin_s)
    committed: dict[Pair, float] = defaultdict(float)
    jobs: dict[Pair, dict[str, bool]] = defaultdict(dict)
    for a, project, owner, flagged in rows:
        committed[(project, owner)] += per.get(a.id, 0.0)
        jobs[(project, owner)][a.job_id] = bool(flagged)
    return committed, jobs


def read_standing(s: Any, chosen: Iterable[tuple[str, str, ScopeBudget]], now: datetime,
                  margin: StopMargin) -> list[ScopeStanding]:
    """The standing of the chosen budgets (`BudgetsSettings.configured()`, or some of them)
    at provider time `now`; committed spend leaves the stop margin (`margin.seconds`)."""
    chosen = list(chosen)
    if not chosen:
        return []
    scoped = _scoped(chosen)
    committed, live = live_by_pair(s, scoped, now, margin.seconds(s))
    windows = {b.period: window(b.period, now) for _, _, b in chosen}
    spent = {p: spend_by_pair(s, w, scoped) for p, w in windows.items()}
    out = []
    for scope, name, b in chosen:
        st = ScopeStanding(scope, name, b.usd, windows[b.period])
        index = 0 if scope == "project" else 1
        for pair, amount in spent[b.period].items():
            if pair[index] == name:
                st.spent_usd += amount
        for pair, amount in committed.items():
            if pair[index] == name:
                st.committed_usd += amount
        for pair, jobs in live.items():
            if pair[index] == name:
                st.running += [j for j in jobs if j not in st.running]
                st.unflagged += [j for j, flagged in jobs.items()
                                 if not flagged and j not in st.unflagged]
        out.append(st)
    return out

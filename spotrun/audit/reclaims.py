"""The truth about each reclaim, from the agents' own reports: the steps the next attempt
computes again, the time it took to train again (by part), and what the notice achieved.

One function (`attempt_truths`) serves `status --json`, the audit, the dashboard and the
demo, so they cannot disagree. The rules (docs/audit.md, "Reclaims"):

- An attempt's last step is the highest step the job reported in it: its exit report's
  `step`, its last heartbeat's, the emergency checkpoint its notice saved, and what the
  daemon recorded (heartbeats it read, a checkpoint the attempt wrote). It is unknown (None)
  when no report named a step past the attempt's start and no heartbeat or exit report
  named any step: never taken as 0.
- Lost steps = last step − the step the work resumed from after it (the next attempt that
  ran: its real start; none yet: the job's checkpointed step; the job completed in it: 0).
- Time to resume, on the attempt that resumed after a reclaim, in provider-clock seconds
  (agent and daemon wall times are converted with the market's own clock, `ToMarket`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Sequence

from spotrun.reports import ExitReport, Heartbeat, Notice
from spotrun.states import EndReason, JobState

# The parts of a resume, in order; their sum is total_s when every part is known.
PARTS = ("detection_s", "waiting_s", "launch_s", "boot_s", "restore_s", "first_step_s")
RECLAIMED_EVENT = "attempt_reclaimed"   # the reconcile loop's record of a reclaim it saw
ToMarket = Callable[[datetime], "datetime | None"]   # a wall time on the provider's clock


@dataclass(frozen=True)
class AttemptReports:
    """What one attempt's agent last wrote to the store (None: not there or unreadable)."""

    heartbeat: Heartbeat | None = None
    exit: ExitReport | None = None
    notice: Notice | None = None

    def reported_step(self) -> int | None:
        """The highest step the last heartbeat or the exit report names; None if neither does."""
        steps = [r.step for r in (self.heartbeat, self.exit) if r is not None and r.step is not None]
        return max(steps) if steps else None

    def emergency_step(self) -> int | None:
        """The step of the checkpoint the notice made the job write (the job reached it)."""
        return self.notice.emergency_checkpoint_step if self.notice is not None else None

    def notice_outcome(self) -> str | None:
        """The notice's outcome as the agent wrote it (None: no notice, or an older agent)."""
        return self.notice.outcome if self.notice is not None else None


NO_REPORTS = AttemptReports()
ReportsOf = Callable[[Any, Any], AttemptReports]   # (job, attempt) -> its reports


@dataclass
class AttemptTruth:
    """One attempt's reclaim figures (see the module docstring)."""

    last_step: int | None = None          # highest step finished in it; None = unknown
    resume_step: int | None = None        # the step the work went on from after it
    lost_steps: int | None = None         # None: still running, or its last step unknown
    time_to_resume: dict[str, Any] | None = None   # on the attempt that resumed
    notice_outcome: str | None = None
    trained_until: datetime | None = None  # provider clock: when its command ended, if known
    resumed_by: Any = None                 # the next attempt that ran


def last_step_of(att: Any, reps: AttemptReports) -> int | None:
    """The highest step the attempt is known to have finished; None when nothing said."""
    reported = reps.reported_step()
    best = max(att.last_step, -1 if reported is None else reported, reps.emergency_step() or -1)
    # A report from before the restore (the library's first write says step 0) says nothing.
    known = (reported is not None and reported >= att.start_step) or best > att.start_step
    return best if known else None


def attempt_truths(job: Any, attempts: Sequence[Any], reports_of: ReportsOf | None, *,
                   reclaimed_at: dict[int, datetime] | None = None,
                   to_market: ToMarket | None = None,
                   checkpointed: int | None = None) -> dict[int, AttemptTruth]:
    """Every attempt's truth by attempt id (attempts in launch order; checkpointed: the job's
    verified checkpoint step where known, else its recorded `last_step`)."""
    out: dict[int, AttemptTruth] = {}
    ran = [a for a in attempts if a.started_at is not None]
    reps = {a.id: reports_of(job, a) if reports_of is not None else NO_REPORTS for a in ran}
    for i, a in enumerate(ran):
        r = reps[a.id]
        t = AttemptTruth(last_step=last_step_of(a, r), notice_outcome=r.notice_outcome())
        t.resumed_by = ran[i + 1] if i + 1 < len(ran) else None
        if t.resumed_by is not None:
            t.resume_step = t.resumed_by.start_step
        elif job.state is JobState.SUCCEEDED or a.end_reason is EndReason.COMPLETED:
            t.resume_step = None   # the job's work ended in it: nothing to compute again
        else:
            t.resume_step = checkpointed if checkpointed is not None else job.last_step
        if a.ended_at is not None and t.last_step is not None:
            t.lost_steps = max(t.last_step - t.resume_step, 0) if t.resume_step is not None \
                else 0
        t.trained_until = _trained_until(a, r, to_market)
        if i > 0 and ran[i - 1].end_reason is EndReason.RECLAIMED:
            prev = ran[i - 1]
            t.time_to_resume = time_to_resume(prev, a, r, (reclaimed_at or {}).get(prev.id),
                                              to_market)
        out[a.id] = t
    return out


def _trained_until(att: Any, reps: AttemptReports, to_market: ToMarket | None
                   ) -> datetime | None:
    """When the attempt's command ended, on the provider's clock: its exit report's time (the
    agent wrote it after the command ended); None without one (a reclaim kills the agent)."""
    if reps.exit is None or to_market is None:
        return None
    wall = parse_iso(reps.exit.ts)
    return to_market(wall) if wall is not None else None


def time_to_resume(prev: Any, att: Any, reps: AttemptReports, known_at_wall: datetime | None,
                   to_market: ToMarket | None) -> dict[str, Any]:
    """From prev's reclaim to att's first new step, by part, in provider-clock seconds.

    reclaim (prev.ended_at, provider) -> the daemon knows (its `attempt_reclaimed` event,
    wall) -> launch request (att.created_at, wall) -> instance launched (att.started_at,
    provider) -> agent started -> restored -> first new step (agent wall times). A part is
    None when one of its ends is unknown (an older agent, a market clock that cannot be read).
    """
    beat = reps.heartbeat

    def market(wall: datetime | None) -> datetime | None:
        return to_market(wall) if wall is not None and to_market is not None else None

    def agent(text: str | None) -> datetime | None:
        return market(parse_iso(text)) if beat is not None else None

    first = agent(beat.first_step_at if beat else None)
    marks = [prev.ended_at, market(known_at_wall), market(att.created_at), att.started_at,
             agent(beat.restore_started_at if beat else None),
             agent(beat.restore_done_at if beat else None), first]
    out: dict[str, Any] = {p: _between(marks[k], marks[k + 1]) for k, p in enumerate(PARTS)}
    # An older agent reports no first step: the daemon's first read of one is a later bound.
    out["total_s"] = _between(prev.ended_at, first or att.running_at)
    out["first_step_from"] = "agent" if first is not None else \
        "daemon" if att.running_at is not None else None
    out["from_attempt"] = prev.number
    return out


def _between(a: datetime | None, b: datetime | None) -> float | None:
    return round((b - a).total_seconds(), 3) if a is not None and b is not None else None


def parse_iso(text: str | None) -> datetime | None:
    """An agent's ISO-8601 time as an aware UTC datetime; None if absent or unreadable."""
    if not text:
        return None
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def reclaim_times(events: Sequence[Any]) -> dict[int, datetime]:
    """Attempt id -> the wall time the daemon recorded its reclaim (the first such event)."""
    out: dict[int, datetime] = {}
    for e in events:
        if e.kind == RECLAIMED_EVENT and e.attempt_id is not None:
            out.setdefault(e.attempt_id, e.ts)
    return out


def quantile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (0..1) of values, linear between the closest ranks; None if empty."""
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class ResumeStats:
    """Time-to-resume samples by part over many reclaims (for /metrics' p50 and p95)."""

    samples: dict[str, list[float]] = field(default_factory=dict)

    def add(self, ttr: dict[str, Any] | None) -> None:
        """One reclaim's parts (the known ones)."""
        for part in PARTS + ("total_s",):
            v = (ttr or {}).get(part)
            if isinstance(v, (int, float)):
                self.samples.setdefault(part, []).append(float(v))

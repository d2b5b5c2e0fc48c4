"""Failed checkpoint saves, made visible: an event each, a warning for status and audit.

The training library counts saves whose every try failed and reports the count and
the last error in its progress file; the agent copies them into its heartbeat (and
its final one); the daemon turns each new failure into a `checkpoint_save_failed`
event and keeps the count on the attempt, which `status` and `audit` show.
"""

from __future__ import annotations

from typing import Any, Iterable

from spotrun.db import Attempt, add_event
from spotrun.reports import Heartbeat

EVENT = "checkpoint_save_failed"


def record_save_failures(s: Any, att: Attempt, beat: Heartbeat | None) -> int:
    """Add an event per save failure the heartbeat reports beyond those recorded; caller commits."""
    count = beat.checkpoint_failures if beat is not None else None
    if count is None or count <= att.checkpoint_failures:
        return 0
    step = beat.checkpoint_error_step
    error = (beat.checkpoint_error or "unknown error")[:300]
    new = count - att.checkpoint_failures
    for n in range(att.checkpoint_failures + 1, count + 1):
        add_event(s, att.job_id, EVENT, f"attempt {att.number}: checkpoint save failed "
                  f"({n} so far; last: step {step}: {error})", attempt_id=att.id)
    att.checkpoint_failures = count
    att.checkpoint_error = f"step {step}: {error}"
    s.add(att)
    return new


def save_warnings(attempts: Iterable[Any]) -> list[str]:
    """One warning line per attempt whose checkpoint saves failed (rows or status dicts)."""
    out = []
    for a in attempts:
        get = a.get if isinstance(a, dict) else lambda k, a=a: getattr(a, k, None)
        count = get("checkpoint_failures") or 0
        if count:
            out.append(f"attempt {get('number')}: {count} checkpoint save(s) failed "
                       f"(last: {get('checkpoint_error')}); a reclaim loses the steps since "
                       "the last good checkpoint")
    return out

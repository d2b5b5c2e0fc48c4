"""One writer of a job's progress, and the rule for it.

`Job.last_step` is the step the job's work is known to survive at: the newest verified
checkpoint (what a new attempt resumes from), or the final step of a completed attempt.
`Attempt.start_step` is where an attempt really resumed (the agent reports the checkpoint it
handed to the job); `Attempt.last_step` the highest step the job reported reaching or saved
in it (a save on the notice or at the last moment may come after the last report), so the
next attempt never resumes above the step its predecessor "ran to". Status, the audit and
the policy read these fields; only the functions below write them.
"""

from __future__ import annotations

from typing import Any


def job_reached(job: Any, step: int | None) -> bool:
    """A verified checkpoint (or a completed run) at `step`: the job's progress never drops."""
    if not isinstance(step, int) or step <= job.last_step:
        return False
    job.last_step = step
    return True


def job_resumes_from(job: Any, step: int) -> None:
    """A new attempt starts from the newest checkpoint that verifies now.

    The one place the job's step may go back: a checkpoint found corrupt since it was
    counted no longer holds that progress.
    """
    job.last_step = step


def attempt_reported(attempt: Any, step: int | None) -> bool:
    """The job reported `step` in this attempt (heartbeat or exit report)."""
    if not isinstance(step, int) or step <= attempt.last_step:
        return False
    attempt.last_step = step
    return True


def attempt_saved(attempt: Any, step: int | None) -> bool:
    """A checkpoint at `step`, newer than the attempt's start, was written by this attempt:
    the job reached that step in it, whatever its last report said."""
    if not isinstance(step, int) or step <= attempt.start_step:
        return False
    return attempt_reported(attempt, step)


def attempt_resumed_from(attempt: Any, step: int | None) -> bool:
    """The agent says which checkpoint it handed to the job: that is the attempt's start."""
    if not isinstance(step, int) or step < 0 or step == attempt.start_step:
        return False
    attempt.start_step = step
    attempt.last_step = max(attempt.last_step, step)
    return True

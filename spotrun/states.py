"""State enums. Values are the lower-case strings users see in `status --json`."""

from __future__ import annotations

from enum import Enum
from typing import Any


class JobState(str, Enum):
    """Lifecycle of a job, across all of its attempts."""

    QUEUED = "queued"            # waiting for the scheduler (first launch)
    STARTING = "starting"        # an attempt is launching
    RUNNING = "running"          # an attempt's instance runs the command
    RECOVERING = "recovering"    # lost an instance (reclaim, error); relaunch pending
    CANCELLING = "cancelling"    # cancel asked; instances being terminated
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    BUDGET_EXHAUSTED = "budget_exhausted"

    def is_terminal(self) -> bool:
        """True when the job will never run again without a user action."""
        return self in _TERMINAL_JOB

    def is_active(self) -> bool:
        """True while the daemon must look after the job."""
        return not self.is_terminal()


_TERMINAL_JOB = {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.BUDGET_EXHAUSTED}


class AttemptState(str, Enum):
    """Lifecycle of one attempt: one launch of the job on one instance."""

    LAUNCHING = "launching"      # intent recorded; launch call may be in flight
    RUNNING = "running"          # the provider reports the instance alive
    TERMINATING = "terminating"  # we asked the provider to terminate it
    ENDED = "ended"

    def is_terminal(self) -> bool:
        """True once the attempt's instance is gone and its end is booked."""
        return self is AttemptState.ENDED


class NodeState(str, Enum):
    """Lifecycle of one node of a multi-node attempt: one instance for one rank."""

    LAUNCHING = "launching"      # intent recorded (client token); launch may be in flight
    RUNNING = "running"          # the provider reports the instance alive
    TERMINATING = "terminating"  # we asked the provider to terminate it
    ENDED = "ended"              # the instance is gone (its end_reason says why)

    def is_terminal(self) -> bool:
        """True once the node's instance is gone."""
        return self is NodeState.ENDED


class EndReason(str, Enum):
    """Why an attempt ended."""

    COMPLETED = "completed"
    RECLAIMED = "reclaimed"
    CANCELLED = "cancelled"
    ERROR = "error"
    LAUNCH_FAILED = "launch_failed"
    LOST = "lost"                  # no heartbeat / vanished without a reason
    BUDGET = "budget"
    DEADMAN = "deadman"            # agent shut down because the daemon went silent
    MOVED = "moved"                # the placement policy moved the job (another pool,
    #                                on-demand, or waiting)


class Market(str, Enum):
    """Where an instance is bought."""

    SPOT = "spot"
    ON_DEMAND = "on-demand"


class MarketPolicy(str, Enum):
    """What the job allows: spot only, on-demand only, or either."""

    SPOT = "spot"
    ON_DEMAND = "on-demand"
    AUTO = "auto"


class InstanceState(str, Enum):
    """Provider-side instance state, normalised across providers."""

    PENDING = "pending"
    RUNNING = "running"
    SHUTTING_DOWN = "shutting-down"
    TERMINATED = "terminated"

    def is_terminal(self) -> bool:
        """True when the instance no longer exists (and no longer bills)."""
        return self is InstanceState.TERMINATED


class TerminationCause(str, Enum):
    """Why a provider says an instance terminated."""

    SPOT_RECLAIM = "spot-reclaim"                 # AWS: Server.SpotInstanceTermination
    USER = "user"                                 # we terminated it
    INSTANCE_SHUTDOWN = "instance-shutdown"       # the agent shut it down (job ended)
    UNKNOWN = "unknown"


# ---------------------------------------------------------------- transitions
# The one table of who may follow whom. Every state change goes through move_job /
# move_attempt, so a succeeded job can never be sent back to run (no row leaves SUCCEEDED).

_J = JobState
JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    _J.QUEUED: frozenset({_J.STARTING, _J.CANCELLING, _J.CANCELLED, _J.BUDGET_EXHAUSTED,
                          _J.FAILED}),
    _J.STARTING: frozenset({_J.RUNNING, _J.QUEUED, _J.RECOVERING, _J.CANCELLING, _J.SUCCEEDED,
                            _J.FAILED, _J.BUDGET_EXHAUSTED}),
    _J.RUNNING: frozenset({_J.STARTING, _J.RECOVERING, _J.CANCELLING, _J.SUCCEEDED, _J.FAILED,
                           _J.BUDGET_EXHAUSTED}),
    _J.RECOVERING: frozenset({_J.STARTING, _J.RUNNING, _J.CANCELLING, _J.CANCELLED,
                              _J.SUCCEEDED, _J.FAILED, _J.BUDGET_EXHAUSTED}),
    _J.CANCELLING: frozenset({_J.CANCELLED}),
    _J.SUCCEEDED: frozenset(),
    _J.CANCELLED: frozenset(),
    # A user's `spotrun resume` (more budget, or after fixing a failure) requeues these.
    _J.FAILED: frozenset({_J.RECOVERING}),
    _J.BUDGET_EXHAUSTED: frozenset({_J.RECOVERING}),
}

_A = AttemptState
ATTEMPT_TRANSITIONS: dict[AttemptState, frozenset[AttemptState]] = {
    _A.LAUNCHING: frozenset({_A.RUNNING, _A.TERMINATING, _A.ENDED}),
    _A.RUNNING: frozenset({_A.TERMINATING, _A.ENDED}),
    _A.TERMINATING: frozenset({_A.ENDED}),
    _A.ENDED: frozenset(),
}


_N = NodeState
NODE_TRANSITIONS: dict[NodeState, frozenset[NodeState]] = {
    _N.LAUNCHING: frozenset({_N.RUNNING, _N.TERMINATING, _N.ENDED}),
    _N.RUNNING: frozenset({_N.TERMINATING, _N.ENDED}),
    _N.TERMINATING: frozenset({_N.ENDED}),
    _N.ENDED: frozenset(),
}


class TransitionError(Exception):
    """A state change the table forbids (a bug in the caller, never user input)."""


def check_transition(table: dict, current: Enum, to: Enum) -> bool:
    """True when current -> to is a change the table allows; False when it is no change."""
    if current is to:
        return False
    if to not in table[current]:
        raise TransitionError(f"{type(current).__name__} {current.value} -> {to.value} "
                              f"is not allowed")
    return True


def move_job(job: Any, to: JobState) -> bool:
    """Set job.state to `to` if the table allows it; True when it changed."""
    changed = check_transition(JOB_TRANSITIONS, job.state, to)
    if changed:
        job.state = to
    return changed


def move_attempt(attempt: Any, to: AttemptState) -> bool:
    """Set attempt.state to `to` if the table allows it; True when it changed."""
    changed = check_transition(ATTEMPT_TRANSITIONS, attempt.state, to)
    if changed:
        attempt.state = to
    return changed


def move_node(node: Any, to: NodeState) -> bool:
    """Set node.state to `to` if the table allows it; True when it changed."""
    changed = check_transition(NODE_TRANSITIONS, node.state, to)
    if changed:
        node.state = to
    return changed

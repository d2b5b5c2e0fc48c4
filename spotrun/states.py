"""State enums. Values are the lower-case strings users see in `status --json`."""

from __future__ import annotations

from enum import Enum


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

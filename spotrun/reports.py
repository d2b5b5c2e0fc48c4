"""What an agent reports through the store, declared once: the agent writes these, the daemon,
the dashboard and alerts read them back.

Readers are lenient on purpose: a field of the wrong type (an older or newer agent, a job's
own progress file) reads as absent, and an unreadable report is None, never a crash.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Annotated, Any, TypeVar

from pydantic import ConfigDict, Strict, ValidationError

from spotrun.contracts import Lenient, adapter
from spotrun.errors import StoreError

_READ = ConfigDict(extra="ignore")
Int = Annotated[Annotated[int, Strict()] | None, Lenient]
Num = Annotated[Annotated[float, Strict()] | None, Lenient]
Text = Annotated[Annotated[str, Strict()] | None, Lenient]
R = TypeVar("R")


@dataclass(frozen=True)
class Heartbeat:
    """heartbeat.json: the attempt's latest progress, rewritten every heartbeat interval."""

    __pydantic_config__ = _READ

    ts: Text = None                    # agent wall time, ISO-8601
    attempt: Int = None
    phase: Text = None                 # setup, restore, running, stopping, ...
    step: Int = None
    total_steps: Int = None
    steps_per_s: Num = None
    last_checkpoint_step: Int = None
    checkpoint_save_s: Num = None      # the blocking part of the last save, seconds
    checkpoint_failures: Int = None    # saves whose every try failed, so far
    checkpoint_error_step: Int = None
    checkpoint_error: Text = None
    notice: Annotated[Annotated[bool, Strict()] | None, Lenient] = None
    rebalance: Text = None
    resumed_from: Int = None           # the checkpoint step this attempt really restored
    instance_id: Text = None           # multi-node only: the node that wrote it
    node_rank: Int = None
    command_restarts: Int = None       # multi-node only: restarts after a rendezvous move
    # The attempt's way back to training, agent wall times (ISO-8601), each set once: the
    # agent started (setup and restore begin), the progress file first showed the restored
    # step, then a step past it. The daemon's views turn them into time to resume.
    restore_started_at: Text = None
    restore_done_at: Text = None
    first_step_at: Text = None


@dataclass(frozen=True)
class Notice:
    """notice.json: the interruption notice the agent saw, and the emergency save it caused."""

    __pydantic_config__ = _READ

    ts: Text = None
    action: Text = None                # "terminate", "stop", ...
    time: Text = None                  # when the provider takes the instance
    signalled_at: Text = None          # when the job got SIGUSR1; None = not signalled
    emergency_checkpoint_step: Int = None
    emergency_save_s: Num = None
    # What became of the notice, true when written: "emergency checkpoint at step N in T s"
    # or "no emergency checkpoint: <why>" (the job's library says why; else the agent does).
    outcome: Text = None


@dataclass(frozen=True)
class ExitReport:
    """exit.json: how the attempt ended, written last."""

    __pydantic_config__ = _READ

    ts: Text = None
    exit_code: Int = None
    reason: Text = None                # completed, error, interrupted, cancelled, ...
    step: Int = None
    message: Text = None
    instance_id: Text = None           # multi-node only: the node that wrote it
    node_rank: Int = None
    command_restarts: Int = None
    log_tail: Text = None              # a failed command's last output lines (redacted)


NODE_ONLY = ("instance_id", "node_rank", "command_restarts")
# Keys written only when they say something, so the agent's usual reports keep their old keys.
# Heartbeat: the way back to training, written once known (an attempt that never restores
# writes the heartbeat it always wrote); notice.json: the notice's outcome, once there is one.
OPTIONAL = NODE_ONLY + ("log_tail", "restore_started_at", "restore_done_at", "first_step_at",
                        "outcome")


def dump(report: Any) -> dict[str, Any]:
    """The JSON-able body of a report (a single-node agent's keys are as they always were)."""
    body = asdict(report)
    for key in OPTIONAL:
        if body.get(key, 0) is None:
            del body[key]
    return body


def parse_report(raw: bytes, cls: type[R]) -> R | None:
    """A report from its JSON bytes; None if they are not a JSON object."""
    try:
        return adapter(cls).validate_json(raw)
    except ValidationError:
        return None


def read_report(store: Any, key: str, cls: type[R]) -> R | None:
    """The report at `key`; None if it is missing, unreadable or not a JSON object."""
    try:
        return parse_report(store.get_bytes(key), cls)
    except StoreError:
        return None

"""Where things live in the daemon's object store (one prefix per job).

The agent and the daemon talk only through these objects, so an instance's
reports outlive it and the daemon can crash without losing them.
"""

from __future__ import annotations

DAEMON_ALIVE = "daemon/alive.json"


def job_prefix(job_id: str) -> str:
    """Everything of one job lives under this prefix."""
    return f"jobs/{job_id}"


def bundle_key(job_id: str) -> str:
    """The job's code bundle (tar.gz of workdir)."""
    return f"jobs/{job_id}/bundle.tar.gz"


def control_key(job_id: str) -> str:
    """Daemon -> agent requests, e.g. {"cancel": true}."""
    return f"jobs/{job_id}/control.json"


def attempt_prefix(job_id: str, attempt: int) -> str:
    """One attempt's reports."""
    return f"jobs/{job_id}/attempts/{attempt:04d}"


def heartbeat_key(job_id: str, attempt: int) -> str:
    """Agent -> daemon: liveness and progress, rewritten every beat."""
    return f"{attempt_prefix(job_id, attempt)}/heartbeat.json"


def exit_key(job_id: str, attempt: int) -> str:
    """Agent -> daemon: how the command ended."""
    return f"{attempt_prefix(job_id, attempt)}/exit.json"


def notice_key(job_id: str, attempt: int) -> str:
    """Agent -> daemon: the interruption notice it saw, and the emergency save."""
    return f"{attempt_prefix(job_id, attempt)}/notice.json"


def log_prefix(job_id: str, attempt: int) -> str:
    """Log segments of one attempt, `<seq:06d>.log` each, in order."""
    return f"jobs/{job_id}/logs/{attempt:04d}"


def default_checkpoint_prefix(job_id: str) -> str:
    """Checkpoints when the spec names no checkpoint.uri."""
    return f"jobs/{job_id}/checkpoints"


def outputs_prefix(job_id: str) -> str:
    """The job's outputs (spec `outputs`), `<relative path>` under it; the newest upload wins."""
    return f"jobs/{job_id}/outputs"


def outputs_index_key(job_id: str) -> str:
    """Agent -> `spotrun pull`: {"attempt", "ts", "reason", "files": {path: {"size", "sha256"}}}."""
    return f"jobs/{job_id}/outputs.json"


# ---------------------------------------------------------------- multi-node (MULTINODE.md)

def nodes_key(job_id: str, attempt: int) -> str:
    """Daemon -> agents: the membership of a multi-node attempt (ranks, endpoint), rewritten
    on every change with a higher version."""
    return f"{attempt_prefix(job_id, attempt)}/nodes.json"


def node_prefix(job_id: str, attempt: int, instance_id: str) -> str:
    """One node's reports within a multi-node attempt (one writer: that node's agent)."""
    return f"{attempt_prefix(job_id, attempt)}/nodes/{instance_id}"


def node_heartbeat_key(job_id: str, attempt: int, instance_id: str) -> str:
    """Agent -> daemon: one node's liveness and progress."""
    return f"{node_prefix(job_id, attempt, instance_id)}/heartbeat.json"


def node_exit_key(job_id: str, attempt: int, instance_id: str) -> str:
    """Agent -> daemon: how one node's command ended."""
    return f"{node_prefix(job_id, attempt, instance_id)}/exit.json"


def node_notice_key(job_id: str, attempt: int, instance_id: str) -> str:
    """Agent -> daemon: the interruption notice one node saw."""
    return f"{node_prefix(job_id, attempt, instance_id)}/notice.json"


def node_log_prefix(job_id: str, attempt: int, instance_id: str) -> str:
    """Log segments of one node of a multi-node attempt."""
    return f"{log_prefix(job_id, attempt)}/{instance_id}"

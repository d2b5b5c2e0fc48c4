"""The agent's configuration: what the daemon puts in an instance's user data."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import ConfigDict

from spotrun.contracts import validate
from spotrun.errors import ConfigError


@dataclass(frozen=True)
class AgentConfig:
    """Everything an agent needs to run one attempt. Secrets travel as references only."""

    __pydantic_config__ = ConfigDict(extra="forbid")   # a daemon/agent version skew shows

    job_id: str
    attempt: int                      # attempt number (1, 2, ...)
    store_uri: str                    # daemon store: bundle, logs, heartbeats, control
    checkpoint_uri: str               # full URI of the job's checkpoint prefix
    command: str
    env: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)   # NAME -> env:/ssm:/secretsmanager:
    bundle_key: str | None = None
    gpus: int = 1
    nodes: int = 1                    # nodes the attempt runs on (multi-node: see nodes.json)
    nodes_min: int | None = None      # elastic "MIN-MAX": MIN, the fewest it keeps running on
    total_steps: int | None = None
    checkpoint_interval_s: float | None = None   # wall seconds; None = the library's default
    checkpoint_keep: int = 3
    imds_endpoint: str = "http://169.254.169.254"   # the instance's metadata service
    # Whose instance side the agent talks to (a provider name whose facts declare
    # instance_metadata, set through its agent_extras); "": IMDSv2 at imds_endpoint.
    instance_side: str = ""
    time_scale: float = 1.0           # market seconds per wall second (local provider)
    # A paced local market (docs/local-provider.md): the agent reports when the job trains,
    # and notices run at notice_time_scale market seconds per wall second.
    report_phases: bool = False
    notice_time_scale: float | None = None
    heartbeat_interval_s: float = 2.0
    notice_poll_interval_s: float = 5.0   # market seconds; the agent divides by time_scale
    log_flush_interval_s: float = 2.0
    deadman_timeout_s: float = 1800.0     # wall seconds of daemon silence before shutdown
    region: str = "us-east-1"
    shutdown_command: str | None = None   # run after exit.json, e.g. "sudo shutdown -h now"
    imds_token_ttl_s: int = 21600         # IMDSv2 session token lifetime asked for
    control_poll_interval_s: float = 2.0  # wall seconds between control.json / alive.json reads
    stop_grace_s: float = 10.0            # wall seconds between SIGTERM and SIGKILL of the job
    outputs: list[str] = field(default_factory=list)   # spec `outputs`: paths/globs in the job dir
    persist: list[str] = field(default_factory=list)   # spec `persist`: saved with checkpoints
    # The job's directory, the same on every attempt (the provider's; "{job_id}" and
    # "{node_rank}" filled in by the agent); None: <agent dir>/job.
    job_dir: str | None = None

    def to_json(self) -> str:
        """Serialise for user data."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "AgentConfig":
        """Parse user data written by to_json."""
        try:
            raw: dict[str, Any] = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"agent config is not JSON: {exc}", field="user_data") from None
        return validate(cls, raw, ConfigError, prefix="user_data.")

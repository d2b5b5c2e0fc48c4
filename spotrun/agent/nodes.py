"""Multi-node attempts (issue 16): the membership the daemon writes, and the job's view of it.

The daemon alone writes `nodes.json` (layout.nodes_key); every node's agent reads
it, finds its own instance id there, takes that entry's rank, and gives the
command the torchrun inputs as SPOTRUN_* variables. The same user data serves all
N instances (one EC2 Fleet), so nothing node-specific is in the AgentConfig.

Being listed is also the node's fence: the claim.json of single-node attempts
would let only one of N instances run, so a multi-node agent runs while its
instance id is listed and stops once the daemon removes it.

torchrun starts its workers in sessions of their own, so stopping the command's
process group is not enough to stop a node's training: every process the agent
starts carries a marker variable, and a stop signals all processes that carry it.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from spotrun.agent.config import AgentConfig
from spotrun.pids import signal_pids

MARKER_ENV = "SPOTRUN_AGENT_CHILD"   # unique per command start: finds its processes
RDZV_WAIT_MIN_S = 30.0               # a failed node waits this long for the daemon's rewrite
RDZV_WAIT_BEATS = 5
RDZV_WAIT_ENV = "SPOTRUN_RDZV_CHANGE_WAIT_S"   # the agent's own env (tests): seconds


@dataclass(frozen=True)
class Membership:
    """One version of nodes.json."""

    version: int
    nnodes: int
    nnodes_min: int
    rdzv_id: str
    rdzv_endpoint: str
    rdzv_host_rank: int
    ranks: dict[str, int]   # instance id -> rank

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | None) -> "Membership | None":
        """The membership in a nodes.json object; None when absent or malformed."""
        if not raw:
            return None
        try:
            ranks = {str(n["instance_id"]): int(n["rank"]) for n in raw.get("nodes") or []}
            nnodes = int(raw["nnodes"])
            return cls(version=int(raw.get("version", 0)), nnodes=nnodes,
                       nnodes_min=int(raw.get("nnodes_min") or nnodes),
                       rdzv_id=str(raw["rdzv_id"]), rdzv_endpoint=str(raw["rdzv_endpoint"]),
                       rdzv_host_rank=int(raw.get("rdzv_host_rank", 0)), ranks=ranks)
        except (KeyError, TypeError, ValueError):
            return None

    def rank_of(self, instance_id: str) -> int | None:
        """This instance's rank, or None while (or once) it is not listed."""
        return self.ranks.get(instance_id)

    def nnodes_text(self) -> str:
        """torchrun's --nnodes: "N", or "MIN:MAX" for an elastic job."""
        return str(self.nnodes) if self.nnodes_min >= self.nnodes else \
            f"{self.nnodes_min}:{self.nnodes}"

    def launch_key(self, instance_id: str) -> tuple[str, bool, str]:
        """What the command was started with: a change of it needs a restart of the command."""
        return (self.rdzv_endpoint, self.rank_of(instance_id) == self.rdzv_host_rank,
                self.nnodes_text())


def is_multi_node(config: AgentConfig) -> bool:
    """True for an attempt spanning nodes (or an elastic range): nodes.json drives it."""
    return config.nodes > 1 or config.nodes_min is not None


def rdzv_change_wait_s(config: AgentConfig, environ: Mapping[str, str] | None = None) -> float:
    """How long a non-zero exit waits for a rewrite of nodes.json before it counts as a failure."""
    raw = (environ or {}).get(RDZV_WAIT_ENV)
    try:
        if raw and float(raw) > 0:
            return float(raw)
    except ValueError:
        pass
    return max(RDZV_WAIT_MIN_S, RDZV_WAIT_BEATS * config.heartbeat_interval_s)


def _with_is_host(conf: str, is_host: bool) -> str:
    """The user's rendezvous config plus is_host, unless it names is_host itself."""
    parts = [p for p in conf.split(",") if p.strip()]
    if any(p.split("=", 1)[0].strip() == "is_host" for p in parts):
        return conf
    return ",".join([*parts, f"is_host={1 if is_host else 0}"])


def node_env(membership: Membership, instance_id: str, user_env: Mapping[str, str]
             ) -> dict[str, str]:
    """The variables a node's command gets on top of the single-node ones.

    torchrun reads PET_<OPTION> for an option missing from its command line
    (torch/distributed/argparse_util.py), so the defaults below apply unless the
    command line or the job's env says otherwise; is_host decides which node
    serves the c10d store (on 127.0.0.1 every node would claim it otherwise).
    """
    rank = membership.rank_of(instance_id)
    assert rank is not None
    env = {
        "SPOTRUN_NNODES": membership.nnodes_text(),
        "SPOTRUN_NODE_RANK": str(rank),
        "SPOTRUN_RDZV_ENDPOINT": membership.rdzv_endpoint,
        "SPOTRUN_RDZV_ID": membership.rdzv_id,
        "SPOTRUN_INSTANCE_ID": instance_id,
        # For a command line that passes --rdzv-conf itself (then PET_RDZV_CONF is not read).
        "SPOTRUN_RDZV_IS_HOST": "1" if rank == membership.rdzv_host_rank else "0",
        # A survivor that stays rank 0 must publish a fresh MASTER_ADDR/PORT for the new round.
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": user_env.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
                                                           "1"),
        "PET_MAX_RESTARTS": user_env.get("PET_MAX_RESTARTS", "100"),
        "PET_RDZV_CONF": _with_is_host(user_env.get("PET_RDZV_CONF", ""),
                                       rank == membership.rdzv_host_rank),
        # Each start resumes from the newest verified checkpoint, agreed by rank 0 (a
        # torchrun restart re-runs the script with the env of the first start).
        "SPOTRUN_RESUME_CHECKPOINT": "",
    }
    return env


def new_marker() -> str:
    """A fresh value for MARKER_ENV (one per start of the command)."""
    return uuid.uuid4().hex


def marked_pids(marker: str) -> set[int]:
    """Every live process whose environment carries MARKER_ENV=marker."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found: set[int] = set()
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            if needle in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                found.add(int(entry))
        except OSError:
            continue   # gone, or not ours to read
    return found


def signal_marked(marker: str | None, sig: int) -> int:
    """Send sig to every process carrying the marker; returns how many were signalled."""
    if not marker or not os.path.isdir("/proc"):
        return 0
    return signal_pids(marked_pids(marker), sig)


def any_marked(marker: str | None) -> bool:
    """True while a process carrying the marker lives (zombies excluded)."""
    if not marker or not os.path.isdir("/proc"):
        return False
    for pid in marked_pids(marker):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            return True
    return False

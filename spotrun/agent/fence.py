"""Fencing: one instance, and only one, acts as a given attempt of a job.

The daemon's database names the attempt, but a database that lost its WAL can forget
an attempt and launch the same number again on a second instance; both would then
write the same heartbeat, exit report, log segments and checkpoints. So, before its
first write, the agent claims the attempt in the store with a conditional put
(`claim.json`, holding its instance id). The instance that holds the claim runs; any
other leaves a `fenced-<instance>.json` note, writes nothing else and shuts down.
The claim is read again at every control poll, so a holder that lost it stops.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any, Mapping

import structlog
from tenacity import Retrying, stop_after_attempt, wait_exponential

from spotrun import layout
from spotrun.agent.storeio import Reporter
from spotrun.errors import ObjectNotFound, SpotrunError
from spotrun.store.base import ObjectStore

log = structlog.get_logger("spotrun.agent")

INSTANCE_ENV = "SPOTRUN_INSTANCE_ID"


def claim_key(job_id: str, attempt: int) -> str:
    """The attempt's claim: which instance acts as it."""
    return f"{layout.attempt_prefix(job_id, attempt)}/claim.json"


def fenced_key(job_id: str, attempt: int, instance_id: str) -> str:
    """Where a fenced-out instance says so (a key of its own: it overwrites nothing)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in instance_id)
    return f"{layout.attempt_prefix(job_id, attempt)}/fenced-{safe}.json"


def instance_identity(environ: Mapping[str, str], imds: Any) -> str:
    """This machine's instance id: the local market's variable, else the instance's metadata
    service (spotrun.agent.imds.InstanceMetadata), else the host."""
    if environ.get(INSTANCE_ENV):
        return environ[INSTANCE_ENV]
    try:
        found = imds.instance_id()
    except SpotrunError:
        found = None
    return found.strip() if found and found.strip() else f"host:{socket.gethostname()}"


class AttemptFence:
    """Claim an attempt for this instance; tell whether the claim is still ours."""

    def __init__(self, store: ObjectStore, job_id: str, attempt: int, instance_id: str) -> None:
        self.store = store
        self.key = claim_key(job_id, attempt)
        self.instance_id = instance_id
        self.holder: str | None = None

    def _holder(self) -> str | None:
        try:
            body = json.loads(self.store.get_bytes(self.key))
        except ObjectNotFound:
            return None
        except ValueError:
            return ""   # unreadable claim: someone holds it, and it is not provably us
        return str(body.get("instance_id", "")) if isinstance(body, dict) else ""

    def _claim_once(self) -> str | None:
        body = json.dumps({"instance_id": self.instance_id, "pid": os.getpid()}).encode()
        if self.store.put_if_absent(self.key, body):
            return self.instance_id
        return self._holder()

    def claim(self) -> bool:
        """True when this instance holds the attempt (claimed now or earlier: agent restart).

        Raises SpotrunError when the store cannot say: not knowing is not owning.
        """
        retry = Retrying(stop=stop_after_attempt(4), reraise=True,
                         wait=wait_exponential(multiplier=0.1, max=1.0))
        self.holder = retry(self._claim_once)
        return self.holder == self.instance_id

    def still_ours(self) -> bool:
        """Re-read the claim; False only when it provably names another instance."""
        try:
            holder = self._holder()
        except SpotrunError as exc:
            log.warning("claim_read_failed", error=str(exc)[:200])
            return True
        if holder is None or holder == self.instance_id:
            return True
        self.holder = holder
        return False


class GuardedReporter(Reporter):
    """The agent's Reporter that writes nothing once the attempt's claim is lost."""

    fenced = False

    def put_bytes(self, key: str, data: bytes) -> bool:
        """As Reporter.put_bytes, unless fenced out (then a no-op returning False)."""
        if self.fenced:
            return False
        return super().put_bytes(key, data)

"""What every daemon loop is given: database, provider, store, settings, clock."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import structlog
from sqlalchemy import or_, true
from sqlalchemy.engine import Engine

from spotrun.clock import Clock, SystemClock  # noqa: F401 (re-exported for the loops)
from spotrun.config import Settings
from spotrun.providers.base import Provider
from spotrun.store.base import ObjectStore
from spotrun.checkpoints import resume_point
from spotrun.db.models import Attempt
from spotrun.errors import StoreError
from spotrun.providers.facts import facts_for
from spotrun.store import open_store


@dataclass
class DaemonContext:
    """Shared handles of one daemon, for one cloud (several clouds: one context each, the
    engine and clock shared; `peers` holds them all, by cloud, the home cloud first)."""

    engine: Engine
    settings: Settings                      # this cloud's settings view (clouds.cloud_settings)
    provider: Provider
    store: ObjectStore                      # this cloud's store (bundles, logs, heartbeats)
    clock: Clock = field(default_factory=SystemClock)
    log: structlog.stdlib.BoundLogger = field(
        default_factory=lambda: structlog.get_logger("spotrun.daemon"))
    home_cloud: str = ""                    # the first cloud settings list ("" = this one)
    peers: dict[str, "DaemonContext"] = field(default_factory=dict)

    @property
    def cloud(self) -> str:
        """The provider this context acts on."""
        return self.settings.provider

    @property
    def several(self) -> bool:
        """True when the daemon places jobs on more than one cloud."""
        return len(self.peers) > 1

    def owns(self) -> Any:
        """The SQL condition on Attempt rows this cloud's loops act on: every row with one
        cloud; with several, its own (rows without a cloud are the home cloud's)."""
        if not self.several:
            return true()
        mine = Attempt.cloud == self.cloud
        if self.cloud == (self.home_cloud or self.cloud):
            return or_(mine, Attempt.cloud.is_(None))
        return mine

    @property
    def plan_store_uri(self) -> str | None:
        """The store an attempt's plan names in this cloud: its own with several clouds (the
        job's keys below its root); None with one, the job's own store."""
        return self.store.uri if self.several else None

    def for_cloud(self, cloud: str | None) -> "DaemonContext":
        """The context of an attempt's cloud (None: the home cloud's; one cloud: this)."""
        if not self.several:
            return self
        return self.peers[cloud or self.home_cloud]

    @property
    def time_scale(self) -> float:
        """Provider-clock seconds per wall second (the provider's own fact)."""
        return facts_for(self.settings).time_scale(self.settings)

    def checkpointed_step(self, job_id: str, checkpoint_uri: str, fallback: int) -> int:
        """The newest checkpoint that verifies as the agent and library verify it: where the
        next attempt really resumes."""
        try:
            m = resume_point(self.store_for(checkpoint_uri))
        except StoreError as exc:
            self.log.warning("checkpoint_list_failed", job=job_id, error=str(exc))
            return fallback
        return m.step if m is not None else 0

    def job_store(self, job: Any) -> ObjectStore:
        """Where an attempt of the job in this cloud keeps its files (heartbeats, reports,
        logs, control): the job's own store with one cloud, this cloud's with several (the
        same keys below its root)."""
        return self.store if self.several else self.store_for(job.store_uri)

    def store_for(self, uri: str) -> ObjectStore:
        """The store of a job (normally the daemon's own)."""
        if uri.rstrip("/") == self.store.uri.rstrip("/"):
            return self.store
        return open_store(uri)

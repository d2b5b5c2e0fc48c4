"""What every daemon loop is given: database, provider, store, settings, clock."""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog
from sqlalchemy.engine import Engine

from spotrun.clock import Clock, SystemClock  # noqa: F401 (re-exported for the loops)
from spotrun.config import Settings
from spotrun.providers.base import Provider
from spotrun.store.base import ObjectStore
from spotrun.checkpoints import resume_point
from spotrun.errors import StoreError
from spotrun.providers.facts import facts_for
from spotrun.store import open_store


@dataclass
class DaemonContext:
    """Shared handles of one daemon."""

    engine: Engine
    settings: Settings
    provider: Provider
    store: ObjectStore                      # the daemon's store (bundles, logs, heartbeats)
    clock: Clock = field(default_factory=SystemClock)
    log: structlog.stdlib.BoundLogger = field(
        default_factory=lambda: structlog.get_logger("spotrun.daemon"))

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

    def store_for(self, uri: str) -> ObjectStore:
        """The store of a job (normally the daemon's own)."""
        if uri.rstrip("/") == self.store.uri.rstrip("/"):
            return self.store
        return open_store(uri)

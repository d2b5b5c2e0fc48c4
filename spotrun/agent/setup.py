"""Prepare an instance for one attempt: code bundle, resume point, secrets."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import structlog
from tenacity import Retrying, retry_if_not_exception_type, stop_after_attempt, wait_exponential

from spotrun.agent.config import AgentConfig
from spotrun.bundle import extract_bundle
from spotrun.checkpoints import resume_point
from spotrun.errors import ObjectNotFound
from spotrun.secrets import ClientFactory, resolve_secrets
from spotrun.store import open_store
from spotrun.store.base import ObjectStore

log = structlog.get_logger("spotrun.agent")


@dataclass(frozen=True)
class AgentPaths:
    """Where the agent keeps things on the instance disk (under its cwd)."""

    root: Path

    @property
    def job_dir(self) -> Path:
        """The extracted bundle; the command's cwd."""
        return self.root / "job"

    @property
    def state_dir(self) -> Path:
        """The agent's own files."""
        return self.root / "spotrun-agent"

    @property
    def bundle_path(self) -> Path:
        """The downloaded bundle."""
        return self.state_dir / "bundle.tar.gz"

    @property
    def log_path(self) -> Path:
        """The command's stdout+stderr."""
        return self.state_dir / "output.log"

    @property
    def progress_path(self) -> Path:
        """SPOTRUN_PROGRESS_FILE."""
        return self.state_dir / "progress.json"


@dataclass(frozen=True)
class Prepared:
    """What setup found: the resume point and resolved secrets (values: keep out of logs)."""

    resume_checkpoint: str | None
    secrets: dict[str, str] = field(repr=False, default_factory=dict)


def fetch_bundle(config: AgentConfig, store: ObjectStore, paths: AgentPaths) -> int:
    """Download and extract the bundle into the job folder; returns the member count."""
    paths.job_dir.mkdir(parents=True, exist_ok=True)
    if not config.bundle_key:
        return 0
    paths.state_dir.mkdir(parents=True, exist_ok=True)
    # A transient store error should not cost the attempt; a missing bundle will not appear.
    retry = Retrying(stop=stop_after_attempt(4), reraise=True,
                     retry=retry_if_not_exception_type(ObjectNotFound),
                     wait=wait_exponential(multiplier=0.2, max=2.0))
    retry(store.get_file, config.bundle_key, paths.bundle_path)
    return extract_bundle(paths.bundle_path, paths.job_dir)


def find_resume_point(config: AgentConfig,
                      checkpoint_store: ObjectStore | None = None) -> str | None:
    """Name of the newest checkpoint that verifies, or None for a fresh start."""
    ckpt_store = checkpoint_store or open_store(config.checkpoint_uri)
    manifest = resume_point(ckpt_store)
    return manifest.name if manifest else None


def prepare(config: AgentConfig, *, store: ObjectStore, paths: AgentPaths,
            environ: Mapping[str, str], secret_clients: ClientFactory | None = None,
            checkpoint_store: ObjectStore | None = None) -> Prepared:
    """Bundle, resume point and secrets; raises SpotrunError (or OSError) on failure."""
    paths.state_dir.mkdir(parents=True, exist_ok=True)
    members = fetch_bundle(config, store, paths)
    resume = find_resume_point(config, checkpoint_store)
    secrets = resolve_secrets(config.secrets, environ=environ, clients=secret_clients,
                              region=config.region)
    log.info("setup_done", bundle_members=members, resume_checkpoint=resume or "",
             secrets=sorted(secrets))
    return Prepared(resume_checkpoint=resume, secrets=secrets)

"""Prepare an instance for one attempt: code bundle, resume point, secrets."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import structlog
from tenacity import Retrying, retry_if_not_exception_type, stop_after_attempt, wait_exponential

from spotrun.agent.config import AgentConfig
from spotrun.bundle import extract_bundle
from spotrun.checkpoints import resume_point
from spotrun import jobfiles
from spotrun.errors import ObjectNotFound, SpotrunError
from spotrun.secrets import ClientFactory, resolve_secrets
from spotrun.store import open_store
from spotrun.store.base import ObjectStore

log = structlog.get_logger("spotrun.agent")


@dataclass(frozen=True)
class AgentPaths:
    """Where the agent keeps things on the instance disk (under its cwd)."""

    root: Path
    job: Path | None = None   # the provider's stable job directory (AgentConfig.job_dir)

    @property
    def job_dir(self) -> Path:
        """The extracted bundle and the persisted files; the command's cwd."""
        return self.job if self.job is not None else self.root / "job"

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
    files_restored: int = 0   # persisted files of the resume checkpoint put in the job dir


def job_dir_for(config: AgentConfig, node_rank: int) -> Path | None:
    """The provider's job directory for this job and node, or None for <agent dir>/job."""
    if not config.job_dir:
        return None
    path = Path(config.job_dir.replace("{job_id}", config.job_id)
                .replace("{node_rank}", str(node_rank))).expanduser()
    # The agent empties it: never a path that could hold anything but this job.
    if not path.is_absolute() or len(path.resolve().parts) < 3:
        raise SpotrunError("the job directory must be an absolute path at least two folders "
                           "deep", field="job_dir", value=str(path))
    return path.resolve()


def empty_job_dir(paths: AgentPaths) -> None:
    """Start the attempt from an empty job directory: only its bundle and persisted files."""
    folder = paths.job_dir
    if folder.is_dir():
        for child in folder.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink(missing_ok=True)
    folder.mkdir(parents=True, exist_ok=True)


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
    """Bundle, resume point, persisted files and secrets; raises SpotrunError (or OSError)."""
    paths.state_dir.mkdir(parents=True, exist_ok=True)
    if paths.job is not None:
        empty_job_dir(paths)
    members = fetch_bundle(config, store, paths)
    ckpt_store = checkpoint_store or open_store(config.checkpoint_uri)
    resume = find_resume_point(config, ckpt_store)
    restored = restore_files(ckpt_store, resume, paths) if resume else 0
    secrets = resolve_secrets(config.secrets, environ=environ, clients=secret_clients,
                              region=config.region)
    log.info("setup_done", bundle_members=members, resume_checkpoint=resume or "",
             files_restored=restored, job_dir=str(paths.job_dir), secrets=sorted(secrets))
    return Prepared(resume_checkpoint=resume, secrets=secrets, files_restored=restored)


def restore_files(store: ObjectStore, name: str, paths: AgentPaths) -> int:
    """The resume checkpoint's persisted files into the job directory, over the bundle's."""
    return jobfiles.restore(store, name, paths.job_dir)

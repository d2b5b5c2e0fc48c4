"""The Checkpointer's settings from the agent's SPOTRUN_* environment (docs/contracts.md).

Under spotrun or not is read from the agent's own ids, SPOTRUN_JOB_ID and SPOTRUN_ATTEMPT,
which it always sets together: the CLI's settings a user exports (SPOTRUN_HOME,
SPOTRUN_DB_URL, ...) and the Checkpointer's own settings (SPOTRUN_CHECKPOINT_KEEP, ...) say
nothing about who started the process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from spotrun.errors import ConfigError

DEFAULT_INTERVAL_S = 600.0
DEFAULT_KEEP = 3
AGENT_IDS = ("SPOTRUN_JOB_ID", "SPOTRUN_ATTEMPT")   # set by the agent, always both
URI_ENV = "SPOTRUN_CHECKPOINT_URI"


@dataclass(frozen=True)
class EnvSettings:
    """What the agent tells the training process; every field may be absent."""

    uri: str | None
    interval_s: float | str | None      # seconds, or "auto"
    keep: int | None
    resume: str | None                  # checkpoint name, or None = newest verified
    total_steps: int | None
    progress_file: str | None
    notice_file: str | None = None      # where the agent writes the interruption notice
    under_spotrun: bool = False         # the agent's ids are set: the agent started us


def _num(env: Mapping[str, str], name: str, kind: type, minimum: float) -> float | int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = kind(raw)
    except ValueError:
        raise ConfigError("not a number", field=name, value=raw) from None
    if value < minimum:
        raise ConfigError(f"must be >= {minimum}", field=name, value=raw)
    return value


def under_spotrun(env: Mapping[str, str]) -> bool:
    """True when an agent id is set: the agent started this process (it sets both ids)."""
    return any(env.get(k, "").strip() for k in AGENT_IDS)


def missing_location(env: Mapping[str, str]) -> ConfigError:
    """Under spotrun with no checkpoint location: the error names the SPOTRUN_* variables seen."""
    ids = [k for k in AGENT_IDS if env.get(k, "").strip()]
    missing = [k for k in AGENT_IDS if k not in ids]
    seen = ", ".join(sorted(k for k in env if k.startswith("SPOTRUN_")))
    unclear = f"; {', '.join(ids)} is set without {', '.join(missing)}" if missing else ""
    return ConfigError(
        f"no checkpoint location under spotrun{unclear} (SPOTRUN_* variables seen: {seen})",
        field=URI_ENV,
        hint=f"the agent sets {URI_ENV} with both ids; pass uri= or store= to Checkpointer, or "
             f"unset {', '.join(ids)} to run outside spotrun (checkpoints in ./spotrun-checkpoints)")


def from_env(env: Mapping[str, str] | None = None) -> EnvSettings:
    """Parse the SPOTRUN_* variables; raises ConfigError naming the bad one."""
    env = os.environ if env is None else env
    interval_raw = env.get("SPOTRUN_CHECKPOINT_INTERVAL_S", "").strip()
    interval: float | str | None
    if interval_raw.lower() == "auto":
        interval = "auto"
    else:
        interval = _num(env, "SPOTRUN_CHECKPOINT_INTERVAL_S", float, 0.0)
    keep = _num(env, "SPOTRUN_CHECKPOINT_KEEP", int, 1)
    total = _num(env, "SPOTRUN_TOTAL_STEPS", int, 1)
    return EnvSettings(
        uri=env.get(URI_ENV) or None,
        interval_s=interval,
        keep=int(keep) if keep is not None else None,
        resume=env.get("SPOTRUN_RESUME_CHECKPOINT") or None,
        total_steps=int(total) if total is not None else None,
        progress_file=env.get("SPOTRUN_PROGRESS_FILE") or None,
        notice_file=env.get("SPOTRUN_NOTICE_FILE") or None,
        under_spotrun=under_spotrun(env),
    )

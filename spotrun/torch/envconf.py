"""The Checkpointer's settings from the agent's SPOTRUN_* environment (docs/contracts.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from spotrun.errors import ConfigError

DEFAULT_INTERVAL_S = 600.0
DEFAULT_KEEP = 3


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
    under_spotrun: bool = False         # any SPOTRUN_* variable set: the agent started us


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
        uri=env.get("SPOTRUN_CHECKPOINT_URI") or None,
        interval_s=interval,
        keep=int(keep) if keep is not None else None,
        resume=env.get("SPOTRUN_RESUME_CHECKPOINT") or None,
        total_steps=int(total) if total is not None else None,
        progress_file=env.get("SPOTRUN_PROGRESS_FILE") or None,
        notice_file=env.get("SPOTRUN_NOTICE_FILE") or None,
        under_spotrun=any(k.startswith("SPOTRUN_") for k in env),
    )

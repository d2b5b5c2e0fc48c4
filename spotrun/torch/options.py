"""The Checkpointer's less common settings, in three small option objects with defaults.

    ckpt = Checkpointer(model=model, optimizer=opt, every_steps=100,
                        save=SaveOptions(async_save=False),
                        notice=NoticeOptions(grace_s=2.0),
                        runtime=RuntimeOptions(env={}, install_signal=False))

What users write most (the objects to save, where, when, how many) stays a plain keyword
of `Checkpointer`; the rest is grouped by the part of the library it steers. A bad value
raises ConfigError naming the field (`SaveOptions.retries`); a keyword that moved here from
`Checkpointer` raises ConfigError naming its new place.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping

from spotrun.errors import ConfigError

DEFAULT_MTBF_S = 6 * 3600.0      # spot reclaim interval assumed by interval_s="auto"


def _bad(owner: object, name: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"must be {allowed}", field=f"{type(owner).__name__}.{name}", value=value)


def _flag(owner: object, name: str) -> None:
    value = getattr(owner, name)
    if not isinstance(value, bool):
        raise _bad(owner, name, value, "True or False")


def _seconds(owner: object, name: str, *, optional: bool = False, positive: bool = False,
             infinite: bool = False) -> None:
    value = getattr(owner, name)
    if value is None and optional:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and \
        not math.isnan(value) and (infinite or math.isfinite(value)) and \
        (value > 0 if positive else value >= 0)
    if not ok:
        allowed = "a number of seconds " + ("> 0" if positive else ">= 0")
        raise _bad(owner, name, value, allowed + (" or None" if optional else ""))


def _count(owner: object, name: str, minimum: int, *, optional: bool = False) -> None:
    value = getattr(owner, name)
    if value is None and optional:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise _bad(owner, name, value, f"an integer >= {minimum}" + (" or None" if optional else ""))


def _path(owner: object, name: str) -> None:
    value = getattr(owner, name)
    if value is not None and not isinstance(value, (str, os.PathLike)):
        raise _bad(owner, name, value, "a path or None")


def _callable(owner: object, name: str) -> None:
    value = getattr(owner, name)
    if not callable(value):
        raise _bad(owner, name, value, "a function returning seconds")


@dataclass(frozen=True)
class SaveOptions:
    """How a save is made and written, and the reclaim interval `interval_s="auto"` assumes."""

    async_save: bool = True           # persist in a background thread (False: step() waits)
    overlap_snapshot: bool = True     # copy CPU state only optimizer.step() changes meanwhile
    sharded: bool = False             # torchrun + FSDP: every rank writes its shard (DCP)
    shard_bytes: int | None = None    # data-NNN.bin size; None: storage.SHARD_BYTES (64 MB)
    retries: int = 3                  # tries again after a failed write, this many times
    retry_backoff_s: float = 0.5      # first wait between tries, doubling
    mtbf_s: float = DEFAULT_MTBF_S    # mean time between reclaims, for interval_s="auto"

    def __post_init__(self) -> None:
        for name in ("async_save", "overlap_snapshot", "sharded"):
            _flag(self, name)
        _count(self, "shard_bytes", 1, optional=True)
        _count(self, "retries", 0)
        _seconds(self, "retry_backoff_s")
        _seconds(self, "mtbf_s", positive=True, infinite=True)


@dataclass(frozen=True)
class NoticeOptions:
    """How the interruption notice is honoured (spotrun.torch.notice)."""

    file: str | os.PathLike[str] | None = None   # None: SPOTRUN_NOTICE_FILE, if set
    background: bool = True           # the watchdog may save between steps (single process)
    grace_s: float | None = None      # None: min(1 s, half a step)
    margin_s: float | None = None     # None: 0.5 s + a quarter of the emergency save

    def __post_init__(self) -> None:
        _path(self, "file")
        _flag(self, "background")
        _seconds(self, "grace_s", optional=True)
        _seconds(self, "margin_s", optional=True)


@dataclass(frozen=True)
class RuntimeOptions:
    """What the Checkpointer takes from its process: the environment, SIGUSR1, the clocks, the
    agent's progress file. Tests inject these; a job under spotrun leaves them alone."""

    env: Mapping[str, str] | None = None   # None: os.environ (the agent's SPOTRUN_* settings)
    install_signal: bool = True       # SIGUSR1 requests the emergency save
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time   # the notice's termination time is wall time
    progress_file: str | os.PathLike[str] | None = None   # None: SPOTRUN_PROGRESS_FILE
    progress_interval_s: float = 1.0  # rewritten at most this often (and after every save)

    def __post_init__(self) -> None:
        if self.env is not None and not isinstance(self.env, Mapping):
            raise _bad(self, "env", type(self.env).__name__, "a mapping of str to str or None")
        _flag(self, "install_signal")
        _callable(self, "clock")
        _callable(self, "wall")
        _path(self, "progress_file")
        _seconds(self, "progress_interval_s")


GROUPS: dict[str, type] = {"save": SaveOptions, "notice": NoticeOptions,
                           "runtime": RuntimeOptions}
# Checkpointer keywords that moved into an option object: old name -> (keyword, field).
MOVED: dict[str, tuple[str, str]] = {
    **{f.name: ("save", f.name) for f in fields(SaveOptions)},
    "notice_file": ("notice", "file"), "background_notice": ("notice", "background"),
    "notice_grace_s": ("notice", "grace_s"), "notice_margin_s": ("notice", "margin_s"),
    **{f.name: ("runtime", f.name) for f in fields(RuntimeOptions)},
}


def check_groups(**given: Any) -> None:
    """Each option keyword holds its option object (a dict or a keyword there is a mistake)."""
    for key, value in given.items():
        cls = GROUPS[key]
        if not isinstance(value, cls):
            raise ConfigError(f"must be a {cls.__name__}", field=key, value=type(value).__name__,
                              hint=f"Checkpointer({key}={cls.__name__}(...))")


def reject_moved(kwargs: Mapping[str, Any], known: tuple[str, ...]) -> None:
    """Raise for a keyword Checkpointer no longer takes, naming where it went."""
    for name in kwargs:
        if name in MOVED:
            key, field = MOVED[name]
            cls = GROUPS[key].__name__
            # No value in the message: env= may hold credentials.
            raise ConfigError(f"moved to {cls}.{field}", field=name,
                              hint=f"Checkpointer({key}={cls}({field}=...))")
        raise ConfigError("not a Checkpointer argument", field=name,
                          hint=f"its arguments: {', '.join(known)}")

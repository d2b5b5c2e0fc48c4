"""What the framework integrations share: the notice, the job's store, folders as checkpoints.

A framework checkpoint (a Trainer `checkpoint-N/` folder, a Lightning `.ckpt` file) goes
into the job's checkpoint store as an ordinary spotrun checkpoint, `ckpt-<step:012d>/`
with the files and then `MANIFEST.json` (spotrun/checkpoints.py), so the agent finds it
as the resume point and the daemon reads the job's progress from it. The manifest's
`extra.kind` says which framework wrote it; a nested path `a/b` is stored as `a~b`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

from spotrun import jobfiles
from spotrun.checkpoints import (MANIFEST, Manifest, apply_retention, checkpoint_name,
                                 list_complete, read_manifest, write_manifest)
from spotrun.errors import ChecksumMismatch, ObjectNotFound, StoreError
from spotrun.store import open_store
from spotrun.store.base import ObjectStore
from spotrun.store.localfile import file_sha256, write_atomic

log = logging.getLogger("spotrun.integrations")

SEP = "~"   # stands for "/" in a stored file name (the manifest lists flat names)
KEEP_DEFAULT = 3


class Notice:
    """The interruption notice as the job sees it: SIGUSR1 from the agent sets a flag.

    The one place the integrations learn of a notice; the handler only records the
    moment, and the callbacks save at their next callback point.
    """

    def __init__(self, install: bool = True, notice_file: str | None = None) -> None:
        self.at: float | None = None
        self._prev: Any = None
        self._installed = False
        # The agent writes the notice file before it signals, so a notice that came while
        # the framework was still importing (before this handler existed) is not lost.
        self._file = notice_file if notice_file is not None else os.environ.get(
            "SPOTRUN_NOTICE_FILE", "")
        self._file_seen: float | None = None
        if install and threading.current_thread() is threading.main_thread():
            self._prev = signal.signal(signal.SIGUSR1, self._handler)
            self._installed = True
        elif install:
            log.warning("spotrun callback not created in the main thread: SIGUSR1 not handled")

    def _handler(self, signum: int, frame: Any) -> None:
        if self.at is None:
            self.at = time.monotonic()
        if callable(self._prev):   # a handler the program had before keeps working
            self._prev(signum, frame)

    def _file_mtime(self) -> float | None:
        if not self._file:
            return None
        try:
            return os.stat(self._file).st_mtime
        except OSError:
            return None

    @property
    def pending(self) -> bool:
        """True from the notice (signal, or the agent's notice file) until `clear()`."""
        if self.at is None:
            mtime = self._file_mtime()
            if mtime is not None and mtime != self._file_seen:
                self._file_seen = mtime      # one notice per write of the file
                self.at = time.monotonic()
        return self.at is not None

    def set(self) -> None:
        """Record a notice now (what SIGUSR1 does)."""
        self._handler(signal.SIGUSR1, None)

    def clear(self) -> float:
        """Forget the notice; returns seconds since it arrived."""
        took = time.monotonic() - (self.at if self.at is not None else time.monotonic())
        self.at = None
        # The agent writes the file, then signals: a notice the signal brought first is that
        # write too, not a second notice to save for again.
        mtime = self._file_mtime()
        if mtime is not None:
            self._file_seen = mtime
        return took

    def uninstall(self) -> None:
        """Put the previous SIGUSR1 handler back."""
        if self._installed:
            signal.signal(signal.SIGUSR1, self._prev if self._prev is not None else signal.SIG_DFL)
            self._installed = False


def job_store(uri: str | None = None, env: Mapping[str, str] | None = None) -> ObjectStore | None:
    """The job's checkpoint store (SPOTRUN_CHECKPOINT_URI unless uri is given), or None."""
    env = os.environ if env is None else env
    uri = uri or env.get("SPOTRUN_CHECKPOINT_URI") or None
    return open_store(uri) if uri else None


def env_keep(env: Mapping[str, str] | None = None) -> int:
    """SPOTRUN_CHECKPOINT_KEEP, or 3."""
    env = os.environ if env is None else env
    raw = (env.get("SPOTRUN_CHECKPOINT_KEEP") or "").strip()
    return max(1, int(raw)) if raw.isdigit() else KEEP_DEFAULT


def env_interval_s(env: Mapping[str, str] | None = None) -> float | None:
    """SPOTRUN_CHECKPOINT_INTERVAL_S as seconds, or None (leave the cadence to the framework)."""
    env = os.environ if env is None else env
    raw = (env.get("SPOTRUN_CHECKPOINT_INTERVAL_S") or "").strip()
    try:
        return float(raw) if raw else None
    except ValueError:
        return None


def upload_files(store: ObjectStore, step: int, files: Mapping[str, Path], kind: str,
                 extra: Mapping[str, Any] | None = None, keep: int | None = None) -> Manifest:
    """Upload {stored-relative-path: local file} as checkpoint `step`, manifest last.

    The job's persisted files (spotrun/jobfiles.py) are captured now and go into the same
    checkpoint; those that are among `files` are referenced, not sent twice.
    """
    name = checkpoint_name(step)
    flat_paths = {rel.replace("/", SEP): Path(path) for rel, path in sorted(files.items())}
    job_files = jobfiles.default()
    captured = job_files.capture(flat_paths, checkpoint=name) if job_files.active else None
    listed: dict[str, dict[str, Any]] = {}
    try:
        for flat, path in flat_paths.items():
            digest = store.put_file(f"{name}/{flat}", path)
            listed[flat] = {"size": path.stat().st_size, "sha256": digest}
        if captured is not None:
            listed[jobfiles.INDEX] = job_files.upload(store, name, captured)
    finally:
        if captured is not None:
            captured.discard()
    manifest = write_manifest(store, step, listed, {"kind": kind, **dict(extra or {})})
    if captured is not None:
        job_files.published(captured)
    if keep is not None:
        apply_retention(store, keep)
    return manifest


def restore_job_files(store: ObjectStore, name: str) -> int:
    """Put checkpoint `name`'s persisted files into the job directory (unless the agent did).

    Also primes this process's capture with them, so the next save does not send them again.
    """
    return jobfiles.default().resume_from(store, name)


def folder_files(folder: Path) -> dict[str, Path]:
    """Every file under folder by its '/'-relative path."""
    return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}


def download(store: ObjectStore, name: str, dest: Path) -> Manifest:
    """Fetch checkpoint `name` into dest (nested names restored), each file SHA256-checked."""
    manifest = read_manifest(store, name)
    dest.mkdir(parents=True, exist_ok=True)
    for flat, meta in manifest.files.items():
        if flat == jobfiles.INDEX:
            continue   # the job's persisted files: restore_job_files puts them in the job dir
        target = dest / flat.replace(SEP, "/")
        target.parent.mkdir(parents=True, exist_ok=True)
        store.get_file(f"{name}/{flat}", target)
        if file_sha256(target) != meta["sha256"]:
            target.unlink()
            raise ChecksumMismatch("sha256 differs", field="checkpoint", value=f"{name}/{flat}")
    return manifest



def newest_of_kind(store: ObjectStore, kind: str, prefer: str | None = None,
                   fetch: Callable[[str], Any] | None = None) -> tuple[str, Any] | None:
    """The newest checkpoint of this kind that fetch() accepts (prefer first); (name, result)."""
    names = list(reversed(list_complete(store)))
    if prefer and prefer in names:
        names.remove(prefer)
        names.insert(0, prefer)
    for name in names:
        try:
            manifest = read_manifest(store, name)
            if manifest.extra.get("kind") != kind:
                continue
            return name, (fetch(name) if fetch else manifest)
        except (ChecksumMismatch, ObjectNotFound, StoreError, OSError) as exc:
            log.warning("skipping checkpoint %s: %s", name, exc)
    return None


class Progress:
    """The progress file the agent's heartbeat reads (SPOTRUN_PROGRESS_FILE), rewritten atomically."""

    def __init__(self, env: Mapping[str, str] | None = None, interval_s: float = 1.0,
                 notice: Notice | None = None) -> None:
        env = os.environ if env is None else env
        self.notice = notice
        self._noticed = False
        path = env.get("SPOTRUN_PROGRESS_FILE") or None
        self.path = Path(path) if path else None
        total = (env.get("SPOTRUN_TOTAL_STEPS") or "").strip()
        self.fields: dict[str, Any] = {
            "step": 0, "total_steps": int(total) if total.isdigit() else None,
            "steps_per_s": None, "last_checkpoint_step": None, "checkpoint_save_s": None,
            "emergency_checkpoint_step": None, "emergency_save_s": None,
            "notice_outcome": None}
        self.interval_s = interval_s
        self._last = -1e18
        self._mark: tuple[int, float] | None = None

    def step(self, step: int, *, force: bool = False) -> None:
        """Record the steps done; rewrite the file at most once per interval unless forced."""
        now = time.monotonic()
        self.fields["step"] = step
        if self._mark is None:
            self._mark = (step, now)
        elif now - self._mark[1] >= 1.0:
            self.fields["steps_per_s"] = (step - self._mark[0]) / (now - self._mark[1])
            self._mark = (step, now)
        if not self._noticed and self.notice is not None and self.notice.pending:
            self._noticed = True
            if self.fields["emergency_checkpoint_step"] is None:
                self.fields["notice_outcome"] = ("no emergency checkpoint: the callback saves at "
                                                 "the framework's next save point")
        # After a notice every step is reported: the next attempt's count of lost steps reads
        # the last finished step from here.
        if force or self._noticed or now - self._last >= self.interval_s:
            self.write()

    def saved(self, step: int, save_s: float, emergency_s: float | None = None) -> None:
        """Record a checkpoint in the store (an emergency one when emergency_s is given)."""
        self.fields.update(last_checkpoint_step=step, checkpoint_save_s=round(save_s, 4))
        if emergency_s is not None:
            self.fields.update(emergency_checkpoint_step=step,
                               emergency_save_s=round(emergency_s, 4),
                               notice_outcome=f"emergency checkpoint at step {step} in "
                                              f"{emergency_s:.2f} s")
            self._noticed = True
        self.write()

    def write(self) -> None:
        """Replace the file now (temp file + rename); no-op outside spotrun."""
        self._last = time.monotonic()
        if self.path is None:
            return
        body = dict(self.fields, ts=datetime.now(timezone.utc).isoformat())
        write_atomic(self.path, [json.dumps(body).encode()], durable=False)


__all__ = ["MANIFEST", "Notice", "Progress", "download", "env_interval_s", "env_keep",
           "folder_files", "job_store", "newest_of_kind", "restore_job_files", "upload_files"]


def note_save(cb: Any, step: int, where: str, t0: float) -> None:
    """After a callback's save of `step`: remember it, honour a pending notice, report it.

    `cb` is a framework callback with `uploaded_step`, `notice`, `emergency_steps` and
    `progress` (the HF and Lightning callbacks).
    """
    cb.uploaded_step = step
    cb._last_save_t = time.monotonic()
    emergency_s = None
    if cb.notice.pending and where != "end":
        emergency_s = cb.notice.clear()
        cb.emergency_steps.append((step, where))
        # stdout: the agent ships it, so `spotrun logs` shows when the notice was honoured.
        print(f"spotrun: emergency checkpoint at step {step} during {where} "
              f"({emergency_s:.2f}s after the notice)", flush=True)
    cb.progress.saved(step, time.monotonic() - t0, emergency_s)


class CallbackBase:
    """What the Trainer and Lightning callbacks share: the job's store, retention, the save
    cadence, the notice and the progress file (a mixin beside the framework's callback class)."""

    def _start(self, uri: str | None, keep: int | None, interval_s: float | None,
               install_signal: bool) -> None:
        """Set the shared state (called first from the callback's __init__)."""
        self.store = job_store(uri)
        self.keep = keep or env_keep()
        # Wall seconds between saves the callback asks for; None leaves it to the framework.
        self.interval_s = interval_s if interval_s is not None else env_interval_s()
        self.notice = Notice(install_signal)
        self.progress = Progress(notice=self.notice)
        self.uploaded_step: int | None = None
        self.emergency_steps: list[tuple[int, str]] = []   # (step, "train" | "evaluation")
        self._last_save_t = time.monotonic()

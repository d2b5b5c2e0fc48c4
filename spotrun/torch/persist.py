"""Persist snapshots to the store: inline, or in one background thread (at most one in flight).

A failed write is retried with back-off; if every try fails the error is kept
and raised to the training loop on its next call (never dropped). An in-flight
persist can be waited for or abandoned between shards.

Every save whose tries all failed is also counted and reported (`failure_fields`,
in the progress file the agent copies into its heartbeat, and `on_failure` at
once), so the daemon can record it even when the job does not survive the error.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from tenacity import (RetryCallState, Retrying, retry_if_exception, stop_after_attempt,
                      wait_exponential)

from spotrun.checkpoints import Manifest, apply_retention, checkpoint_name
from spotrun.errors import CheckpointError
from spotrun.jobfiles import Capture, JobFiles, Marks
from spotrun.store.base import ObjectStore
from spotrun.torch.snapshot import Snapshot
from spotrun.torch.storage import Abandoned, write_snapshot

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    """How one persist ended."""

    step: int
    manifest: Manifest | None = None
    files: Capture | None = None     # the job's persisted files captured with the snapshot
    persist_s: float = 0.0
    tries: int = 0
    abandoned: bool = False
    error: BaseException | None = None


class Persister:
    """Writes snapshots to a store, applying keep-N retention after each success."""

    def __init__(self, store: ObjectStore, *, keep: int, retries: int = 3,
                 backoff_s: float = 0.5, shard_bytes: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.keep = keep
        self.retries = retries
        self.backoff_s = backoff_s
        self.shard_bytes = shard_bytes
        self.clock = clock
        self._thread: threading.Thread | None = None
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._done: list[Outcome] = []
        self._bytes_total = 0
        self._bytes_done = 0
        self.failed_saves = 0
        self.last_failure: dict[str, Any] | None = None
        self.on_failure: Callable[[Outcome], None] | None = None   # e.g. rewrite progress
        # The job's persisted files, captured in the caller's thread with each snapshot (the
        # writer rank's); None: weights only.
        self.files: JobFiles | None = None

    @property
    def busy(self) -> bool:
        """True while a background persist is running."""
        return self._thread is not None and self._thread.is_alive()

    def remaining_fraction(self) -> float:
        """Share of the in-flight persist's bytes not yet written (0 when idle)."""
        with self._lock:
            if not self.busy or self._bytes_total == 0:
                return 0.0
            return 1.0 - self._bytes_done / self._bytes_total

    def run(self, snap: Snapshot, extra: dict[str, Any] | None = None, *,
            as_of: Marks | None = None) -> Outcome:
        """Persist in the calling thread; raises CheckpointError if every try fails.

        as_of: the persisted files' marks at the snapshot's step (a save made after it).
        """
        self._cancel.clear()
        out = self._persist(snap, extra, self._capture(snap, as_of))
        if out.error is not None:
            raise failure(out) from out.error
        return out

    def submit(self, snap: Snapshot, extra: dict[str, Any] | None = None) -> None:
        """Start persisting in the background; the caller must not touch snap's buffer until done."""
        if self.busy:
            raise CheckpointError("a persist is already in flight", field="checkpoint",
                                  value=snap.step)
        self._cancel.clear()
        self._thread = threading.Thread(target=self._background,
                                        args=(snap, extra, self._capture(snap)),
                                        name=f"spotrun-persist-{snap.step}", daemon=True)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the in-flight persist ends; False on timeout."""
        t = self._thread
        if t is None:
            return True
        t.join(timeout)
        return not t.is_alive()

    def abandon(self) -> None:
        """Stop the in-flight persist at the next shard boundary and wait for it."""
        self._cancel.set()
        self.wait()

    def take_outcomes(self) -> list[Outcome]:
        """Outcomes of background persists finished since the last call."""
        with self._lock:
            done, self._done = self._done, []
        return done

    def _capture(self, snap: Snapshot, as_of: Marks | None = None) -> Capture | None:
        """The persisted files as they are now (or as marked), at the snapshot's step."""
        if self.files is None or not self.files.active:
            return None
        return self.files.capture(checkpoint=checkpoint_name(snap.step), as_of=as_of)

    def _background(self, snap: Snapshot, extra: dict[str, Any] | None,
                    files: Capture | None) -> None:
        out = self._persist(snap, extra, files)
        with self._lock:
            self._done.append(out)

    def _progress(self, done: int) -> None:
        with self._lock:
            self._bytes_done = done

    def _persist(self, snap: Snapshot, extra: dict[str, Any] | None,
                 files: Capture | None = None) -> Outcome:
        t0 = self.clock()
        out = Outcome(step=snap.step, files=files)
        with self._lock:
            self._bytes_total, self._bytes_done = snap.nbytes, 0
        kwargs: dict[str, Any] = {"extra": extra, "cancel": self._cancel, "progress": self._progress}
        if self.shard_bytes:
            kwargs["shard_bytes"] = self.shard_bytes
        job_files = self.files
        if files is not None and job_files is not None:
            kwargs["job_files"] = lambda name: job_files.upload(self.store, name, files)

        def one_try() -> Any:
            out.tries += 1
            return write_snapshot(self.store, snap, **kwargs)

        def back_off(seconds: float) -> None:
            # Event.wait, not sleep: an abandon cuts the back-off short.
            if self._cancel.wait(seconds):
                raise Abandoned("abandoned during the back-off")

        def note(rs: RetryCallState) -> None:
            log.warning("checkpoint step %d: persist try %d/%d failed: %s", snap.step,
                        rs.attempt_number, self.retries + 1, rs.outcome.exception())

        retrying = Retrying(stop=stop_after_attempt(self.retries + 1),
                            wait=wait_exponential(multiplier=self.backoff_s),
                            retry=retry_if_exception(lambda e: not isinstance(e, Abandoned)),
                            sleep=back_off, after=note, reraise=True)
        try:
            out.manifest = retrying(one_try)
        except Abandoned:
            out.abandoned = True
        except Exception as exc:   # any store failure: OSError, StoreError, botocore
            out.error = exc
        finally:
            if files is not None:
                files.discard()
        if out.manifest is not None and files is not None and job_files is not None:
            job_files.published(files)
        if out.error is not None and not out.abandoned:
            self._failed(out)
        if out.manifest is not None:
            try:
                apply_retention(self.store, self.keep)
            except Exception as exc:   # retention is housekeeping: never fail a good save
                log.warning("checkpoint retention failed: %s", exc)
        out.persist_s = self.clock() - t0
        return out


    def _failed(self, out: Outcome) -> None:
        with self._lock:
            self.failed_saves += 1
            self.last_failure = {"step": out.step, "tries": out.tries,
                                 "error": f"{type(out.error).__name__}: {out.error}"[:300]}
        if self.on_failure is not None:
            try:
                self.on_failure(out)
            except Exception as exc:   # reporting must not turn one failure into two
                log.warning("checkpoint failure report failed: %s", exc)

    def failure_fields(self) -> dict[str, Any]:
        """Progress-file fields: saves failed so far, and the last one's step and error."""
        with self._lock:
            last = self.last_failure or {}
            return {"checkpoint_failures": self.failed_saves,
                    "checkpoint_error_step": last.get("step"),
                    "checkpoint_error": last.get("error")}


def failure(out: Outcome) -> CheckpointError:
    """The error to raise for an outcome whose every try failed."""
    return CheckpointError(f"persist failed after {out.tries} tries: {out.error}",
                           field="checkpoint", value=out.step,
                           hint="the store is unreachable or full; the state was not saved")

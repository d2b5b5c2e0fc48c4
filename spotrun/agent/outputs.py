"""Upload the job's outputs (spec `outputs`: paths and globs in the job's directory) to the store.

The agent uploads them when the command ends and, in the background, on an interruption
notice (whatever exists by then). Files go to `jobs/<job>/outputs/<path>`; after each
pass `outputs.json` lists every file uploaded so far (earlier attempts' entries kept),
which is what `spotrun pull` downloads. A file unchanged since this agent last sent it
(same size and mtime) is not sent again; big files log their progress.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Callable

import structlog

from spotrun import layout
from spotrun.agent.clock import iso
from spotrun.jobfiles import collect
from spotrun.store.base import ObjectStore

log = structlog.get_logger("spotrun.agent")

PROGRESS_EVERY_S = 5.0     # at most one progress line per file this often
BIG_FILE_BYTES = 64 << 20  # files at least this big log their progress


class OutputUploader:
    """One agent's uploads of the job's outputs; one pass at a time."""

    def __init__(self, store: ObjectStore, job_id: str, attempt: int, job_dir: Path,
                 patterns: list[str], *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.job_id = job_id
        self.attempt = attempt
        self.job_dir = job_dir
        self.patterns = list(patterns)
        self.clock = clock
        self.sent: dict[str, tuple[int, int]] = {}    # path -> (size, mtime_ns) last sent
        self.passes = 0
        self.failures = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def upload(self, reason: str) -> dict[str, Any]:
        """Upload what matches now, then rewrite outputs.json; returns the index written."""
        with self._lock:
            return self._upload(reason)

    def start(self, reason: str) -> None:
        """Upload in the background (on a notice: the loop must keep going)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._thread = threading.Thread(target=self.upload_safely, args=(reason,),
                                        name="outputs", daemon=True)
        self._thread.start()

    def join(self, timeout_s: float | None = None) -> None:
        """Wait for a background pass."""
        if self._thread is not None:
            self._thread.join(timeout_s)

    def upload_safely(self, reason: str) -> None:
        """upload(), logging a failure instead of raising it."""
        try:
            self.upload(reason)
        except Exception as exc:   # outputs must never take the attempt down
            self.failures += 1
            log.error("outputs_upload_failed", reason=reason, error=str(exc)[:300])

    def _upload(self, reason: str) -> dict[str, Any]:
        index_key = layout.outputs_index_key(self.job_id)
        index: dict[str, Any] = {"files": {}}
        if self.store.exists(index_key):
            try:
                index = json.loads(self.store.get_bytes(index_key))
            except ValueError:
                log.warning("outputs_index_unreadable", key=index_key)
        files = index.setdefault("files", {})
        prefix = layout.outputs_prefix(self.job_id)
        uploaded = 0
        for rel, path in collect(self.job_dir, self.patterns).items():
            try:
                st = path.stat()
            except FileNotFoundError:   # removed since the glob
                continue
            if self.sent.get(rel) == (st.st_size, st.st_mtime_ns) and rel in files:
                continue
            digest = self.store.put_file(f"{prefix}/{rel}", path, self._progress(rel, st.st_size))
            files[rel] = {"size": st.st_size, "sha256": digest, "attempt": self.attempt,
                          "ts": iso(self.clock())}
            self.sent[rel] = (st.st_size, st.st_mtime_ns)
            uploaded += 1
        index.update(attempt=self.attempt, ts=iso(self.clock()), reason=reason)
        self.store.put_bytes(index_key, json.dumps(index, sort_keys=True).encode())
        self.passes += 1
        log.info("outputs_uploaded", reason=reason, files=uploaded, listed=len(files))
        return index

    def _progress(self, rel: str, total: int) -> Callable[[int, int], None] | None:
        if total < BIG_FILE_BYTES:
            return None
        last = [0.0]

        def report(done: int, size: int) -> None:
            now = time.monotonic()
            if now - last[0] >= PROGRESS_EVERY_S or done >= size:
                last[0] = now
                log.info("outputs_progress", path=rel, bytes_done=done, bytes_total=size,
                         percent=round(100.0 * done / max(size, 1), 1))
        return report

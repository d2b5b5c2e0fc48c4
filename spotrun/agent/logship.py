"""Write the job's output to the instance disk redacted, and ship it to the store as
numbered, never-rewritten segments.

`OutputTee` reads the command's output from a pipe and appends it to output.log with
secret values already replaced, so no unredacted copy ever reaches the instance's
disk; the agent removes the file once every byte is shipped.

Each flush uploads only the bytes added since the last one, with secret values
replaced by '***'. A segment whose upload failed is retried with the same
number and the same bytes before anything newer, so readers never see a gap
filled later with different content.

The agent flushes every `log_flush_interval_s`; from an interruption notice on
(`ship_now`) the shipper follows the file itself, shipping new output within
FOLLOW_S, because the reclaim ends the instance without warning and whatever
is only on its disk is lost. The final flush, when the command has ended, stops
that and ships the rest.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import IO

from spotrun.agent.storeio import Reporter
from spotrun.secrets import Redactor

MAX_SEGMENT_BYTES = 4 * 1024 * 1024
FOLLOW_S = 0.1   # after a notice: the longest new output waits before it is shipped


def segment_key(prefix: str, seq: int) -> str:
    """Key of log segment number seq."""
    return f"{prefix}/{seq:06d}.log"


class LogShipper:
    """Incremental, redacting upload of one local log file."""

    def __init__(self, reporter: Reporter, prefix: str, path: str | Path, redactor: Redactor,
                 *, max_segment_bytes: int = MAX_SEGMENT_BYTES) -> None:
        self.reporter = reporter
        self.prefix = prefix
        self.path = Path(path)
        self.redactor = redactor
        self.max_segment_bytes = max_segment_bytes
        self.offset = 0
        self.seq = 0
        self.bytes_shipped = 0
        self._unsent: bytes | None = None
        # One flush at a time: the agent's loop, the follower and the final flush share it.
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._follower: threading.Thread | None = None

    def _upload(self, data: bytes) -> bool:
        if self.reporter.put_bytes(segment_key(self.prefix, self.seq), data):
            self.seq += 1
            self.bytes_shipped += len(data)
            self._unsent = None
            return True
        self._unsent = data
        return False

    def _read_new(self) -> bytes:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(self.max_segment_bytes)
        except FileNotFoundError:
            return b""
        self.offset += len(data)
        return data

    @property
    def pending(self) -> bool:
        """True while a segment failed to upload and waits for a retry."""
        return self._unsent is not None

    def ship_now(self) -> None:
        """Ship what is there now, then new output as it comes, until the final flush
        (the interruption notice: the instance may be gone at any moment). Returns at once."""
        with self._lock:
            if self._follower is not None or self._stop.is_set():
                return
            self._follower = threading.Thread(target=self._follow, name="log-follow",
                                              daemon=True)
            self._follower.start()

    def _follow(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                self._flush(final=False)
            self._stop.wait(FOLLOW_S)

    def flush(self, *, final: bool = False) -> int:
        """Upload new output as segments; returns how many were written. The final flush
        (the command has ended and its output is all in the file) ends any following."""
        if final:
            self._stop.set()
            if self._follower is not None:
                self._follower.join()
        elif self._follower is not None:
            return 0   # the follower ships: the agent's loop must not wait on its upload
        with self._lock:
            return self._flush(final)

    def _flush(self, final: bool) -> int:
        written = 0
        if self._unsent is not None:
            if not self._upload(self._unsent):
                return 0
            written += 1
        while True:
            raw = self._read_new()
            out = self.redactor.feed(raw) if raw else b""
            if final and len(raw) < self.max_segment_bytes:
                out += self.redactor.finish()
            if out:
                if not self._upload(out):
                    return written
                written += 1
            if len(raw) < self.max_segment_bytes:
                return written


class OutputTee:
    """A thread copying a pipe to a file through a Redactor (streaming, split-safe)."""

    def __init__(self, pipe: IO[bytes], path: str | Path, redactor: Redactor) -> None:
        self.pipe = pipe
        self.path = Path(path)
        self.redactor = redactor
        self.bytes_in = 0
        self._thread = threading.Thread(target=self._run, name="output-tee", daemon=True)

    def start(self) -> "OutputTee":
        """Start copying."""
        self._thread.start()
        return self

    def join(self, timeout_s: float = 5.0) -> bool:
        """Wait for the end of the output (every writer gone); False on timeout."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        fd = self.pipe.fileno()
        with open(self.path, "ab") as out:
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                self.bytes_in += len(chunk)
                out.write(self.redactor.feed(chunk))
                out.flush()   # the shipper reads the file as it grows
            out.write(self.redactor.finish())
        self.pipe.close()

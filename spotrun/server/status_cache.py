"""The status list a team reads, built once and shared (docs/server.md, "How fresh `status` is").

Twenty engineers calling `spotrun status` against 1,000 jobs would each build the same list
(about 0.5 s of one core per build; the box has two). The server keeps its last build as
per-job JSON and hands the list out as bytes. Once that build is older than `max_age_s`,
the next call starts one rebuild on a thread of its own and is served the previous build
meanwhile (stale-while-revalidate, as Kubernetes' API server serves lists from its watch
cache), so no call waits on a build unless the last one is older than `wait_after_s` (the
first call, or one after a long quiet spell). A job this server itself changed (submit,
cancel, resume) is rebuilt alone and patched in at once: a user's own `status` after their
own submit always shows the job.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable, Iterable

import structlog

from spotrun.contracts import json_default

log = structlog.get_logger("spotrun.server")

DEFAULT_MAX_AGE_S = 2.0
DEFAULT_WAIT_AFTER_S = 30.0


def fragment(job: dict[str, Any]) -> bytes:
    """One job's JSON as `SpotrunJSON` writes it inside a list."""
    return json.dumps(job, default=json_default).encode("utf-8")


def as_list(fragments: Iterable[bytes]) -> bytes:
    """Jobs' JSON joined into the list `SpotrunJSON` writes."""
    return b"[" + b", ".join(fragments) + b"]"


class StatusCache:
    """`GET /jobs` (no events) served from a shared build; see the module's docstring."""

    def __init__(self, build_all: Callable[[], list[dict[str, Any]]],
                 build_one: Callable[[str], dict[str, Any]], *,
                 max_age_s: float = DEFAULT_MAX_AGE_S,
                 wait_after_s: float = DEFAULT_WAIT_AFTER_S,
                 clock: Callable[[], float] = time.monotonic,
                 background: bool = True) -> None:
        self._build_all = build_all
        self._build_one = build_one
        self.max_age_s = max_age_s
        self.wait_after_s = max(wait_after_s, max_age_s)
        self._clock = clock
        # False: a due rebuild runs in the calling thread (tests see each step in order).
        self._background = background
        self._lock = threading.Lock()
        self._fragments: dict[str, bytes] = {}   # job id -> JSON, in the list's order
        self._body: bytes | None = None          # the joined list, until the next change
        self._built_at: float | None = None      # when the build in use started
        self._seq = 0                             # one tick per patch
        self._patches: dict[str, tuple[int, bytes]] = {}
        self._building: threading.Event | None = None
        self._error: Exception | None = None
        self.builds = 0

    def body(self) -> bytes:
        """The list as JSON bytes: the last build (with this server's patches)."""
        if self.max_age_s <= 0:   # sharing turned off: every call builds its own
            return as_list(fragment(j) for j in self._build_all())
        now = self._clock()
        with self._lock:
            age = None if self._built_at is None else now - self._built_at
            must_wait = age is None or age > self.wait_after_s
            due = must_wait or (age is not None and age > self.max_age_s)
            build = None
            if due and self._building is None:
                self._building = threading.Event()
                build = (self._building, self._seq, now)
            pending = self._building
            if build is None and not must_wait:
                return self._joined()
        if build is not None and self._background and not must_wait:
            threading.Thread(target=self._rebuild, args=build, name="status-build",
                             daemon=True).start()
        elif build is not None:
            self._rebuild(*build)
        elif pending is not None:
            pending.wait()   # another call's build is under way: served from it
        with self._lock:
            if self._built_at is None and self._error is not None:
                raise self._error   # nothing to serve: the caller gets the build's error
            return self._joined()

    def warm(self) -> None:
        """Start the first build on a thread of its own (a server calls this at start-up, so
        the first caller does not wait for it)."""
        with self._lock:
            if self._building is not None or self._built_at is not None or self.max_age_s <= 0:
                return
            self._building = threading.Event()
            build = (self._building, self._seq, self._clock())
        threading.Thread(target=self._rebuild, args=build, name="status-build",
                         daemon=True).start()

    def _joined(self) -> bytes:
        if self._body is None:
            self._body = as_list(self._fragments.values())
        return self._body

    def _rebuild(self, done: threading.Event, start_seq: int, started_at: float) -> None:
        """Build every job's view; patches made after the build began stay on top of it."""
        try:
            fresh = {str(j["id"]): fragment(j) for j in self._build_all()}
        except Exception as exc:   # kept: the previous build serves until one succeeds
            log.warning("status build failed", error=f"{type(exc).__name__}: {exc}")
            with self._lock:
                self._error = exc
                self._building = None
            done.set()
            return
        with self._lock:
            for job_id, (seq, frag) in self._patches.items():
                if seq > start_seq:
                    fresh[job_id] = frag
            self._patches = {k: v for k, v in self._patches.items() if v[0] > start_seq}
            self._fragments = fresh
            self._body = None
            self._built_at = started_at
            self._error = None
            self._building = None
            self.builds += 1
        done.set()

    def changed(self, job_id: str) -> None:
        """This server changed job_id: rebuild its entry now (a job new to the list goes last,
        as the newest job does in a build). Never raises: the change itself is done; if its
        entry cannot be built, the next call waits for a whole new build instead."""
        try:
            # Patched even before a first build: one under way may have read the job before.
            frag = fragment(self._build_one(job_id))
        except Exception as exc:
            log.warning("status entry failed", job=job_id, error=f"{type(exc).__name__}: {exc}")
            with self._lock:
                self._built_at = None
            return
        with self._lock:
            self._seq += 1
            self._patches[job_id] = (self._seq, frag)
            self._fragments[job_id] = frag
            self._body = None

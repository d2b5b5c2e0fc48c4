"""A job's output, read from the store attempt by attempt: all at once (`logs --json`) or
as a stream of text that, followed, ends when the job ends (`logs -f`, also the team
server's streamed `GET /jobs/{ref}/logs`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from spotrun import layout
from spotrun.db import Attempt, Job, attempts_of, job_named, session
from spotrun.errors import NotFoundError
from spotrun.store import open_store
from spotrun.ui.views import WAITS_FOR_DAEMON, daemon_missing

# ("out", text) goes to stdout, ("err", text) is a note for stderr (why nothing comes yet).
Chunk = tuple[str, str]


def _pool(a: Attempt) -> str:
    return f"{a.instance_type} {a.zone} {a.market.value}"


@dataclass
class JobLogs:
    """One job's logs; opening it checks the job and the attempt (before any output)."""

    settings: Any
    engine: Any
    job_id: str
    store: Any
    attempts: dict[int, Attempt]
    attempt_no: int | None

    @classmethod
    def open(cls, settings: Any, engine: Any, job_ref: str, attempt_no: int | None
             ) -> "JobLogs":
        """The job's logs, or not found (the job; the attempt, naming the ones it has)."""
        with session(engine) as s:
            job = job_named(s, job_ref)
            job_id, store_uri = job.id, job.store_uri
            attempts = {a.number: a for a in attempts_of(s, job.id)}
        if attempt_no is not None and attempt_no not in attempts:
            have = f"1-{max(attempts)}" if attempts else "none yet"
            raise NotFoundError(f"no attempt {attempt_no}; the job's attempts: {have}",
                                field="--attempt", value=attempt_no)
        return cls(settings, engine, job_id, open_store(store_uri), attempts, attempt_no)

    def _segments(self, n: int) -> list[str]:
        prefix = layout.log_prefix(self.job_id, n) + "/"
        return [o.key for o in self.store.list(prefix) if o.key.endswith(".log")]

    def _text(self, key: str) -> str:
        return self.store.get_bytes(key).decode("utf-8", errors="replace")

    def as_json(self) -> list[dict[str, Any]]:
        """`logs --json`: `[{"attempt", "pool", "end_reason", "output"}]`."""
        return [{"attempt": n, "pool": _pool(a),
                 "end_reason": a.end_reason.value if a.end_reason else None,
                 "output": "".join(self._text(k) for k in self._segments(n))}
                for n, a in sorted(self.attempts.items())
                if self.attempt_no is None or n == self.attempt_no]

    def chunks(self, *, follow: bool, poll_s: float,
               sleep: Callable[[float], None] = time.sleep) -> Iterator[Chunk]:
        """The output as it is in the store; with follow, new output until the job ends."""
        printed: set[str] = set()
        headed: set[int] = set()
        told: str | None = None
        while True:
            if follow and not self.attempts:
                # Say why nothing comes yet (once per reason), rather than hang in silence.
                why = self._why_no_attempt()
                if why != told:
                    yield "err", why + "\n"
                    told = why
            for n, a in sorted(self.attempts.items()):
                if self.attempt_no is not None and n != self.attempt_no:
                    continue
                keys = [k for k in self._segments(n) if k not in printed]
                if n not in headed and (keys or a.state.is_terminal()):
                    headed.add(n)
                    yield "out", (f"== attempt {n} ({_pool(a)})"
                                  + (f", {a.end_reason.value}" if a.end_reason else "")
                                  + " ==\n")
                    if not keys and not self._segments(n):
                        yield "out", "(no output)\n"
                for key in keys:
                    printed.add(key)
                    yield "out", self._text(key)
            if not follow:
                return
            with session(self.engine) as s:
                self.attempts = {a.number: a for a in attempts_of(s, self.job_id)}
                if s.get(Job, self.job_id).state.is_terminal():
                    follow = False  # one more pass picks up the final segments
                    continue
            sleep(poll_s)  # a follow loop paces itself; not a test wait

    def _why_no_attempt(self) -> str:
        """`job X has no attempt yet (queued: reason); waiting...` for `logs -f`."""
        with session(self.engine) as s:
            job = s.get(Job, self.job_id)
            state, reason = job.state, job.reason
        if state in WAITS_FOR_DAEMON:
            reason = daemon_missing(self.settings, self.engine) or reason
        return (f"job {self.job_id} has no attempt yet ({state.value}: "
                f"{reason or 'waiting for the scheduler'}); waiting...")

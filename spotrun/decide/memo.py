"""Submit-time checks shared between alike specs for a moment (the team server).

Twenty engineers submitting a sweep send specs that differ in name, command and env but not
in what the decision reads (resources, model, work, policy, checkpoint). The check that such
a job can run at all (`spotrun.jobs.refuse_never_runs`: a whole decision over every pool) is
then the same for each within a second: the pool history it reads is itself one shared
reading per second (`costmodel.history.SharedHistory`). The memo keeps each answer, warnings
or refusal, for `max_age_s`, so a burst of alike submits decides once.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable

from spotrun.errors import SpotrunError
from spotrun.spec import JobSpec

# What a decision reads of a spec; the rest (name, command, env, secrets, files) it does not.
DECIDED_BY = ("resources", "model", "work", "policy", "checkpoint")


def decision_key(spec: JobSpec) -> str:
    """The parts of a spec a decision reads, as one string."""
    d = spec.to_dict()
    return json.dumps({k: d.get(k) for k in DECIDED_BY}, sort_keys=True, default=str)


class CheckMemo:
    """Answers of a check by decision key, each kept max_age_s (a refusal too)."""

    def __init__(self, max_age_s: float = 1.0, max_entries: int = 256,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_s = max_age_s
        self.max_entries = max_entries
        self._clock = clock
        self._lock = threading.Lock()
        self._held: dict[str, tuple[float, Any, SpotrunError | None]] = {}

    def get(self, spec: JobSpec, compute: Callable[[], list[str]]) -> list[str]:
        """compute()'s warnings for an alike spec checked within max_age_s, else computed now;
        its refusal is raised again for every alike spec in that time."""
        key = decision_key(spec)
        now = self._clock()
        with self._lock:
            hit = self._held.get(key)
        if hit is not None and now - hit[0] <= self.max_age_s:
            if hit[2] is not None:
                raise hit[2]
            return list(hit[1])
        try:
            warnings = compute()
        except SpotrunError as exc:
            self._keep(key, now, None, exc)
            raise
        self._keep(key, now, list(warnings), None)
        return warnings

    def _keep(self, key: str, at: float, warnings: Any, error: SpotrunError | None) -> None:
        with self._lock:
            if len(self._held) >= self.max_entries:
                oldest = min(self._held, key=lambda k: self._held[k][0])
                del self._held[oldest]
            self._held[key] = (at, warnings, error)

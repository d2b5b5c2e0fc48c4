"""The seam's types: what a backend serves and the answers of its verbs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

from spotrun.interrupts import Interrupted


@dataclass(frozen=True)
class Cancelled:
    """A cancel's answer: `cancel --json`'s object, and the job's state before the call."""

    job: dict[str, Any]
    was: str | None


@dataclass(frozen=True)
class Submitted:
    """A submit's answer: `submit --json`'s object (with dry_run: the plan), the spec's
    warnings, and a note for stderr (no daemon will pick the job up)."""

    job: dict[str, Any]
    warnings: tuple[str, ...] = ()
    note: str | None = None


Progress = Callable[[int, int], None]


class Backend(Protocol):
    """The verbs a backend serves; each returns what the matching `--json` prints
    (audit: JobAudit objects, whose `to_dict()` it prints)."""

    def status(self, ref: str | None, *, events: bool = False) -> Any:
        """`status --json`: a list of jobs, or one job."""

    def submit(self, spec_file: str, *, owner: str | None, dry_run: bool,
               progress: Progress | None = None) -> Submitted:
        """Submit a spec file (its workdir's bundle uploaded, progress: bytes done, total)."""

    def logs(self, ref: str, attempt: int | None, *, follow: bool, poll_s: float
             ) -> Iterator[tuple[str, str]]:
        """A job's output as ("out"|"err", text); followed, it ends when the job ends (the
        job and attempt are checked before the first chunk)."""

    def logs_json(self, ref: str, attempt: int | None) -> list[dict[str, Any]]:
        """`logs --json`."""

    def pull(self, ref: str, dest: Path | None, *, checkpoint: bool, show: bool
             ) -> dict[str, Any]:
        """Write the job's outputs (and checkpoint export) into dest (None: ./<job id>);
        `pull --json`'s object. show: progress bars on a terminal."""

    def cancel(self, ref: str) -> Cancelled:
        """Cancel a job (idempotent)."""

    def resume(self, ref: str, budget_usd: float | None) -> dict[str, Any]:
        """Resume a stopped job; `resume --json`."""

    def interrupt(self, ref: str, *, node: int | None, notice_s: float | None) -> Interrupted:
        """Send the provider's interruption to the job's current instance(s)."""

    def audit(self, refs: list[str], *, since: datetime | None, until: datetime | None,
              hindsight: bool) -> list[Any]:
        """`audit`: one JobAudit per job."""

    def budgets(self) -> list[dict[str, Any]]:
        """`budgets --json` ([] when no budget is configured)."""

    def set_budget(self, scope: str, name: str, usd: Any, period: Any) -> dict[str, Any]:
        """`budgets set --json` (admins remotely); each field checked, nothing written on
        bad input."""

    def remove_budget(self, scope: str, name: str) -> dict[str, Any]:
        """`budgets remove --json` (admins remotely)."""

    def trail(self, *, user: str | None, since: datetime | None) -> list[dict[str, Any]]:
        """`trail --json`: the action trail, oldest first."""

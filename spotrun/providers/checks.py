"""One line of `spotrun doctor`'s cloud report, the same shape for every provider."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum


class Status(str, Enum):
    """Outcome of one check."""

    OK = "ok"
    FIX = "fix"
    UNKNOWN = "could-not-check"


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    name: str
    status: Status
    detail: str

    def to_dict(self) -> dict[str, str]:
        """JSON-able."""
        d = asdict(self)
        d["status"] = self.status.value
        return d

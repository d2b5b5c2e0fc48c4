"""One line of `spotrun doctor`'s cloud report, the same shape for every provider."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from typing import Callable

from spotrun.errors import ConfigError


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


def run_check(name: str, fn: Callable[[], "Check | list[Check]"],
              error_code: Callable[[BaseException], str]) -> list[Check]:
    """fn's checks; a bad setting is a FIX, any other failure a check that could not run."""
    try:
        out = fn()
    except ConfigError as exc:
        return [Check(name, Status.FIX, str(exc))]
    except Exception as exc:  # noqa: BLE001 - a check that cannot run is reported
        code = error_code(exc) or type(exc).__name__
        return [Check(name, Status.UNKNOWN, f"{code}: {str(exc)[:160]}")]
    return out if isinstance(out, list) else [out]

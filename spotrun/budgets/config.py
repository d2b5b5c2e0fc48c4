"""`[budgets]` in spotrun.toml: dollar budgets per project and per owner.

```toml
[budgets]
allow_owner_override = false          # true: `spotrun submit --owner NAME` may name another
[budgets.project.ml-research]
usd = 2000
period = "month"                      # day | week | month (UTC calendar) | total
[budgets.owner.alice]
usd = 300
period = "week"
```

Every problem names its dotted key (`budgets.project.ml-research.usd`) and what is
allowed; `load_settings` turns it into one ConfigError line (exit 2).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field, Strict

from spotrun.contracts import fail

_STRICT = ConfigDict(extra="forbid")
PERIODS = ("day", "week", "month", "total")
Period = Literal["day", "week", "month", "total"]
SCOPES = ("project", "owner")
DEFAULT_PROJECT = "default"
UNKNOWN_OWNER = "unknown"      # jobs submitted before owners existed
# A project is named like a job (spec.name's rule); an owner like a user name. Both stay
# valid as AWS tag values and as the key of a TOML table.
PROJECT_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
OWNER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}$")
# Cloud tags every instance carries (AWS cost-allocation tags), so the cloud's own bill
# groups by them too.
TAG_PROJECT = "spotrun:project"
TAG_OWNER = "spotrun:owner"
PROJECT_RULE = "lower-case letters, digits and '-', 1-63 characters, not starting with '-'"
OWNER_RULE = "letters, digits, '_', '.', '@' and '-', 1-64 characters"


def _named(pattern: re.Pattern[str], rule: str) -> AfterValidator:
    def check(value: str) -> str:
        if not pattern.match(value):
            raise fail(f"not a valid name; allowed: {rule}")
        return value
    return AfterValidator(check)


ProjectName = Annotated[str, Strict(), _named(PROJECT_RE, PROJECT_RULE)]
OwnerName = Annotated[str, Strict(), _named(OWNER_RE, OWNER_RULE)]


@dataclass(frozen=True)
class ScopeBudget:
    """One budget: at most `usd` per `period` (a UTC calendar day, ISO week, month, or ever)."""

    __pydantic_config__ = _STRICT

    usd: Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False,
                                          description="a number > 0 (USD)")]
    period: Annotated[Period, Field(description="day, week, month or total")]


@dataclass(frozen=True)
class BudgetsSettings:
    """`[budgets]`: who may name another owner, and the budgets by project and by owner."""

    __pydantic_config__ = _STRICT

    allow_owner_override: Annotated[bool, Strict(), Field(description="true or false")] = False
    project: dict[ProjectName, ScopeBudget] = field(default_factory=dict)
    owner: dict[OwnerName, ScopeBudget] = field(default_factory=dict)

    def configured(self) -> list[tuple[str, str, ScopeBudget]]:
        """Every budget as (scope, name, budget), projects first, each by name."""
        return ([("project", n, b) for n, b in sorted(self.project.items())]
                + [("owner", n, b) for n, b in sorted(self.owner.items())])

    def of_job(self, project: str, owner: str) -> list[tuple[str, str, ScopeBudget]]:
        """The budgets a job of this project and owner spends from."""
        out = []
        if project in self.project:
            out.append(("project", project, self.project[project]))
        if owner in self.owner:
            out.append(("owner", owner, self.owner[owner]))
        return out


def scope_key(scope: str, name: str) -> str:
    """`project:ml` / `owner:alice`: a budget's key (events, alerts, locks)."""
    return f"{scope}:{name}"

"""Where project and owner budgets come from: `[budgets]` of spotrun.toml, and the rows
`spotrun budgets set` writes to the state database (locally or through the team server).

The rule (docs/budgets.md): the effective budgets are the toml's plus the database's, a
database row overriding the toml's budget of the same scope and name. The toml stays the
file an operator versions and reviews, and a home that never used `budgets set` works as
before; the database is what admins change on a running daemon, read once per scheduling
pass (one small query), so a change takes effect without a restart. Removing a row makes
the toml's budget (if any) apply again; a budget only the toml sets is removed there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Iterable

from sqlmodel import select

from spotrun.config import (OWNER_RE, OWNER_RULE, PERIODS, PROJECT_RE, PROJECT_RULE, SCOPES,
                            BudgetsSettings, ScopeBudget, scope_key)
from spotrun.db import session
from spotrun.db.budget_rows import BudgetRow
from spotrun.db.models import utcnow
from spotrun.errors import BadInputError, NotFoundError

TOML = "spotrun.toml"
DATABASE = "database"


@dataclass(frozen=True)
class Origin:
    """Where one effective budget comes from (`spotrun budgets` shows it)."""

    source: str                          # TOML | DATABASE
    set_by: str | None = None            # DATABASE: who set it
    set_at: datetime | None = None       # DATABASE: when (wall clock, UTC)
    over_toml: ScopeBudget | None = None  # DATABASE: the toml's budget it overrides

    def to_dict(self) -> dict[str, Any]:
        """The `source` keys of a `spotrun budgets --json` element."""
        over = self.over_toml
        return {"source": self.source, "set_by": self.set_by, "set_at": self.set_at,
                "overrides_toml": ({"usd": over.usd, "period": over.period}
                                   if over is not None else None)}


@dataclass(frozen=True)
class Effective:
    """The budgets in force and where each comes from (by `scope_key`)."""

    budgets: BudgetsSettings
    origins: dict[str, Origin]


def merge(toml: BudgetsSettings, rows: Iterable[BudgetRow]) -> Effective:
    """The toml's budgets with the database's rows over them (a row wins for its scope and
    name); `allow_owner_override` stays the toml's."""
    scoped: dict[str, dict[str, ScopeBudget]] = {"project": dict(toml.project),
                                                 "owner": dict(toml.owner)}
    origins = {scope_key(sc, n): Origin(TOML) for sc, n, _ in toml.configured()}
    for r in rows:
        if r.scope not in scoped:
            continue   # a later spotrun's scope: not this one's to enforce
        over = scoped[r.scope].get(r.name) if origins.get(scope_key(r.scope, r.name)) else None
        scoped[r.scope][r.name] = ScopeBudget(usd=float(r.usd), period=r.period)  # type: ignore[arg-type]
        origins[scope_key(r.scope, r.name)] = Origin(DATABASE, r.set_by, r.set_at, over)
    merged = replace(toml, project=scoped["project"], owner=scoped["owner"])
    return Effective(merged, origins)


def read_rows(engine: Any) -> list[BudgetRow]:
    """Every budget row (opening a database upgrades it: the table exists)."""
    with session(engine) as s:
        return list(s.exec(select(BudgetRow)))


def effective(settings: Any, engine: Any) -> Effective:
    """The budgets in force now, with their origins (one query)."""
    return merge(settings.budgets, read_rows(engine))


def effective_budgets(settings: Any, engine: Any) -> BudgetsSettings:
    """The budgets in force now: the toml's `[budgets]`, database rows over them."""
    return effective(settings, engine).budgets


# ---------------------------------------------------------------- the one writer

def check_budget(scope: Any, name: Any, usd: Any = None, period: Any = None, *,
                 with_amount: bool = True) -> tuple[str, str, ScopeBudget | None]:
    """(scope, name, budget) from what a user typed, or one BadInputError naming the field."""
    if scope not in SCOPES:
        raise BadInputError(f"unknown scope; allowed: {', '.join(SCOPES)}", field="SCOPE",
                            value=scope)
    pattern, rule = (PROJECT_RE, PROJECT_RULE) if scope == "project" else (OWNER_RE, OWNER_RULE)
    if not isinstance(name, str) or not pattern.match(name):
        raise BadInputError(f"not a valid {scope} name; allowed: {rule}", field="NAME",
                            value=name)
    if not with_amount:
        return scope, name, None
    try:
        amount = float(usd) if not isinstance(usd, bool) else math.nan
    except (TypeError, ValueError):
        amount = math.nan
    if not math.isfinite(amount) or amount <= 0:
        raise BadInputError("must be a number > 0 (USD)", field="--usd", value=usd)
    if period not in PERIODS:
        raise BadInputError(f"unknown period; allowed: {', '.join(PERIODS)}", field="--period",
                            value=period)
    return scope, name, ScopeBudget(usd=amount, period=period)


def set_budget(settings: Any, engine: Any, scope: Any, name: Any, usd: Any, period: Any, *,
               by: str) -> dict[str, Any]:
    """Write (or replace) one budget row after checking every field; `budgets set --json`."""
    scope, name, budget = check_budget(scope, name, usd, period)
    assert budget is not None
    with session(engine) as s:
        row = s.get(BudgetRow, (scope, name))
        before = (row.usd, row.period) if row is not None else None
        if row is None:
            row = BudgetRow(scope=scope, name=name, usd=budget.usd, period=budget.period)
        row.usd, row.period, row.set_by, row.set_at = budget.usd, budget.period, by, utcnow()
        s.add(row)
        s.commit()
    now = effective(settings, engine)
    return _answer(scope, name, now, before=before)


def remove_budget(settings: Any, engine: Any, scope: Any, name: Any, *, by: str
                  ) -> dict[str, Any]:
    """Delete one budget row (the toml's budget of that name, if any, applies again);
    `budgets remove --json`. A budget only spotrun.toml sets is bad input."""
    scope, name, _ = check_budget(scope, name, with_amount=False)
    with session(engine) as s:
        row = s.get(BudgetRow, (scope, name))
        if row is None:
            raise no_row(settings, scope, name)
        before = (row.usd, row.period)
        s.delete(row)
        s.commit()
    return _answer(scope, name, effective(settings, engine), before=before)


def no_row(settings: Any, scope: str, name: str) -> BadInputError:
    """The error of removing a budget no `budgets set` wrote (the toml's, or none)."""
    toml = settings.budgets.project if scope == "project" else settings.budgets.owner
    if name in toml:
        return BadInputError(
            f"budget {scope} {name} is set in spotrun.toml, not by `budgets set`",
            field="NAME", value=name,
            hint="remove it from [budgets] of the server host's spotrun.toml (and restart "
                 "the daemon), or `spotrun budgets set` overrides it")
    return NotFoundError(f"no budget {scope} {name}", field="NAME", value=name,
                         hint="`spotrun budgets` lists them")


def _answer(scope: str, name: str, now: Effective, *, before: tuple[float, str] | None
            ) -> dict[str, Any]:
    """What a set or remove prints: the budget in force now (None: none) and before."""
    key = scope_key(scope, name)
    found = {scope_key(sc, n): b for sc, n, b in now.budgets.configured()}
    b = found.get(key)
    origin = now.origins.get(key)
    return {"scope": scope, "name": name,
            "budget": {"usd": b.usd, "period": b.period} if b is not None else None,
            **(origin.to_dict() if origin is not None else {"source": None}),
            "previous_row": ({"usd": before[0], "period": before[1]}
                             if before is not None else None)}


def change_detail(answer: dict[str, Any]) -> str:
    """A set or remove in one line for the trail: `$300/week (was $200/week)`."""
    def money(b: dict[str, Any] | None) -> str:
        return f"${b['usd']:g}/{b['period']}" if b else "none"
    now = answer["budget"]
    where = f" from {answer['source']}" if now is not None and answer["source"] == TOML else ""
    return f"{money(now)}{where} (row was {money(answer['previous_row'])})"

"""Budgets set through `spotrun budgets set` (locally or through the team server).

One writer, spotrun.budgets.source; the daemon reads the table once per scheduling pass
and merges it over `[budgets]` of spotrun.toml (a row wins for its scope and name).
"""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Field, SQLModel

from spotrun.db.models import UTCDateTime, utcnow


class BudgetRow(SQLModel, table=True):
    """One project or owner budget: at most `usd` per `period` (docs/budgets.md)."""

    __tablename__ = "scope_budget"

    scope: str = Field(primary_key=True)       # "project" | "owner"
    name: str = Field(primary_key=True)
    usd: float
    period: str                                # day | week | month | total
    set_by: str = ""                           # the server's user, or the local OS user
    set_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)   # wall clock

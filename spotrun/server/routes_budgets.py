"""Budget routes: set and remove a project or owner budget (admins; docs/budgets.md).

Reading them is `GET /budgets` (spotrun.server.routes_reads). A change is written to the
state database (spotrun.budgets.source, the one writer) and to the action trail; the
daemon applies it at its next scheduling pass.
"""

from __future__ import annotations

from typing import Any, Callable

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel

from spotrun.budgets.source import change_detail, remove_budget, set_budget
from spotrun.config import scope_key
from spotrun.errors import SpotrunError
from spotrun.db import trail
from spotrun.server.auth import Caller, caller, needs

router = APIRouter()
_DOING = {"budgets set": "setting budgets", "budgets remove": "removing budgets"}


class BudgetBody(BaseModel):
    """PUT /budgets/{scope}/{name}: the amount and period, checked by check_budget (so a
    bad value gets the CLI's message, naming --usd or --period)."""

    usd: Any = None
    period: Any = None


def _change(request: Request, who: Caller, action: str, scope: str, name: str,
            fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Admins only (403, trailed as denied); the change and its trail row (ok or error)."""
    target = scope_key(scope, name)[:200]
    needs(request, who, "admin", _DOING[action], target)

    def row(outcome: str, detail: str) -> None:
        trail.record(request.app.state.engine, user=who.principal.user,
                     role=who.principal.role, action=action, target=target,
                     remote_addr=who.addr, outcome=outcome, detail=detail)
    try:
        out = fn()
    except SpotrunError as exc:
        row("error", str(exc))
        raise
    row("ok", change_detail(out))
    return out


@router.put("/budgets/{scope}/{name}")
def put_budget(request: Request, scope: str, name: str, body: BudgetBody | None = None,
               who: Caller = Depends(caller)) -> Any:
    """`spotrun budgets set SCOPE NAME --usd X --period P --json`."""
    body = body or BudgetBody()
    settings, engine = request.app.state.settings, request.app.state.engine
    return _change(request, who, "budgets set", scope, name, lambda: set_budget(
        settings, engine, scope, name, body.usd, body.period, by=who.principal.user))


@router.delete("/budgets/{scope}/{name}")
def delete_budget(request: Request, scope: str, name: str, who: Caller = Depends(caller)
                  ) -> Any:
    """`spotrun budgets remove SCOPE NAME --json`."""
    settings, engine = request.app.state.settings, request.app.state.engine
    return _change(request, who, "budgets remove", scope, name, lambda: remove_budget(
        settings, engine, scope, name, by=who.principal.user))

"""Read routes: audit, budgets (any role), whoami, and the action trail (admins)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query, Request

from spotrun.contracts import parse_time
from spotrun.server.auth import Caller, caller, needs
from spotrun.server.render import rendered

router = APIRouter()


@router.get("/health")
def health() -> Any:
    """Unauthenticated liveness (load balancers, tests): says nothing about the state."""
    return {"ok": True}


@router.get("/whoami")
def whoami(who: Caller = Depends(caller)) -> Any:
    """The token's user and role."""
    p = who.principal
    return {"user": p.user, "role": p.role, "token_id": p.token_id}


@router.get("/audit")
def audit(request: Request, job: list[str] = Query(default=[]), since: str | None = None,
          until: str | None = None, hindsight: bool = True,
          who: Caller = Depends(caller)) -> Any:
    """`spotrun audit --json` (JOBS as repeated `job`)."""
    result = request.app.state.backend.audit(job, since=parse_time(since, "--since"),
                                             until=parse_time(until, "--until"),
                                             hindsight=hindsight)
    return rendered([a.to_dict() for a in result])


@router.get("/budgets")
def budgets(request: Request, who: Caller = Depends(caller)) -> Any:
    """`spotrun budgets --json`."""
    return rendered(request.app.state.backend.budgets())


@router.get("/trail")
def trail(request: Request, user: str | None = None, since: str | None = None,
          who: Caller = Depends(caller)) -> Any:
    """`spotrun trail --json` (admins only)."""
    needs(request, who, "admin", "reading the trail")
    return rendered(request.app.state.backend.trail(user=user,
                                                    since=parse_time(since, "--since")))

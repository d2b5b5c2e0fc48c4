"""Job routes: status (any role), cancel and resume (members their own jobs, admins any)."""

from __future__ import annotations

from typing import Any, Callable

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from spotrun.db import find_job, session
from spotrun.errors import ForbiddenError, NotFoundError, SpotrunError
from spotrun.db import trail
from spotrun.server.auth import Caller, caller, denied, needs
from spotrun.server.render import rendered

router = APIRouter()


class InterruptBody(BaseModel):
    """POST /jobs/{ref}/interrupt: one node rank (default every node) and the notice."""

    node: int | None = None
    notice_s: float | None = None


class ResumeBody(BaseModel):
    """POST /jobs/{ref}/resume: an optional new, higher budget."""

    budget_usd: float | None = None


@router.get("/jobs")
def jobs(request: Request, events: bool = False, who: Caller = Depends(caller)) -> Any:
    """`spotrun status --json`: without events, the server's shared build (status_cache)."""
    if events:
        return rendered(request.app.state.backend.status(None, events=True))
    return Response(request.app.state.status.body(), media_type="application/json")


@router.get("/jobs/{ref}")
def job(request: Request, ref: str, events: bool = False, who: Caller = Depends(caller)) -> Any:
    """`spotrun status JOB --json`."""
    return rendered(request.app.state.backend.status(ref, events=events))


def _may_act_on(request: Request, who: Caller, action: str, ref: str) -> None:
    """Members act on their own jobs, admins on any; viewers on none (403, trailed)."""
    needs(request, who, "member", action, ref)
    if who.principal.can("admin"):
        return
    with session(request.app.state.engine) as s:
        job = find_job(s, ref)
        owner = job.owner if job is not None else None
    if job is None:
        raise NotFoundError("no such job", field="JOB", value=ref, hint="see `spotrun status`")
    if owner != who.principal.user:
        exc = ForbiddenError(f"job {ref} is {owner}'s; members {action} only their own jobs",
                             field="JOB", value=ref, hint="an admin can")
        denied(request, exc, user=who.principal.user, role=who.principal.role, target=ref)
        raise exc


def _act(request: Request, who: Caller, action: str, ref: str, fn: Callable[[], Any]) -> Any:
    """Run a state change and write its trail row (ok, or error with the message)."""
    def row(outcome: str, detail: str) -> None:
        trail.record(request.app.state.engine, user=who.principal.user,
                     role=who.principal.role, action=action, target=ref,
                     remote_addr=who.addr, outcome=outcome, detail=detail)
    try:
        _may_act_on(request, who, action, ref)
        out = fn()
    except ForbiddenError:
        raise   # trailed as denied
    except SpotrunError as exc:
        row("error", str(exc))
        raise
    row("ok", "")
    return out


@router.post("/jobs/{ref}/cancel")
def cancel(request: Request, ref: str, who: Caller = Depends(caller)) -> Any:
    """`spotrun cancel JOB --json`; the state before the call in X-Spotrun-Was-State."""
    done = _act(request, who, "cancel", ref, lambda: request.app.state.backend.cancel(ref))
    request.app.state.status.changed(done.job["id"])
    return JSONResponse(done.job, headers={"X-Spotrun-Was-State": done.was or ""})


@router.post("/jobs/{ref}/resume")
def resume(request: Request, ref: str, body: ResumeBody | None = None,
           who: Caller = Depends(caller)) -> Any:
    """`spotrun resume JOB --json`."""
    budget = body.budget_usd if body is not None else None
    out = _act(request, who, "resume", ref,
               lambda: request.app.state.backend.resume(ref, budget))
    request.app.state.status.changed(out["id"])
    return out


@router.post("/jobs/{ref}/interrupt")
def interrupt(request: Request, ref: str, body: InterruptBody | None = None,
              who: Caller = Depends(caller)) -> Any:
    """`spotrun interrupt JOB --json`: the provider's interruption, sent by the server (members
    their own jobs, admins any), so a laptop needs no cloud credentials for it either."""
    body = body or InterruptBody()
    done = _act(request, who, "interrupt", ref, lambda: request.app.state.backend.interrupt(
        ref, node=body.node, notice_s=body.notice_s))
    return done.to_dict()

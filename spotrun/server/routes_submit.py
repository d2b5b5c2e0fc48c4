"""Submit and plan through the server: the spec and its workdir's bundle in one streamed
body (spotrun.backends.wire); the bundle is size-capped while it arrives and every member
checked before anything is written; the job's owner is the caller."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from spotrun.backends.local import no_daemon, submitted_dict
from spotrun.backends.wire import HEAD_MAX_BYTES, MB
from spotrun.bundle import check_bundle
from spotrun.config import OWNER_RE, OWNER_RULE, Settings
from spotrun.errors import BadInputError, ForbiddenError, SpotrunError, TooLargeError
from spotrun.jobs import Submission, submit as submit_job, validate_spec_bytes
from spotrun.db import trail
from spotrun.server.auth import Caller, caller, denied, needs

router = APIRouter()


def _too_big(settings: Settings, size_b: int | None) -> TooLargeError:
    limit = settings.server.max_bundle_mb
    what = f"{size_b / MB:.1f} MB" if size_b is not None else "larger"
    return TooLargeError(f"the code bundle is {what}; this server takes at most {limit:g} MB",
                         field="server.max_bundle_mb", value=limit,
                         hint="exclude data and checkpoints from the workdir, or ask the "
                              "server's admin to raise [server] max_bundle_mb")


def _head(line: bytes) -> dict[str, Any]:
    try:
        head = json.loads(line)
    except ValueError:
        head = None
    if not isinstance(head, dict) or not isinstance(head.get("spec"), str):
        raise BadInputError("not a spotrun submission (first line: JSON with the spec)",
                            field="spec")
    return head


async def receive(request: Request, folder: Path) -> tuple[dict[str, Any], Path | None]:
    """The submission's JSON line and its bundle file (None: no bytes after the line),
    refused (413) as soon as the bundle passes `[server] max_bundle_mb`."""
    settings: Settings = request.app.state.settings
    limit = int(settings.server.max_bundle_mb * MB)
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit + HEAD_MAX_BYTES:
        raise _too_big(settings, int(declared))
    buf, head, size = b"", None, 0
    path = folder / "bundle.tar.gz"
    with open(path, "wb") as out:
        async for chunk in request.stream():
            if head is None:
                buf += chunk
                if b"\n" not in buf:
                    if len(buf) > HEAD_MAX_BYTES:
                        raise BadInputError("the submission's first line is too long",
                                            field="spec")
                    continue
                line, _, chunk = buf.partition(b"\n")
                head = _head(line)
            size += len(chunk)
            if size > limit:
                raise _too_big(settings, None)
            out.write(chunk)
    if head is None:
        head = _head(buf)
    return head, (path if size else None)


def _admit(request: Request, who: Caller, owner: str | None, dry_run: bool
           ) -> tuple[str, Path]:
    """The role and owner checks (a refusal writes the trail), then a folder for the upload."""
    if not dry_run:
        needs(request, who, "member", "submit", owner or "")
    job_owner = _owner(request, who, owner)
    return job_owner, Path(tempfile.mkdtemp(prefix="spotrun-upload-"))


def _owner(request: Request, who: Caller, requested: str | None) -> str:
    """The caller, or (admins only) the owner they name; a member naming another is 403."""
    user = who.principal.user
    if not requested or requested == user:
        return user
    if not who.principal.can("admin"):
        exc = ForbiddenError(f"members submit as themselves ({user}); only an admin may "
                             f"name another owner", field="--owner", value=requested)
        denied(request, exc, user=user, role=who.principal.role, target=requested)
        raise exc
    if not OWNER_RE.match(requested):
        raise BadInputError(f"not a valid owner; allowed: {OWNER_RULE}", field="--owner",
                            value=requested)
    return requested


def _validate(request: Request, head: dict[str, Any], bundle: Path | None, owner: str,
              folder: Path) -> Submission:
    if bundle is not None:
        check_bundle(bundle)   # every member, before anything is written
    stand_in = folder / "workdir"   # the spec's workdir lives on the laptop; its bundle here
    stand_in.mkdir()
    return validate_spec_bytes(head["spec"].encode("utf-8"), str(head.get("spec_file") or
                                                                  "spec.yaml"),
                               request.app.state.settings, owner=owner, base_dir=folder,
                               workdir=str(stand_in), history=request.app.state.history,
                               checks=request.app.state.checks)


def _record(request: Request, who: Caller, sub: Submission, bundle: Path | None,
            job_owner: str) -> dict[str, Any]:
    """Record the job with its trail row (one transaction: each write waits its turn for
    SQLite's lock under 20 clients), then its entry in the shared status list."""
    if sub.spec.workdir and bundle is None:
        raise BadInputError("the spec names a workdir but no bundle was sent", field="workdir",
                            hint="submit with the spotrun CLI, which packs it")
    engine = request.app.state.engine
    row = trail.entry(user=who.principal.user, role=who.principal.role, action="submit",
                      target=sub.job_id, remote_addr=who.addr, outcome="ok",
                      detail=f"owner {job_owner}")
    job = submit_job(sub, engine, bundle_file=bundle if sub.spec.workdir else None,
                     with_rows=[row])
    out = {"job": submitted_dict(job), "warnings": list(sub.warnings),
           "note": no_daemon(request.app.state.settings, engine)}
    request.app.state.status.changed(sub.job_id)
    return out


@router.post("/jobs")
async def submit(request: Request, dry_run: bool = False, owner: str | None = None,
                 who: Caller = Depends(caller)) -> Any:
    """`spotrun submit SPEC --json` (`{"job", "warnings", "note"}`), or with dry_run the
    `--dry-run --json` plan (`{"plan", "warnings"}`); members and admins, viewers dry-run."""
    # The event loop serves every client: file-system and database work goes to the pool.
    job_owner, folder = await run_in_threadpool(_admit, request, who, owner, dry_run)
    target = owner or ""
    try:
        head, bundle = await receive(request, folder)
        target = str(head.get("spec_file") or "")
        sub = await run_in_threadpool(_validate, request, head, bundle, job_owner, folder)
        if dry_run:
            from spotrun.planning.plans import dry_run_plan   # lazy: the decision's numpy
            plan = await run_in_threadpool(dry_run_plan, sub, request.app.state.settings)
            return {"plan": plan, "warnings": list(sub.warnings)}
        target = sub.job_id
        out = await run_in_threadpool(_record, request, who, sub, bundle, job_owner)
    except SpotrunError as exc:
        if not dry_run and not isinstance(exc, ForbiddenError):
            await run_in_threadpool(
                trail.record, request.app.state.engine, user=who.principal.user,
                role=who.principal.role, action="submit", target=target,
                remote_addr=who.addr, outcome="error", detail=str(exc))
        raise
    finally:
        await run_in_threadpool(shutil.rmtree, folder, ignore_errors=True)
    return out


class PlanSpec(BaseModel):
    """One spec file of `POST /plan`."""

    spec_file: str
    spec: str


class PlanBody(BaseModel):
    """`POST /plan`: `spotrun plan`'s files and options."""

    specs: list[PlanSpec]
    zones: list[str] = []
    offline: bool = False


@router.post("/plan")
def plan(request: Request, body: PlanBody, who: Caller = Depends(caller)) -> Any:
    """`spotrun plan --json` (always a list); any role: it writes nothing."""
    from spotrun.clouds import spec_catalog_label, spec_types, spec_zones
    from spotrun.planning.plans import naming, plan_json, plan_specs   # lazy: numpy
    from spotrun.spec import parse_spec_bytes
    settings = request.app.state.settings
    several = len(body.specs) > 1
    with tempfile.TemporaryDirectory(prefix="spotrun-plan-") as tmp:
        specs = []
        for one in body.specs:
            try:
                specs.append((one.spec_file, parse_spec_bytes(
                    one.spec.encode("utf-8"), one.spec_file, base_dir=Path(tmp),
                    instance_types=spec_types(settings), zones=spec_zones(settings),
                    catalog=spec_catalog_label(settings), workdir=tmp,
                    clouds=settings.clouds)))
            except SpotrunError as exc:
                raise naming(exc, one.spec_file, several) from exc
        return plan_json(plan_specs(settings, specs, body.zones, body.offline))

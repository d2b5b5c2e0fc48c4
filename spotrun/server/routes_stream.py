"""Streamed reads (any role): a job's logs, followed until the job ends, and a pull's files
as one tar.gz the CLI extracts with the bundle's path checks."""

from __future__ import annotations

import json
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Iterator

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse, StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from spotrun.backends.wire import PULL_SUMMARY
from spotrun.server.auth import Caller, caller

router = APIRouter()
# A follow loop's pace is the server's choice within these bounds (a client asking 0 s
# would make the server poll the database flat out).
POLL_S_RANGE = (0.2, 30.0)


@router.get("/jobs/{ref}/logs")
def logs(request: Request, ref: str, attempt: int | None = None, follow: bool = False,
         poll_s: float = 1.0, json_out: bool = False, who: Caller = Depends(caller)) -> Any:
    """`spotrun logs JOB [--json]`; otherwise NDJSON lines `{"out"|"err": text}`, streamed
    (chunked) and, with follow, ended when the job ends."""
    backend = request.app.state.backend
    if json_out:
        return backend.logs_json(ref, attempt)
    pace = min(max(poll_s, POLL_S_RANGE[0]), POLL_S_RANGE[1])
    chunks = backend.logs(ref, attempt, follow=follow, poll_s=pace)   # checks ref now

    def lines() -> Iterator[bytes]:
        for stream, text in chunks:
            yield (json.dumps({stream: text}) + "\n").encode("utf-8")
    return StreamingResponse(lines(), media_type="application/x-ndjson")


def _pack(request: Request, ref: str, checkpoint: bool, folder: Path) -> Path:
    """Pull into folder/out, then pack it with the summary as the first member."""
    out = folder / "out"
    summary = request.app.state.backend.pull(ref, out, checkpoint=checkpoint, show=False)
    summary["to"] = None   # the client's own folder replaces the server's scratch one
    (folder / PULL_SUMMARY).write_text(json.dumps(summary))
    archive = folder / "pull.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder / PULL_SUMMARY, arcname=PULL_SUMMARY)
        for path in sorted(out.rglob("*")):
            if path.is_file():
                tar.add(path, arcname=path.relative_to(out).as_posix(), recursive=False)
    return archive


@router.get("/jobs/{ref}/pull")
async def pull(request: Request, ref: str, checkpoint: bool = True,
               who: Caller = Depends(caller)) -> Any:
    """What `spotrun pull JOB` writes, as a tar.gz (first member: `pull --json`'s object);
    nothing to pull is the same one-line error as locally."""
    folder = Path(tempfile.mkdtemp(prefix="spotrun-pull-"))
    try:
        archive = await run_in_threadpool(_pack, request, ref, checkpoint, folder)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return FileResponse(archive, media_type="application/gzip",
                        background=BackgroundTask(shutil.rmtree, folder, True))

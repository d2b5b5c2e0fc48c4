"""Pulling a job's outputs and its final checkpoint (exported as a plain state_dict).

Outputs come from `jobs/<job>/outputs/` as listed in `outputs.json` (the agent writes
both); the newest verified checkpoint is exported to `checkpoint/model.pt` (and
`model.safetensors` where installed), which load without spotrun.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

from spotrun import layout
from spotrun.checkpoints import latest_verified
from spotrun.db import job_named, session
from spotrun.errors import BadInputError, ChecksumMismatch, SpotrunError, StoreError
from spotrun.store import open_store
from spotrun.store.base import ObjectStore
from spotrun.store.localfile import file_sha256
from spotrun.store.progress import one_bar, transfer_bar

CHECKPOINT_DIR = "checkpoint"


def _safe_rel(rel: str) -> str:
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise StoreError("unsafe path in outputs.json", field="outputs", value=rel)
    return p.as_posix()



def pull_outputs(store: ObjectStore, job_id: str, dest: Path,
                 progress: Any = None) -> list[dict[str, Any]]:
    """Download every file outputs.json lists into dest, SHA256-checked; what was written.

    `progress(rel, done, total)`, when given, hears every file's bytes as they arrive.
    """
    key = layout.outputs_index_key(job_id)
    if not store.exists(key):
        return []
    files = json.loads(store.get_bytes(key)).get("files", {})
    out = []
    for rel, meta in sorted(files.items()):
        rel = _safe_rel(rel)
        target = dest / rel
        store.get_file(f"{layout.outputs_prefix(job_id)}/{rel}", target,
                       progress=(lambda d, t, rel=rel: progress(rel, d, t)) if progress else None)
        if file_sha256(target) != meta.get("sha256"):
            raise ChecksumMismatch("sha256 differs from outputs.json", field="outputs", value=rel)
        out.append({"path": rel, "size": meta.get("size"), "attempt": meta.get("attempt")})
    return out


def pull_checkpoint(checkpoint_store: ObjectStore, dest: Path) -> dict[str, Any] | None:
    """Export the newest verified checkpoint into dest/checkpoint; None if there is none."""
    manifest = latest_verified(checkpoint_store)
    if manifest is None:
        return None
    info: dict[str, Any] = {"name": manifest.name, "step": manifest.step,
                            "kind": manifest.extra.get("kind"), "files": []}
    try:
        from spotrun.integrations.export import export   # lazy: optional dependency (torch)
    except ImportError as exc:   # torch is not installed here
        info["skipped"] = f"cannot export without torch ({exc.name})"
        return info
    folder = dest / CHECKPOINT_DIR
    info["files"] = [f"{CHECKPOINT_DIR}/{n}" for n in export(checkpoint_store, manifest, folder)]
    return info


def _pull_with_progress(store: ObjectStore, job_id: str, dest: Path, *,
                        show: bool) -> list[dict[str, Any]]:
    """pull_outputs with a rich progress bar on a terminal (large files take a while)."""
    from rich.console import Console
    console = Console(stderr=True)
    if not show or not console.is_terminal:
        return pull_outputs(store, job_id, dest)
    with transfer_bar(console) as bar:
        tasks: dict[str, Any] = {}

        def on_bytes(rel: str, done: int, total: int) -> None:
            if rel not in tasks:
                tasks[rel] = bar.add_task(rel, total=total or None)
            bar.update(tasks[rel], completed=done)
        return pull_outputs(store, job_id, dest, progress=on_bytes)


def pull_into(engine: Any, job_ref: str, dest: Path | None, *, checkpoint: bool,
              show: bool = False) -> dict[str, Any]:
    """Pull a job's outputs (and its checkpoint's export) into dest (None: ./<job id>);
    returns what `pull --json` prints (also the team server's pull, into a scratch folder)."""
    with session(engine) as s:
        job = job_named(s, job_ref)
        job_id, store_uri, ckpt_uri, state = job.id, job.store_uri, job.checkpoint_uri, job.state
    dest = dest if dest is not None else Path.cwd() / job_id
    if dest.exists() and not dest.is_dir():
        raise BadInputError("must be a folder (it is a file)", field="--to", value=str(dest))
    dest.mkdir(parents=True, exist_ok=True)
    outputs = _pull_with_progress(open_store(store_uri), job_id, dest, show=show)
    ckpt = pull_checkpoint(open_store(ckpt_uri), dest) if checkpoint else None
    if not outputs and ckpt is None:
        raise SpotrunError("nothing to pull yet: no outputs and no checkpoint", field="JOB",
                           value=job_id, hint="outputs come when the command ends; "
                           "list them under `outputs:` in the job spec")
    return {"job": job_id, "state": state.value, "to": str(dest.resolve()),
            "outputs": outputs, "checkpoint": ckpt}


def download_bar(*, show: bool) -> Any:
    """A progress callback (bytes done, total) drawing a remote pull's download on
    stderr's terminal; None off a terminal (local pull draws one bar per file itself)."""
    from rich.console import Console
    console = Console(stderr=True)
    return one_bar(console, "downloading", show=show and console.is_terminal)

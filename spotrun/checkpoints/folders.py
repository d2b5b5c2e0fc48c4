"""Torch-free checkpoint layout: write, verify, list, find latest, retain.

A checkpoint is a folder `ckpt-<step:012d>/` under the job's checkpoint prefix.
Data files are written first; `MANIFEST.json` (sizes and SHA256 of every file)
last, so a checkpoint is visible only once complete. The agent and daemon use
this module without importing torch; `spotrun.torch` builds on it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from spotrun.checkpoints import jobfiles
from spotrun.errors import ChecksumMismatch, ObjectNotFound, StoreError
from spotrun.store.base import ObjectStore

MANIFEST = "MANIFEST.json"
INDEX = "files.json"   # the job's persisted files (spotrun/jobfiles.py), when a checkpoint has them
FORMAT = 1
_NAME_RE = re.compile(r"^ckpt-(\d{12})$")
log = logging.getLogger("spotrun.checkpoints")   # one logger for the package


@dataclass(frozen=True)
class Manifest:
    """What a complete checkpoint holds."""

    name: str
    step: int
    created: str
    files: dict[str, dict[str, Any]]        # name -> {"size": int, "sha256": hex}
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        """Serialised manifest."""
        return json.dumps({"format": FORMAT, "step": self.step, "created": self.created,
                           "files": self.files, "extra": self.extra}, sort_keys=True).encode()


def checkpoint_name(step: int) -> str:
    """Folder name of the checkpoint at step."""
    return f"ckpt-{step:012d}"


def sha256_hex(data: bytes) -> str:
    """SHA256 hex digest of data."""
    return hashlib.sha256(data).hexdigest()


def write_manifest(store: ObjectStore, step: int, files: dict[str, dict[str, Any]],
                   extra: dict[str, Any] | None = None) -> Manifest:
    """Publish a checkpoint whose data files are already in the store (the last write)."""
    name = checkpoint_name(step)
    m = Manifest(name=name, step=step, created=datetime.now(timezone.utc).isoformat(),
                 files=files, extra=extra or {})
    key = f"{name}/{MANIFEST}"
    # Conditional put: publishing is a create, so a late or duplicate writer of the same step
    # cannot silently replace a manifest another writer made.
    if not store.put_if_absent(key, m.to_json()):
        try:
            existing = read_manifest(store, name)
        except ObjectNotFound:
            existing = None     # deleted meanwhile (retention): publish ours
        except StoreError as exc:
            # A manifest that does not parse describes nothing: ours replaces it, else every
            # later save of this step would fail on it forever.
            log.warning("replacing corrupt manifest of %s: %s", name, exc)
            existing = None
        if existing is not None and existing.files == files:
            return existing
        # The same step was saved again with other bytes: its files now match this manifest.
        store.put_bytes(key, m.to_json())
    return m


def put_checkpoint_files(store: ObjectStore, step: int, blobs: dict[str, bytes],
                         extra: dict[str, Any] | None = None) -> Manifest:
    """Write each blob, then the manifest: a complete checkpoint in one call."""
    name = checkpoint_name(step)
    files: dict[str, dict[str, Any]] = {}
    for fname, data in blobs.items():
        store.put_bytes(f"{name}/{fname}", data)
        files[fname] = {"size": len(data), "sha256": sha256_hex(data)}
    return write_manifest(store, step, files, extra)


def read_manifest(store: ObjectStore, name: str) -> Manifest:
    """Parse one checkpoint's manifest; raises ObjectNotFound or StoreError."""
    raw = store.get_bytes(f"{name}/{MANIFEST}")
    try:
        d = json.loads(raw)
        return Manifest(name=name, step=int(d["step"]), created=str(d["created"]),
                        files=dict(d["files"]), extra=dict(d.get("extra") or {}))
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"corrupt manifest: {exc}", field="checkpoint", value=name) from None


TORCH_KIND = "spotrun.torch/1"     # written by spotrun.torch.storage
TORCH_META = "meta.json"


def torch_shard_name(i: int) -> str:
    """The i-th data shard of a spotrun.torch checkpoint."""
    return f"data-{i:03d}.bin"


def check_file(name: str, fname: str, expected: dict[str, Any], size: int,
               sha256: str | None) -> None:
    """One file against its manifest entry (sha256=None: not read yet); raises ChecksumMismatch."""
    if size != int(expected["size"]):
        raise ChecksumMismatch(f"size {size} != {expected['size']}", field="checkpoint",
                               value=f"{name}/{fname}")
    if sha256 is not None and sha256 != expected["sha256"]:
        raise ChecksumMismatch("sha256 differs", field="checkpoint", value=f"{name}/{fname}")


def check_layout(m: Manifest, meta: dict[str, Any] | None = None) -> list[str]:
    """The shape rules of a checkpoint's kind; the data files in read order.

    For spotrun.torch checkpoints: meta.json and every shard are in the manifest and the
    shards add up to the buffer size meta.json (when given) and the manifest state.
    Other kinds (a user's own files): every listed file, in name order.
    """
    if m.extra.get("kind") != TORCH_KIND:
        return sorted(m.files)
    if TORCH_META not in m.files:
        raise ChecksumMismatch("meta.json not in manifest", field="checkpoint", value=m.name)
    try:
        shards = [torch_shard_name(i) for i in range(int(m.extra.get("shards", 1)))]
        nbytes = int(meta["nbytes"]) if meta is not None else int(m.extra["nbytes"])
        total = 0
        for fname in shards:
            if fname not in m.files:
                raise ChecksumMismatch("shard not in manifest", field="checkpoint",
                                       value=f"{m.name}/{fname}")
            total += int(m.files[fname]["size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreError(f"corrupt manifest: {exc}", field="checkpoint", value=m.name) from None
    if total != nbytes or ("nbytes" in m.extra and int(m.extra["nbytes"]) != nbytes):
        raise ChecksumMismatch(f"shards hold {total} bytes, meta says {nbytes}",
                               field="checkpoint", value=m.name)
    return shards


def verify(store: ObjectStore, name: str, *, deep: bool = True) -> Manifest:
    """Check layout and every file's size (and SHA256 when deep); raises ChecksumMismatch.

    With deep=True this is exactly what a restore checks (spotrun.torch.storage reads data
    through the same check_file / check_layout), so a checkpoint that verifies here is the
    one a job resumes from.
    """
    m = read_manifest(store, name)
    listed = {o.key.rsplit("/", 1)[-1]: o.size for o in store.list(f"{name}/")}
    meta_doc = None
    for fname, meta in sorted(m.files.items()):
        size = listed.get(fname)
        if size is None:
            raise ChecksumMismatch("file missing", field="checkpoint", value=f"{name}/{fname}")
        check_file(name, fname, meta, size, None)
        if deep:
            data = store.get_bytes(f"{name}/{fname}")
            check_file(name, fname, meta, len(data), sha256_hex(data))
            if fname == TORCH_META and m.extra.get("kind") == TORCH_KIND:
                try:
                    meta_doc = json.loads(data)
                except ValueError as exc:
                    raise StoreError(f"corrupt meta.json: {exc}", field="checkpoint",
                                     value=name) from None
    check_layout(m, meta_doc)
    if INDEX in m.files:
        # The job's persisted files come back with the weights, or this checkpoint is no resume.
        index = jobfiles.read_index(store, name)
        if index is not None:
            jobfiles.check_index(store, name, index)
    return m


_VERIFIED: dict[tuple[Any, ...], Manifest] = {}
_VERIFIED_MAX = 256


def resume_point(store: ObjectStore) -> Manifest | None:
    """The checkpoint a job resumes from: the newest that verifies in full (sizes, SHA256,
    layout), as the agent and the training library judge it. The daemon calls this for the
    resume step it shows, so `status` names the step the job really resumes from.

    A verdict is remembered per manifest and listing (same bytes, same sizes), so the daemon
    reads a checkpoint's data once, not at every launch.
    """
    for name in reversed(list_complete(store)):
        try:
            raw = store.get_bytes(f"{name}/{MANIFEST}")
            sizes = tuple((o.key, o.size) for o in store.list(f"{name}/"))
            if any(key.endswith("/" + INDEX) for key, _ in sizes):
                # Its persisted files are part of the verdict: a lost blob must show.
                sizes += tuple((o.key, o.size) for o in store.list(f"{jobfiles.BLOBS}/"))
        except (ObjectNotFound, StoreError) as exc:
            log.warning("skipping checkpoint %s: %s", name, exc)
            continue
        key = (store.uri, name, sha256_hex(raw), sizes)
        if key in _VERIFIED:
            return _VERIFIED[key]
        try:
            m = verify(store, name, deep=True)
        except (ChecksumMismatch, ObjectNotFound, StoreError) as exc:
            log.warning("skipping checkpoint %s: %s", name, exc)
            continue
        if len(_VERIFIED) >= _VERIFIED_MAX:
            _VERIFIED.pop(next(iter(_VERIFIED)))
        _VERIFIED[key] = m
        return m
    return None


def list_names(store: ObjectStore) -> list[str]:
    """Checkpoint folder names present (complete or not), oldest first."""
    names = set()
    for o in store.list("ckpt-"):
        top = o.key.split("/", 1)[0]
        if _NAME_RE.match(top):
            names.add(top)
    return sorted(names)


def list_complete(store: ObjectStore) -> list[str]:
    """Names of checkpoints that have a manifest, oldest first (not verified)."""
    return [n for n in list_names(store) if store.exists(f"{n}/{MANIFEST}")]


def latest_verified(store: ObjectStore, *, deep: bool = True) -> Manifest | None:
    """The newest checkpoint whose manifest verifies; partial or corrupt ones are skipped."""
    for name in reversed(list_complete(store)):
        try:
            return verify(store, name, deep=deep)
        except (ChecksumMismatch, ObjectNotFound, StoreError) as exc:
            log.warning("skipping checkpoint %s: %s", name, exc)
    return None


def apply_retention(store: ObjectStore, keep: int) -> list[str]:
    """Delete all but the newest `keep` complete checkpoints, and stale partial ones.

    The newest verified checkpoint is never deleted, even if newer complete ones
    exist that fail verification; nor is one whose own files a kept checkpoint's persisted
    files reference. Persisted-file blobs only deleted checkpoints listed go too.
    Returns the deleted names.
    """
    keep = max(1, keep)
    complete = list_complete(store)
    newest_ok = latest_verified(store, deep=False)
    keep_set = set(complete[-keep:])
    if newest_ok is not None:
        keep_set.add(newest_ok.name)
    indexes = {name: _index_or_none(store, name) for name in complete}
    for name in list(keep_set):
        keep_set |= _referenced(indexes.get(name)) & set(complete)
    newest_complete_step = _step(complete[-1]) if complete else -1
    deleted = []
    for name in list_names(store):
        partial = name not in complete
        # A partial folder newer than every complete one may be a save in flight.
        if name in keep_set or (partial and _step(name) > newest_complete_step):
            continue
        # Manifest first, so a half-deleted checkpoint is never mistaken for complete.
        store.delete(f"{name}/{MANIFEST}")
        for o in store.list(f"{name}/"):
            store.delete(o.key)
        deleted.append(name)
    _drop_blobs(store, [indexes.get(n) for n in deleted], [indexes.get(n) for n in keep_set])
    return deleted


def _index_or_none(store: ObjectStore, name: str) -> dict[str, Any] | None:
    try:
        return jobfiles.read_index(store, name)
    except StoreError as exc:
        log.warning("unreadable %s in %s: %s", INDEX, name, exc)
        return None


def _referenced(index: dict[str, Any] | None) -> set[str]:
    return jobfiles.checkpoints_of(index) if index else set()


def _drop_blobs(store: ObjectStore, gone: list[Any], kept: list[Any]) -> None:
    """Delete the blobs only deleted checkpoints listed (a save in flight lists what the newest kept
    one does, or sends its own blobs after this)."""
    dead = set().union(*(jobfiles.blobs_of(i) for i in gone if i))
    if not dead:
        return
    live = set().union(*(jobfiles.blobs_of(i) for i in kept if i))
    for sha in sorted(dead - live):
        store.delete(jobfiles.blob_key(sha))


def checkpoint_step(name: str | None) -> int:
    """The step a checkpoint folder name holds (0 for none: a fresh start)."""
    return _step(name) if name and _NAME_RE.match(name) else 0


def _step(name: str) -> int:
    m = _NAME_RE.match(name)
    return int(m.group(1)) if m else -1

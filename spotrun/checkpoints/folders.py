"""The checkpoint folders of a job's store: listed, verified (files and persisted job files),
the one a job resumes from, and retention. The agent and daemon use this package without
importing torch; `spotrun.torch` builds on it."""

from __future__ import annotations

import json
import logging
from typing import Any

from spotrun.checkpoints import jobfiles
from spotrun.checkpoints.manifests import (MANIFEST, NAME_RE, TORCH_KIND, TORCH_META, Manifest,
                                           check_file, check_layout, read_manifest, sha256_hex,
                                           step_of)
from spotrun.errors import ChecksumMismatch, ObjectNotFound, StoreError
from spotrun.store.base import ObjectStore

INDEX = jobfiles.INDEX   # the job's persisted files, when a checkpoint has them
log = logging.getLogger("spotrun.checkpoints")   # one logger for the package


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
        if NAME_RE.match(top):
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
    newest_complete_step = step_of(complete[-1]) if complete else -1
    deleted = []
    for name in list_names(store):
        partial = name not in complete
        # A partial folder newer than every complete one may be a save in flight.
        if name in keep_set or (partial and step_of(name) > newest_complete_step):
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

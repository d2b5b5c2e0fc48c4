"""Copying one checkpoint from a store to another: a job that moves cloud takes its resume
checkpoint along (issue 43), so the next attempt resumes from the destination store exactly as
it would have from the source.

What moves is everything a resume reads: the checkpoint's data files, its persisted job files
(`files.json` and the content-addressed blobs under `files/` it lists), and every earlier
checkpoint whose own files the index references, whole and with its manifest, because a
restore reads that checkpoint's manifest for the referenced file's SHA256. Each object's
bytes are hashed as they come from the source and compared with what its manifest (or, for a
blob, its key) says before anything is written; each `MANIFEST.json` goes last, the asked-for
checkpoint's after every other, so a reader of the destination never sees a checkpoint that is
not complete.

A copy that is killed and run again keeps what it already wrote. Objects of the right size are
kept only where they are known to be this save's bytes: a blob (its key is its hash), a folder
whose manifest in the destination is the source's, or a folder holding the journal
(`COPYING.json`) that a copy of this same manifest wrote before its first object. Any other
file already in the folder (a partial save the job left in that store during an earlier stay,
same sizes but other bytes) is deleted first and copied anew.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spotrun.checkpoints.folders import verify
from spotrun.checkpoints.jobfiles import BLOBS, INDEX, blob_key
from spotrun.checkpoints.manifests import MANIFEST, NAME_RE, check_file, sha256_hex
from spotrun.errors import ChecksumMismatch, ObjectNotFound, StoreError
from spotrun.store.base import ObjectStore, ProgressFn
from spotrun.store.localfile import file_sha256
from spotrun.store.progress import ByteTally

WORKERS = 4                        # a checkpoint is many 64 MiB shards: a few in flight at once
LARGE_OBJECT_BYTES = 64 << 20      # bigger objects go through a temp file, not memory
JOURNAL = "COPYING.json"           # in a folder being copied; deleted once its manifest is in
log = logging.getLogger("spotrun.checkpoints")   # one logger for the package


@dataclass(frozen=True)
class CopyReport:
    """What one copy_checkpoint call did."""

    name: str
    src_uri: str
    dst_uri: str
    objects_copied: int
    objects_skipped: int
    bytes_copied: int
    bytes_total: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON-ready values."""
        return asdict(self)


@dataclass(frozen=True)
class _Object:
    """One object to copy: its key, size and the SHA256 its bytes must have."""

    key: str
    size: int
    sha256: str
    data: bytes | None = None      # already read from the source and checked (files.json)


@dataclass
class _Folder:
    """One checkpoint of the copy, as the source holds it."""

    name: str
    manifest: bytes                              # the exact bytes, written last
    files: dict[str, _Object]
    blobs: dict[str, int] = field(default_factory=dict)        # sha256 -> size
    own_files: set[tuple[str, str]] = field(default_factory=set)   # (checkpoint, file) parts
    references: set[str] = field(default_factory=set)  # the other checkpoints those are in

    @property
    def journal(self) -> bytes:
        """What this folder's journal holds: the manifest the objects under it belong to."""
        return json.dumps({"manifest_sha256": sha256_hex(self.manifest)}).encode()


def copy_checkpoint(src: ObjectStore, dst: ObjectStore, name: str, *,
                    progress: ProgressFn | None = None, workers: int = WORKERS) -> CopyReport:
    """Copy checkpoint `name` and all its resume needs from src to dst, verified, manifest last."""
    t0 = time.monotonic()
    folders = _closure(src, name)
    todo, skipped, publish = _plan(dst, folders)
    copy_bytes = sum(o.size for o in todo) + sum(len(f.manifest) for f in publish)
    skipped_bytes = sum(o.size for o in skipped)
    tally = ByteTally(progress or _ignore, copy_bytes + skipped_bytes)
    tally.done = skipped_bytes
    tally.progress(tally.done, tally.total)
    if todo:
        _copy_all(src, dst, todo, tally, workers)
    for folder in publish:   # the asked-for checkpoint is last in `folders`, so published last
        key = f"{folder.name}/{MANIFEST}"
        dst.put_bytes(key, folder.manifest)
        tally.part(key)(len(folder.manifest), len(folder.manifest))
        dst.delete(f"{folder.name}/{JOURNAL}")
    _verify_or_withdraw(dst, folders, publish)
    report = CopyReport(name=name, src_uri=src.uri, dst_uri=dst.uri,
                        objects_copied=len(todo) + len(publish), objects_skipped=len(skipped),
                        bytes_copied=copy_bytes, bytes_total=tally.total,
                        seconds=time.monotonic() - t0)
    log.info("copied %s from %s to %s: %d objects (%d bytes) in %.1f s, %d already there",
             name, src.uri, dst.uri, report.objects_copied, report.bytes_copied,
             report.seconds, report.objects_skipped)
    return report


def _ignore(_done: int, _total: int) -> None:
    pass


def _closure(src: ObjectStore, name: str) -> list[_Folder]:
    """The checkpoint and every earlier one its persisted files reference (theirs too), oldest
    first and `name` last."""
    found: dict[str, _Folder] = {}
    todo = [name]
    while todo:
        current = todo.pop()
        if current not in found:
            found[current] = _read_folder(src, current)
            todo.extend(found[current].references)
    earlier = sorted(n for n in found if n != name)
    return [found[n] for n in earlier] + [found[name]]


def _read_folder(src: ObjectStore, name: str) -> _Folder:
    """One checkpoint's manifest and, when it has one, its files.json (checked, then parsed)."""
    if not NAME_RE.match(name):
        raise StoreError("not a checkpoint name", field="checkpoint", value=name)
    raw = src.get_bytes(f"{name}/{MANIFEST}")
    try:
        files = {fname: _Object(f"{name}/{fname}", int(e["size"]), str(e["sha256"]))
                 for fname, e in json.loads(raw)["files"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StoreError(f"corrupt manifest: {exc}", field="checkpoint", value=name) from None
    folder = _Folder(name, raw, files)
    if INDEX in files:
        entry = files[INDEX]
        data = src.get_bytes(entry.key)
        _check(entry, data)
        files[INDEX] = _Object(entry.key, entry.size, entry.sha256, data)
        _read_index(folder, data)
    return folder


def _read_index(folder: _Folder, data: bytes) -> None:
    """The blobs and checkpoints' own files a checkpoint's files.json lists."""
    try:
        for entry in json.loads(data)["files"].values():
            for part in entry.get("parts", []):
                if "blob" in part:
                    folder.blobs[str(part["blob"])] = int(part["size"])
                else:
                    folder.own_files.add((str(part["ckpt"]), str(part["file"])))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StoreError(f"corrupt {INDEX}: {exc}", field="checkpoint",
                         value=folder.name) from None
    folder.references = {ckpt for ckpt, _ in folder.own_files} - {folder.name}


def _plan(dst: ObjectStore, folders: list[_Folder]
          ) -> tuple[list[_Object], list[_Object], list[_Folder]]:
    """What to copy, what dst already holds, and whose manifest to write (in that order)."""
    todo: list[_Object] = []
    skipped: list[_Object] = []
    publish: list[_Folder] = []
    by_name = {f.name: f for f in folders}
    for ckpt, fname in sorted(set().union(*(f.own_files for f in folders))):
        # A part naming a file its checkpoint's manifest lacks can be neither checked nor
        # restored: said before anything is written.
        if fname not in by_name[ckpt].files:
            raise ChecksumMismatch("persisted file's checkpoint copy not in its manifest",
                                   field="checkpoint", value=f"{ckpt}/{fname}")
    for folder in folders:
        listed = {o.key: o.size for o in dst.list(f"{folder.name}/")}
        trusted = _trusted(dst, folder, listed)
        for obj in folder.files.values():
            (skipped if trusted and listed.get(obj.key) == obj.size else todo).append(obj)
        if trusted and f"{folder.name}/{MANIFEST}" in listed:
            skipped.append(_Object(f"{folder.name}/{MANIFEST}", len(folder.manifest),
                                   sha256_hex(folder.manifest)))
            if f"{folder.name}/{JOURNAL}" in listed:   # left by a copy killed after publishing
                dst.delete(f"{folder.name}/{JOURNAL}")
        else:
            publish.append(folder)
    # Content-addressed: a blob of the right size under its hash is that blob, whoever wrote it.
    blobs_listed = {o.key: o.size for o in dst.list(f"{BLOBS}/")}
    wanted = {sha: size for f in folders for sha, size in f.blobs.items()}
    for sha, size in sorted(wanted.items()):
        obj = _Object(blob_key(sha), size, sha)
        (skipped if blobs_listed.get(obj.key) == size else todo).append(obj)
    return todo, skipped, publish


def _trusted(dst: ObjectStore, folder: _Folder, listed: dict[str, int]) -> bool:
    """Whether what dst holds under the folder is this save's bytes; when not, empties it
    (manifest first, so no reader trusts it meanwhile) and writes the journal."""
    manifest_key, journal_key = f"{folder.name}/{MANIFEST}", f"{folder.name}/{JOURNAL}"
    if manifest_key in listed:
        if _get_or_none(dst, manifest_key) == folder.manifest:
            return True
    elif journal_key in listed and _get_or_none(dst, journal_key) == folder.journal:
        return True
    if listed:
        log.warning("%s in %s holds another save of that step: replaced by the copy",
                    folder.name, dst.uri)
    if manifest_key in listed:
        dst.delete(manifest_key)
    for key in sorted(listed):
        if key != manifest_key:
            dst.delete(key)
    dst.put_bytes(journal_key, folder.journal)
    return False


def _get_or_none(store: ObjectStore, key: str) -> bytes | None:
    try:
        return store.get_bytes(key)
    except ObjectNotFound:
        return None


def _copy_all(src: ObjectStore, dst: ObjectStore, todo: list[_Object], tally: ByteTally,
              workers: int) -> None:
    """Copy the objects, a few at a time; the first error stops the rest and is raised."""
    # Largest first: the pool's tail is then small objects, not one lone big one.
    order = sorted(todo, key=lambda o: -o.size)
    with tempfile.TemporaryDirectory(prefix="spotrun-copy-") as tmp, \
            ThreadPoolExecutor(max(1, workers), thread_name_prefix="copy") as pool:
        futures = [pool.submit(_copy_one, src, dst, obj, tally.part(obj.key), Path(tmp))
                   for obj in order]
        try:
            for future in as_completed(futures):
                future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def _copy_one(src: ObjectStore, dst: ObjectStore, obj: _Object, report: ProgressFn,
              tmp: Path) -> None:
    """One object: read, check its SHA256, then write; reads and writes each count half."""
    halves = _Halves(obj.size, report)
    if obj.data is not None:
        dst.put_bytes(obj.key, obj.data)
    elif obj.size <= LARGE_OBJECT_BYTES:
        data = src.get_bytes(obj.key, progress=halves.read)
        _check(obj, data)
        dst.put_bytes(obj.key, data)
    else:
        path = tmp / obj.sha256
        try:
            src.get_file(obj.key, path, progress=halves.read)
            _check(obj, None, path)
            if dst.put_file(obj.key, path, progress=halves.written) != obj.sha256:
                raise ChecksumMismatch("temp copy changed before its upload", field="key",
                                       value=obj.key)
        finally:
            path.unlink(missing_ok=True)
    halves.read(obj.size, obj.size)
    halves.written(obj.size, obj.size)


def _check(obj: _Object, data: bytes | None, path: Path | None = None) -> None:
    """The bytes read are the ones the manifest (or the blob's key) names."""
    folder, fname = obj.key.rsplit("/", 1)
    if data is not None:
        size, sha = len(data), sha256_hex(data)
    else:
        assert path is not None
        size, sha = path.stat().st_size, file_sha256(path)
    check_file(folder, fname, {"size": obj.size, "sha256": obj.sha256}, size, sha)


class _Halves:
    """One object's progress: its read and its write each move half of its bytes."""

    def __init__(self, size: int, report: ProgressFn) -> None:
        self.size, self.report = size, report
        self.read_bytes = self.written_bytes = 0

    def read(self, done: int, _total: int) -> None:
        """Bytes read from the source so far."""
        self.read_bytes = max(self.read_bytes, min(done, self.size))
        self.report((self.read_bytes + self.written_bytes) // 2, self.size)

    def written(self, done: int, _total: int) -> None:
        """Bytes written to the destination so far."""
        self.written_bytes = max(self.written_bytes, min(done, self.size))
        self.report((self.read_bytes + self.written_bytes) // 2, self.size)


def _verify_or_withdraw(dst: ObjectStore, folders: list[_Folder],
                        published: list[_Folder]) -> None:
    """Every copied checkpoint verifies in dst (sizes, layout, persisted files); if one does
    not, the manifests this copy wrote are withdrawn so no reader resumes from them."""
    try:
        for folder in folders:
            verify(dst, folder.name, deep=False)
    except StoreError:
        for folder in reversed(published):   # the asked-for checkpoint first
            dst.delete(f"{folder.name}/{MANIFEST}")
        raise


__all__ = ["CopyReport", "LARGE_OBJECT_BYTES", "WORKERS", "copy_checkpoint"]

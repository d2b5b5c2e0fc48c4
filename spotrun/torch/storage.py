"""Write a snapshot to the store as a checkpoint, and read one back verified.

Layout inside `ckpt-<step:012d>/`: `data-NNN.bin` shards of the flat buffer
(so a write can be abandoned between shards and S3 gets moderate PUTs), then
`meta.json` (structure and tensor slots), then `MANIFEST.json` last, through
`spotrun.checkpoints.write_manifest`.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import torch

from spotrun.checkpoints import (INDEX, TORCH_KIND, TORCH_META, Manifest, check_file, check_layout,
                                 checkpoint_name, read_manifest, torch_shard_name,
                                 write_manifest)
from spotrun.errors import CheckpointError, ObjectNotFound, StoreError
from spotrun.store.base import ObjectStore, ProgressFn, StoreFeature
from spotrun.store.progress import ByteTally
from spotrun.torch.snapshot import Snapshot

SHARD_BYTES = 64 * 1024 * 1024
WRITERS = 4          # shards written at once
READ_CHUNK = 4 << 20  # read-then-hash slice: small enough to stay in cache
READERS = max(1, min(8, 2 * (os.cpu_count() or 1)))   # shards read and hashed at once
META = TORCH_META
KIND = TORCH_KIND


class Abandoned(CheckpointError):
    """A persist was told to stop before its manifest was written."""


def _shard_name(i: int) -> str:
    return torch_shard_name(i)


def _payload(store: ObjectStore, view: memoryview) -> Any:
    # A store that takes any buffer gets the snapshot's own memory; others (boto3) get bytes.
    return view if StoreFeature.BUFFER_WRITES in store.features else bytes(view)


def write_snapshot(store: ObjectStore, snap: Snapshot, *, extra: dict[str, Any] | None = None,
                   cancel: threading.Event | None = None,
                   progress: Callable[[int], None] | None = None,
                   shard_bytes: int = SHARD_BYTES, writers: int = WRITERS,
                   job_files: Callable[[str], dict[str, Any]] | None = None) -> Manifest:
    """Write data shards, then meta.json, then the manifest; raises Abandoned on cancel.

    `job_files(name)` writes the job's persisted files (spotrun/jobfiles.py) into the
    checkpoint before its manifest and returns the index's manifest entry.
    """
    snap.wait_ready()
    name = checkpoint_name(snap.step)
    nshards = max(1, -(-snap.nbytes // shard_bytes))
    done = [0]
    lock = threading.Lock()

    def one(i: int) -> tuple[str, dict[str, Any]]:
        if cancel is not None and cancel.is_set():
            raise Abandoned("persist abandoned", field="checkpoint", value=name)
        part = snap.data[i * shard_bytes:(i + 1) * shard_bytes]
        digest = _sha(part)
        store.put_bytes(f"{name}/{_shard_name(i)}", _payload(store, part))
        with lock:
            done[0] += len(part)
            if progress is not None:
                progress(done[0])
        return _shard_name(i), {"size": len(part), "sha256": digest}

    # Shards go out in parallel (hashlib and file/socket writes drop the GIL); the
    # manifest still comes last, so a checkpoint is never visible half-written.
    with ThreadPoolExecutor(max_workers=max(1, writers), thread_name_prefix="spotrun-put") as pool:
        futures = [pool.submit(one, i) for i in range(nshards)]
        try:
            files = dict(f.result() for f in futures)
        except BaseException:
            for f in futures:
                f.cancel()
            raise
    meta = json.dumps(snap.meta(), separators=(",", ":")).encode()
    store.put_bytes(f"{name}/{META}", meta)
    files[META] = {"size": len(meta), "sha256": hashlib.sha256(meta).hexdigest()}
    if job_files is not None:
        files[INDEX] = job_files(name)
    if cancel is not None and cancel.is_set():
        raise Abandoned("persist abandoned", field="checkpoint", value=name)
    return write_manifest(store, snap.step, files,
                          {"kind": KIND, "nbytes": snap.nbytes, "shards": nshards, **(extra or {})})


def _sha(data: Any) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_into(store: ObjectStore, key: str, dest: memoryview,
               progress: ProgressFn | None = None) -> int:
    """Read an object into dest; returns its size (more than len(dest) means too long)."""
    if StoreFeature.LOCAL_PATH in store.features:
        # Straight from the file into the restore buffer: no intermediate bytes object.
        path = store.local_path(key)
        try:
            size = path.stat().st_size
            if size != len(dest):
                return size
            with open(path, "rb", buffering=0) as f:
                got = 0
                while got < size:
                    n = f.readinto(dest[got:])
                    if not n:
                        break
                    got += n
                return got
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFound("no such object", field="key", value=key) from None
    data = store.get_bytes(key, progress=progress)
    if len(data) == len(dest):
        dest[:] = data
    return len(data)


def _read_hashed(store: ObjectStore, key: str, dest: memoryview,
                 progress: ProgressFn | None = None) -> tuple[int, str | None]:
    """Read an object into dest and hash it; (size, sha256 hex, None if the size is wrong)."""
    if StoreFeature.LOCAL_PATH not in store.features:
        got = _read_into(store, key, dest, progress)
        return got, (_sha(dest) if got == len(dest) else None)
    path = store.local_path(key)
    try:
        size = path.stat().st_size
        if size != len(dest):
            return size, None
        h = hashlib.sha256()
        with open(path, "rb", buffering=0) as f:
            got = 0
            while got < size:
                # Hash each slice right after reading it, while it is still in the CPU cache.
                n = f.readinto(dest[got:got + READ_CHUNK])
                if not n:
                    break
                h.update(dest[got:got + n])
                got += n
        return got, h.hexdigest()
    except (FileNotFoundError, NotADirectoryError):
        raise ObjectNotFound("no such object", field="key", value=key) from None


def _checked(store: ObjectStore, name: str, fname: str, meta: dict[str, Any]) -> bytes:
    data = store.get_bytes(f"{name}/{fname}")
    check_file(name, fname, meta, len(data), hashlib.sha256(data).hexdigest())
    return data


HUGE_PAGES_FROM_BYTES = 64 << 20


def restore_buffer(nbytes: int) -> torch.Tensor:
    """A fresh uint8 buffer for a restore, on huge pages where the kernel offers them.

    Faulting in a fresh 4 KB-paged buffer costs about as much CPU as hashing it on a small
    machine; with transparent huge pages (madvise mode) the kernel faults 2 MB at a time.
    The tensor keeps the mapping alive (torch.frombuffer holds a reference).
    """
    if nbytes < HUGE_PAGES_FROM_BYTES or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty(nbytes, dtype=torch.uint8)
    mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        mm.madvise(mmap.MADV_HUGEPAGE)
    except OSError:
        pass   # no THP here: ordinary pages, same result
    return torch.frombuffer(mm, dtype=torch.uint8)


def read_checkpoint(store: ObjectStore, name: str, *, readers: int | None = None,
                    progress: ProgressFn | None = None
                    ) -> tuple[Manifest, dict[str, Any], torch.Tensor]:
    """Read and verify one checkpoint in a single pass over its data.

    The rules are spotrun.checkpoints' (check_file, check_layout): the daemon and the agent
    judge a checkpoint exactly as this restore does. Shards are read straight into one
    buffer and hashed by `readers` threads at once (file reads and hashlib release the
    GIL), so restore runs at the disk's speed rather than one core's SHA256 speed.
    `progress(bytes_done, bytes_total)` follows the shards' bytes (an S3 store streams them).
    """
    m = read_manifest(store, name)
    if m.extra.get("kind") != KIND:
        raise StoreError("not a spotrun.torch checkpoint", field="checkpoint", value=name)
    check_layout(m)
    try:
        meta = json.loads(_checked(store, name, META, m.files[META]))
    except ValueError as exc:
        raise StoreError(f"corrupt meta.json: {exc}", field="checkpoint", value=name) from None
    shards = check_layout(m, meta)
    nbytes = int(meta["nbytes"])
    parts: list[tuple[str, int, int]] = []
    pos = 0
    for fname in shards:
        size = int(m.files[fname]["size"])
        parts.append((fname, pos, size))
        pos += size
    data = restore_buffer(nbytes)
    view = memoryview(data.numpy()).cast("B") if nbytes else memoryview(b"")
    tally = ByteTally(progress, nbytes) if progress else None

    def one(part: tuple[str, int, int]) -> None:
        fname, at, size = part
        got, digest = _read_hashed(store, f"{name}/{fname}", view[at:at + size],
                                   tally.part(fname) if tally else None)
        check_file(name, fname, m.files[fname], got, digest if got == size else None)

    workers = max(1, min(readers or READERS, len(parts)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="spotrun-read") as pool:
        for f in [pool.submit(one, p) for p in parts]:
            f.result()   # the first bad shard raises; the others finish first (with-block)
    return m, meta, data


def matches_saved(store: ObjectStore, snap: Snapshot, shard_bytes: int) -> bool:
    """True if the store's checkpoint of snap.step holds exactly these bytes."""
    try:
        m = read_manifest(store, checkpoint_name(snap.step))
    except (ObjectNotFound, StoreError):
        return False
    meta = json.dumps(snap.meta(), separators=(",", ":")).encode()
    if m.files.get(META, {}).get("sha256") != hashlib.sha256(meta).hexdigest():
        return False
    snap.wait_ready()
    for i in range(max(1, -(-snap.nbytes // shard_bytes))):
        got = m.files.get(f"data-{i:03d}.bin", {}).get("sha256")
        if got != hashlib.sha256(snap.data[i * shard_bytes:(i + 1) * shard_bytes]).hexdigest():
            return False
    return True

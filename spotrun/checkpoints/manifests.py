"""One checkpoint: a folder `ckpt-<step:012d>/` of data files and its `MANIFEST.json` (sizes
and SHA256 of every file), written last, so a checkpoint is visible only once complete; the
shape rules of its kind and the check of one file against its manifest entry."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from spotrun.errors import ChecksumMismatch, ObjectNotFound, StoreError
from spotrun.store.base import ObjectStore

MANIFEST = "MANIFEST.json"
FORMAT = 1
NAME_RE = re.compile(r"^ckpt-(\d{12})$")
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


def checkpoint_step(name: str | None) -> int:
    """The step a checkpoint folder name holds (0 for none: a fresh start)."""
    return step_of(name) if name and NAME_RE.match(name) else 0


def step_of(name: str) -> int:
    """The step a name of the checkpoint form holds; -1 for any other name."""
    m = NAME_RE.match(name)
    return int(m.group(1)) if m else -1

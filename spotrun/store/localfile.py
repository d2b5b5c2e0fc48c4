"""Writing a local file atomically (temp file + fsync + rename), hashing as it streams.

Shared by the file store (every write) and the S3 store (downloads), so a crash
mid-write never leaves a partial file under the final name.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterable

from spotrun.store.base import ProgressFn

TMP_PREFIX = ".tmp-"


def write_atomic(dest: Path, chunks: Iterable[bytes], progress: ProgressFn | None = None,
                 total: int = 0, check: Callable[[str], None] | None = None, *,
                 durable: bool = True) -> str:
    """Stream chunks into dest; `check(sha256)` may raise to abort before the rename.

    `durable=False` skips the fsyncs: for a file a crash may lose (a progress file, rewritten
    every step, whose lost update only makes the next heartbeat stale).
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=dest.parent)
    done = 0
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
                digest.update(chunk)
                done += len(chunk)
                if progress:
                    progress(done, total)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        if check is not None:
            check(digest.hexdigest())
        os.replace(tmp, dest)
        if durable:
            fsync_dir(dest.parent)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return digest.hexdigest()


def file_sha256(path: Path, chunk_bytes: int = 1 << 20) -> str:
    """The SHA256 hex digest of a local file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(chunk_bytes), b""):
            h.update(chunk)
    return h.hexdigest()


def fsync_dir(path: Path) -> None:
    """Make a rename in path durable (best effort where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

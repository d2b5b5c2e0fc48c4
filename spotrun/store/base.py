"""The object-store interface shared by `file://`, `s3://` and `gs://`.

Keys are relative, '/'-separated, without '..' or empty parts. A store rooted at
`uri` sees only keys under it; `sub(prefix)` gives a narrower view (a job's prefix).
What a store offers beyond the protocol is a StoreFeature it declares (`features`); callers
read the declaration, never the store's class.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Callable, Iterator, Protocol, runtime_checkable
from urllib.parse import urlparse

from spotrun.errors import ConfigError, StoreError

ProgressFn = Callable[[int, int], None]   # (bytes_done, bytes_total)


@dataclass(frozen=True)
class ObjectInfo:
    """One listed object."""

    key: str
    size: int


class StoreFeature(str, Enum):
    """What a store may offer beyond the ObjectStore protocol; each store declares its own."""

    # local_path(key) -> Path: the object is a file on this machine (a shared filesystem for
    # every node), under that path: read straight into a buffer, or written in place by a
    # library that writes files (sharded DCP checkpoints). The method exists only with it.
    LOCAL_PATH = "local_path"
    # put_bytes takes any bytes-like buffer (a memoryview of a snapshot) without a copy;
    # without it, callers hand it `bytes`.
    BUFFER_WRITES = "buffer_writes"
    # Objects cross a network in ranged reads and multipart/chunked writes, each reporting its
    # bytes: a long transfer (a checkpoint restore) shows its progress to the user.
    NETWORK = "network"


@runtime_checkable
class ObjectStore(Protocol):
    """What every store implements."""

    uri: str
    features: frozenset[StoreFeature]

    def put_bytes(self, key: str, data: bytes) -> None:
        """Write data at key atomically: readers see the old object or the new, never a part."""

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Write only if key does not exist; True if this call created it."""

    def put_file(self, key: str, path: str | Path, progress: ProgressFn | None = None) -> str:
        """Upload a local file atomically; returns its SHA256 hex digest."""

    def get_bytes(self, key: str, progress: ProgressFn | None = None) -> bytes:
        """The object's bytes, `progress` called as they arrive; raises ObjectNotFound."""

    def get_file(self, key: str, path: str | Path, progress: ProgressFn | None = None) -> None:
        """Download key to path (written atomically); raises ObjectNotFound."""

    def exists(self, key: str) -> bool:
        """True if key exists."""

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Objects whose key starts with prefix, sorted by key."""

    def delete(self, key: str) -> None:
        """Remove key; deleting a missing key is not an error."""

    def sub(self, prefix: str) -> "ObjectStore":
        """A view of this store rooted at prefix."""


def validate_key(key: str) -> str:
    """Return key if it is a safe relative key, else raise StoreError."""
    if not key or key.startswith("/") or "\\" in key:
        raise StoreError("invalid object key", field="key", value=key,
                         hint="keys are relative, '/'-separated")
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts[:-1]) or parts[-1] in ("", ".", ".."):
        raise StoreError("invalid object key", field="key", value=key,
                         hint="no empty, '.' or '..' parts")
    return key


def bucket_of(uri: str, scheme: str) -> tuple[str, str]:
    """`scheme://bucket[/prefix]` as (bucket, prefix); ConfigError naming store_uri otherwise."""
    parsed = urlparse(uri)
    if parsed.scheme != scheme or not parsed.netloc:
        raise ConfigError(f"allowed: {scheme}://bucket/prefix", field="store_uri", value=uri)
    return parsed.netloc, parsed.path


def listing_prefix(store_prefix: str, prefix: str) -> tuple[str, int]:
    """A listing under `prefix` in a bucket store rooted at `store_prefix`: the bucket-wide
    prefix to list, and how many characters of each listed name are the store's root."""
    if prefix:
        validate_key(prefix.rstrip("/") or "x")
    full = (store_prefix + "/" if store_prefix else "") + prefix
    return full, len(store_prefix) + 1 if store_prefix else 0


def join_key(*parts: str) -> str:
    """Join key parts with '/', skipping empty ones."""
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


@contextmanager
def local_errors_pass(key: str, wrap: Callable[[BaseException, str], StoreError]
                      ) -> Iterator[None]:
    """Let a local file's OSError and a StoreError through; any other error (the cloud
    library's) becomes wrap(exc, key), so callers catch one kind."""
    try:
        yield
    except (OSError, StoreError):
        raise
    except Exception as exc:
        raise wrap(exc, key) from None


class CloudPutFile:
    """put_file for the cloud stores: a local file's OSError passes, the library's errors
    become the store's (the class's `_error(exc, key)`); `_put_file` does the upload."""

    def put_file(self, key: str, path: str | Path, progress: ProgressFn | None = None) -> str:
        """Upload path (in parts or chunks when large); returns its SHA256 hex digest."""
        with local_errors_pass(key, type(self)._error):  # type: ignore[attr-defined]
            return self._put_file(key, self._key(key), Path(path), progress)  # type: ignore

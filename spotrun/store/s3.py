"""`s3://bucket/prefix` object store through boto3.

Every object carries its whole-object SHA256 in metadata (`x-amz-meta-sha256`) and is
sent with S3's own SHA256 checksum (ChecksumAlgorithm) so AWS rejects a corrupted
upload; reads recompute the SHA256 and raise ChecksumMismatch, because not every
S3-compatible server (moto) checks. Files go up through boto3's TransferManager:
large ones in parallel parts (each with its own SHA256), and an object appears only when
its upload completes, so readers never see a part; what was written is read back
(size and recorded SHA256) before put_file returns.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Any

from spotrun.aws_clients import RetryPolicy, error_code, make_client, use_retries
from spotrun.errors import ChecksumMismatch, ConfigError, ObjectNotFound, StoreError
from spotrun.store.base import (CloudPutFile, ObjectInfo, ProgressFn, StoreFeature, bucket_of,
                                join_key, listing_prefix, validate_key)
from spotrun.store.localfile import file_sha256, write_atomic

META_SHA = "sha256"
MIN_PART_SIZE = 5 * 1024 * 1024          # S3's floor for every part but the last
_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}
_READ_CHUNK = 1024 * 1024


def _wrap(exc: BaseException, key: str) -> StoreError:
    if isinstance(exc, StoreError):
        return exc
    return StoreError(f"s3 error {error_code(exc) or type(exc).__name__}: {exc}"[:300],
                      field="key", value=key)


class S3Store(CloudPutFile):
    """A store rooted at s3://bucket/prefix."""

    _error = staticmethod(_wrap)   # CloudPutFile: the library's errors as the store's

    features = frozenset({StoreFeature.NETWORK})

    def __init__(self, bucket: str, prefix: str = "", *, client: Any = None,
                 retry: RetryPolicy | None = None, part_size: int = 64 * 1024 * 1024,
                 multipart_threshold: int = 64 * 1024 * 1024, page_size: int = 1000,
                 max_concurrency: int = 8) -> None:
        if not bucket:
            raise ConfigError("s3 store needs a bucket", field="store_uri", value=bucket)
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.retry = retry or RetryPolicy()
        self.client = use_retries(client, self.retry) if client is not None else make_client(
            "s3", region=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"), retry=self.retry)
        self.part_size = max(MIN_PART_SIZE, part_size)
        self.multipart_threshold = multipart_threshold
        self.page_size = page_size
        self.max_concurrency = max(1, max_concurrency)
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"

    @classmethod
    def from_uri(cls, uri: str, **kw: Any) -> "S3Store":
        """Open `s3://bucket[/prefix]`."""
        return cls(*bucket_of(uri, "s3"), **kw)

    # ------------------------------------------------------------ helpers

    def _key(self, key: str) -> str:
        return join_key(self.prefix, validate_key(key))

    def _call(self, method: str, **kw: Any) -> Any:
        return getattr(self.client, method)(**kw)   # botocore retries (aws_clients)

    def sub(self, prefix: str) -> "S3Store":
        """A view rooted at prefix (same client)."""
        if not prefix:
            return self
        return S3Store(self.bucket, join_key(self.prefix, validate_key(prefix.strip("/"))),
                       client=self.client, retry=self.retry, part_size=self.part_size,
                       multipart_threshold=self.multipart_threshold, page_size=self.page_size,
                       max_concurrency=self.max_concurrency)

    # ------------------------------------------------------------ writes

    def put_bytes(self, key: str, data: bytes) -> None:
        """One PUT (atomic in S3) with SHA256 checksum and metadata."""
        full = self._key(key)
        try:
            self._call("put_object", Bucket=self.bucket, Key=full, Body=data,
                       ChecksumAlgorithm="SHA256", Metadata={META_SHA: _sha(data)})
        except Exception as exc:
            raise _wrap(exc, key) from None

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Conditional PUT (If-None-Match: *); False when the key already exists."""
        try:
            self._call("put_object", Bucket=self.bucket, Key=self._key(key), Body=data,
                       ChecksumAlgorithm="SHA256", Metadata={META_SHA: _sha(data)},
                       IfNoneMatch="*")
        except Exception as exc:
            if error_code(exc) in ("PreconditionFailed", "412"):
                return False
            raise _wrap(exc, key) from None
        return True

    def _put_file(self, key: str, full: str, src: Path, progress: ProgressFn | None) -> str:
        from boto3.s3.transfer import TransferConfig
        before = src.stat()
        total = before.st_size
        digest = file_sha256(src, _READ_CHUNK)
        config = TransferConfig(multipart_threshold=max(self.multipart_threshold, MIN_PART_SIZE),
                                multipart_chunksize=self.part_size,
                                max_concurrency=self.max_concurrency, use_threads=True)
        # S3 checks each part's SHA256 (ChecksumAlgorithm) as it arrives; the whole-object
        # SHA256 goes into metadata, and the read-back below compares it with the file.
        self._call("upload_file", Filename=str(src),
                   Bucket=self.bucket, Key=full,
                   ExtraArgs={"ChecksumAlgorithm": "SHA256", "Metadata": {META_SHA: digest}},
                   Config=config, Callback=_Progress(progress, total) if progress else None)
        # A write during the upload moves the file's size or mtime: a stat, not a second read
        # of what may be gigabytes.
        after = src.stat()
        if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
            raise ChecksumMismatch("file changed while uploading", field="path", value=str(src))
        self._check_written(key, total, digest)
        if progress and total == 0:
            progress(0, 0)
        return digest

    def _check_written(self, key: str, size: int, digest: str) -> None:
        head = self._head(key)
        if head is None:
            raise StoreError("object missing right after upload", field="key", value=key)
        got_sha = (head.get("Metadata") or {}).get(META_SHA)
        if int(head.get("ContentLength", -1)) != size or got_sha != digest:
            raise ChecksumMismatch("object read back differs from the file", field="key",
                                   value=key)

    # ------------------------------------------------------------ reads

    def _head(self, key: str) -> dict[str, Any] | None:
        try:
            return self._call("head_object", Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:
            if error_code(exc) in _NOT_FOUND:
                return None
            raise _wrap(exc, key) from None

    def _get(self, key: str) -> dict[str, Any]:
        try:
            return self._call("get_object", Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:
            if error_code(exc) in _NOT_FOUND:
                raise ObjectNotFound("no such object", field="key", value=key) from None
            raise _wrap(exc, key) from None

    def get_bytes(self, key: str, progress: ProgressFn | None = None) -> bytes:
        """The whole object, its SHA256 checked against the recorded one."""
        resp = self._get(key)
        if progress is None:
            data = resp["Body"].read()
        else:   # streamed, so a long read (a checkpoint restore) can show how far it is
            total, done, chunks = int(resp.get("ContentLength", 0)), 0, []
            for chunk in resp["Body"].iter_chunks(_READ_CHUNK):
                chunks.append(chunk)
                done += len(chunk)
                progress(done, total)
            data = b"".join(chunks)
        expected = (resp.get("Metadata") or {}).get(META_SHA)
        if expected and _sha(data) != expected:
            raise ChecksumMismatch("sha256 differs from the recorded one", field="key",
                                   value=key)
        return data

    def get_file(self, key: str, path: str | Path, progress: ProgressFn | None = None) -> None:
        """Stream the object to path (temp file + rename), verifying its SHA256."""
        resp = self._get(key)
        total = int(resp.get("ContentLength", 0))
        expected = (resp.get("Metadata") or {}).get(META_SHA)

        def check(sha: str) -> None:
            if expected and sha != expected:
                raise ChecksumMismatch("sha256 differs from the recorded one", field="key",
                                       value=key)

        write_atomic(Path(path), resp["Body"].iter_chunks(_READ_CHUNK), progress, total, check)

    def exists(self, key: str) -> bool:
        """True if the object exists."""
        return self._head(key) is not None

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Objects under prefix, sorted, across every page of ListObjectsV2."""
        full, root = listing_prefix(self.prefix, prefix)
        out = [ObjectInfo(key=o["Key"][root:], size=int(o["Size"]))
               for o in self._iter_objects(full)]
        out.sort(key=lambda o: o.key)
        return out

    def _iter_objects(self, full_prefix: str) -> list[dict[str, Any]]:
        def every_page() -> list[dict[str, Any]]:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=full_prefix,
                PaginationConfig={"PageSize": self.page_size})
            return [o for page in pages for o in page.get("Contents", [])]
        try:
            return every_page()
        except Exception as exc:
            raise _wrap(exc, full_prefix) from None

    def delete(self, key: str) -> None:
        """DELETE (S3 answers 204 for a missing key too)."""
        try:
            self._call("delete_object", Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:
            if error_code(exc) in _NOT_FOUND:
                return
            raise _wrap(exc, key) from None


class _Progress:
    """TransferManager's byte callbacks (from several threads) as (done, total) calls."""

    def __init__(self, progress: ProgressFn, total: int) -> None:
        self.progress = progress
        self.total = total
        self.done = 0
        self.lock = threading.Lock()

    def __call__(self, nbytes: int) -> None:
        with self.lock:   # one at a time, so the caller sees done only grow
            self.done += nbytes
            self.progress(min(self.done, self.total), self.total)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()





__all__ = ["S3Store"]

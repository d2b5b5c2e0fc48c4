"""`s3://bucket/prefix` object store through boto3.

Every object carries its whole-object SHA256 in metadata (`x-amz-meta-sha256`) and is
sent with S3's own SHA256 checksum (ChecksumAlgorithm) so AWS rejects a corrupted
upload; reads recompute the SHA256 and raise ChecksumMismatch, because not every
S3-compatible server (moto) checks. Large files go up in parts; an object appears
only when its upload completes, so readers never see a part.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlparse

from spotrun.aws_clients import RetryPolicy, call, error_code, make_client
from spotrun.errors import ChecksumMismatch, ConfigError, ObjectNotFound, StoreError
from spotrun.store.base import ObjectInfo, ProgressFn, join_key, validate_key
from spotrun.store.localfile import write_atomic

META_SHA = "sha256"
MIN_PART_SIZE = 5 * 1024 * 1024          # S3's floor for every part but the last
_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}
_READ_CHUNK = 1024 * 1024


class S3Store:
    """A store rooted at s3://bucket/prefix."""

    def __init__(self, bucket: str, prefix: str = "", *, client: Any = None,
                 retry: RetryPolicy | None = None, part_size: int = 64 * 1024 * 1024,
                 multipart_threshold: int = 64 * 1024 * 1024, page_size: int = 1000) -> None:
        if not bucket:
            raise ConfigError("s3 store needs a bucket", field="store_uri", value=bucket)
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = client if client is not None else make_client(
            "s3", region=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
        self.retry = retry or RetryPolicy()
        self.part_size = max(MIN_PART_SIZE, part_size)
        self.multipart_threshold = multipart_threshold
        self.page_size = page_size
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"

    @classmethod
    def from_uri(cls, uri: str, **kw: Any) -> "S3Store":
        """Open `s3://bucket[/prefix]`."""
        parsed = urlparse(uri)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise ConfigError("allowed: s3://bucket/prefix", field="store_uri", value=uri)
        return cls(parsed.netloc, parsed.path, **kw)

    # ------------------------------------------------------------ helpers

    def _key(self, key: str) -> str:
        return join_key(self.prefix, validate_key(key))

    def _call(self, method: str, **kw: Any) -> Any:
        return call(self.retry, getattr(self.client, method), **kw)

    def sub(self, prefix: str) -> "S3Store":
        """A view rooted at prefix (same client)."""
        if not prefix:
            return self
        return S3Store(self.bucket, join_key(self.prefix, validate_key(prefix.strip("/"))),
                       client=self.client, retry=self.retry, part_size=self.part_size,
                       multipart_threshold=self.multipart_threshold, page_size=self.page_size)

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

    def put_file(self, key: str, path: str | Path, progress: ProgressFn | None = None) -> str:
        """Upload path (in parts when large); returns its SHA256 hex digest."""
        full = self._key(key)
        try:
            return self._put_file(key, full, Path(path), progress)
        except (OSError, StoreError):
            raise
        except Exception as exc:
            raise _wrap(exc, key) from None

    def _put_file(self, key: str, full: str, src: Path, progress: ProgressFn | None) -> str:
        total = src.stat().st_size
        digest = _file_sha(src)
        if total < self.multipart_threshold:
            with open(src, "rb") as f:
                data = f.read()
            if _sha(data) != digest:
                raise ChecksumMismatch("file changed while uploading", field="path",
                                       value=str(src))
            self._call("put_object", Bucket=self.bucket, Key=full, Body=data,
                       ChecksumAlgorithm="SHA256", Metadata={META_SHA: digest})
            if progress:
                progress(total, total)
        else:
            self._multipart(full, src, total, digest, progress)
        self._check_written(key, total, digest)
        return digest

    def _multipart(self, full: str, src: Path, total: int, digest: str,
                   progress: ProgressFn | None) -> None:
        up = self._call("create_multipart_upload", Bucket=self.bucket, Key=full,
                        ChecksumAlgorithm="SHA256", Metadata={META_SHA: digest})
        upload_id = up["UploadId"]
        parts: list[dict[str, Any]] = []
        done = 0
        try:
            with open(src, "rb") as f:
                number = 1
                while True:
                    chunk = f.read(self.part_size)
                    if not chunk:
                        break
                    resp = self._call("upload_part", Bucket=self.bucket, Key=full,
                                      UploadId=upload_id, PartNumber=number, Body=chunk,
                                      ChecksumAlgorithm="SHA256")
                    parts.append({"PartNumber": number, "ETag": resp["ETag"],
                                  "ChecksumSHA256": resp.get("ChecksumSHA256")
                                  or base64.b64encode(hashlib.sha256(chunk).digest()).decode()})
                    done += len(chunk)
                    number += 1
                    if progress:
                        progress(done, total)
            self._call("complete_multipart_upload", Bucket=self.bucket, Key=full,
                       UploadId=upload_id, MultipartUpload={"Parts": parts})
        except BaseException:
            # An abandoned upload keeps billing its parts until aborted.
            try:
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=full,
                                                   UploadId=upload_id)
            except Exception:  # noqa: BLE001 - the original error matters more
                pass
            raise

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

    def get_bytes(self, key: str) -> bytes:
        """The whole object, its SHA256 checked against the recorded one."""
        resp = self._get(key)
        data = resp["Body"].read()
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
        if prefix:
            validate_key(prefix.rstrip("/") or "x")
        full = (self.prefix + "/" if self.prefix else "") + prefix
        root = len(self.prefix) + 1 if self.prefix else 0
        out = [ObjectInfo(key=o["Key"][root:], size=int(o["Size"]))
               for o in self._iter_objects(full)]
        out.sort(key=lambda o: o.key)
        return out

    def _iter_objects(self, full_prefix: str) -> Iterator[dict[str, Any]]:
        token: str | None = None
        while True:
            kw: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full_prefix,
                                  "MaxKeys": self.page_size}
            if token:
                kw["ContinuationToken"] = token
            try:
                page = self._call("list_objects_v2", **kw)
            except Exception as exc:
                raise _wrap(exc, full_prefix) from None
            yield from page.get("Contents", [])
            if not page.get("IsTruncated"):
                return
            token = page["NextContinuationToken"]

    def delete(self, key: str) -> None:
        """DELETE (S3 answers 204 for a missing key too)."""
        try:
            self._call("delete_object", Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:
            if error_code(exc) in _NOT_FOUND:
                return
            raise _wrap(exc, key) from None


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_READ_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _wrap(exc: BaseException, key: str) -> StoreError:
    if isinstance(exc, StoreError):
        return exc
    return StoreError(f"s3 error {error_code(exc) or type(exc).__name__}: {exc}"[:300],
                      field="key", value=key)


__all__ = ["S3Store"]

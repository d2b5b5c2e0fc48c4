"""`gs://bucket/prefix` object store through google-cloud-storage.

GCS computes every object's CRC32C when it is written; this store checks it both ways.
Uploads send their own CRC32C (the library compares it with what the server stored and
fails the upload on a difference), and put_file reads the stored size and CRC32C back before
it returns. Reads recompute the CRC32C of the bytes that arrived and raise ChecksumMismatch
when it differs from the object's, so a corrupted object or transfer is never handed on.
Objects also carry their whole-object SHA256 in metadata (`sha256`), as on s3://.

put_bytes sends up to `single_request_max` bytes (a checkpoint's 64 MiB shard) as one
single-request upload: metadata and data in one POST, so the object appears whole or not at
all, and a failed try is simply sent again. Larger payloads, and large files, go up as one
resumable upload in chunks (each chunk a request; the object appears only when the last chunk
lands, so readers never see a part), with a progress call after each chunk. put_if_absent is a create with `ifGenerationMatch=0`. Reads pin the
generation they looked up, so an overwrite during a chunked read fails it instead of mixing
two versions.

STORAGE_EMULATOR_HOST (read by google-cloud-storage) points the client at an emulator with
anonymous credentials; otherwise it uses Application Default Credentials.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import json
import random
import secrets
import types
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import quote

import google_crc32c
from google.api_core import exceptions as gexc
from google.api_core.retry import Retry
from google.cloud import storage
from google.cloud.storage.retry import DEFAULT_RETRY
from google.resumable_media import common as media_common
from google.resumable_media.requests import ResumableUpload

from spotrun.errors import ChecksumMismatch, ConfigError, ObjectNotFound, StoreError
from spotrun.store.base import (CloudPutFile, ObjectInfo, ProgressFn, StoreFeature, bucket_of,
                                join_key, listing_prefix, validate_key)
from spotrun.store.localfile import write_atomic

def _own_boundary_rng() -> None:
    """Give google-cloud-storage's multipart uploads a random generator of their own.

    The library draws each multipart boundary with `random.randrange`, from the process's
    global stream: the stream a training job seeds and draws from. A checkpoint upload in the
    job's process would then move the job's random numbers, and a resumed run would no longer
    be bitwise the uninterrupted one. A private `random.Random` gives the same boundaries'
    randomness without touching the job's stream.
    """
    for name in ("google.cloud.storage._media._upload", "google.resumable_media._upload"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue   # another library version: its module is elsewhere or absent
        if isinstance(vars(mod).get("random"), types.ModuleType):
            mod.random = random.Random()


_own_boundary_rng()

META_SHA = "sha256"
# Resumable chunk: google-cloud-storage's own default (100 MiB, `Blob._DEFAULT_CHUNKSIZE`).
# Each chunk is a request and a round trip; at 16 MiB a 1.2 GB emergency save spent more time
# waiting on chunk answers than sending (bench/emergency_gcs.py), inside a 30 s window.
DEFAULT_CHUNK = 100 * 1024 * 1024
# One request per put_bytes up to this size. A resumable upload costs a second request per
# object (and a fake-gcs-server that rehashes the object at each chunk); a 64 MiB shard that
# fails is cheaper to send again whole. The 1.2 GB emergency save's shards are 64 MiB, sent
# by write_snapshot's writers at once (bench/emergency_gcs.py has both paths side by side).
SINGLE_REQUEST_MAX = 256 * 1024 * 1024
CHUNK_QUANTUM = 256 * 1024          # GCS: every resumable chunk but the last is a multiple
_READ_CHUNK = 8 * 1024 * 1024
_CRC_SLICE = 1024 * 1024            # copied for google-crc32c while it is still in the cache
_CONTENT_TYPE = "application/octet-stream"


def _wrap(exc: BaseException, key: str) -> StoreError:
    if isinstance(exc, StoreError):
        return exc
    if isinstance(exc, media_common.DataCorruption):
        return ChecksumMismatch(f"gcs upload corrupted: {exc}"[:300], field="key", value=key)
    code = getattr(exc, "code", None) or type(exc).__name__
    return StoreError(f"gcs error {code}: {exc}"[:300], field="key", value=key)


class GcsStore(CloudPutFile):
    """A store rooted at gs://bucket/prefix."""

    _error = staticmethod(_wrap)   # CloudPutFile: the library's errors as the store's

    # BUFFER_WRITES: put_bytes sends a snapshot's memoryview as it is (one request, no copy).
    features = frozenset({StoreFeature.NETWORK, StoreFeature.BUFFER_WRITES})

    def __init__(self, bucket: str, prefix: str = "", *, client: Any = None,
                 chunk_size: int = DEFAULT_CHUNK,
                 resumable_threshold: int = 16 * 1024 * 1024, read_chunk: int = _READ_CHUNK,
                 page_size: int = 1000, retry: Retry | None = None,
                 single_request_max: int = SINGLE_REQUEST_MAX) -> None:
        if not bucket:
            raise ConfigError("gs store needs a bucket", field="store_uri", value=bucket)
        self.bucket_name = bucket
        self.prefix = prefix.strip("/")
        self.client = client if client is not None else _default_client()
        self.bucket = self.client.bucket(bucket)
        # Round down to GCS's chunk quantum (at least one quantum).
        self.chunk_size = max(CHUNK_QUANTUM, chunk_size // CHUNK_QUANTUM * CHUNK_QUANTUM)
        self.resumable_threshold = resumable_threshold
        self.read_chunk = max(1, read_chunk)
        self.page_size = page_size
        self.retry = retry or DEFAULT_RETRY
        self.single_request_max = single_request_max
        self.uri = f"gs://{bucket}/{self.prefix}" if self.prefix else f"gs://{bucket}"

    @classmethod
    def from_uri(cls, uri: str, **kw: Any) -> "GcsStore":
        """Open `gs://bucket[/prefix]`."""
        return cls(*bucket_of(uri, "gs"), **kw)

    def sub(self, prefix: str) -> "GcsStore":
        """A view rooted at prefix (same client)."""
        if not prefix:
            return self
        return GcsStore(self.bucket_name, join_key(self.prefix, validate_key(prefix.strip("/"))),
                        client=self.client, chunk_size=self.chunk_size,
                        resumable_threshold=self.resumable_threshold,
                        read_chunk=self.read_chunk, page_size=self.page_size, retry=self.retry,
                        single_request_max=self.single_request_max)

    def _key(self, key: str) -> str:
        return join_key(self.prefix, validate_key(key))

    # ------------------------------------------------------------ writes

    def put_bytes(self, key: str, data: Any) -> None:
        """One upload (atomic in GCS), CRC32C-checked; one request up to single_request_max."""
        if len(data) <= self.single_request_max:
            self._one_request(key, data)
            return
        data = bytes(data)   # the library's resumable upload takes bytes only
        blob = self._blob(key, _sha(data))
        try:
            # Overwriting with the same bytes is idempotent, so a retried upload is safe.
            blob.upload_from_string(data, content_type=_CONTENT_TYPE, checksum="crc32c",
                                    retry=self.retry)
        except Exception as exc:
            raise _wrap(exc, key) from None

    def _one_request(self, key: str, data: Any) -> None:
        """A single-request (multipart) upload: the object's metadata, CRC32C and bytes in one
        POST, retried whole by the store's retry; the stored size and CRC32C must be ours."""
        view = memoryview(data).cast("B")
        # GCS checks the crc32c sent in the metadata against the bytes it received.
        meta = {"name": self._key(key), "metadata": {META_SHA: _sha(view)},
                "crc32c": _crc_of(view)}
        url = (f"{self.client.api_endpoint}/upload/storage/v1/b/"
               f"{quote(self.bucket_name, safe='')}/o?uploadType=multipart")

        def attempt() -> dict[str, Any]:
            body = _RelatedBody(meta, view)
            resp = self.client._http.request("POST", url, data=body, headers=body.headers)
            if resp.status_code != 200:
                # An api_core error (503 -> ServiceUnavailable): the retry predicate tells a
                # passing failure from a final one.
                raise gexc.from_http_response(resp)
            return resp.json()

        try:
            stored = self.retry(attempt)()
        except Exception as exc:
            raise _wrap(exc, key) from None
        if int(stored.get("size", -1)) != len(view) or stored.get("crc32c") != meta["crc32c"]:
            raise ChecksumMismatch("object stored differs from the bytes sent", field="key",
                                   value=key)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """A create with ifGenerationMatch=0; False when the key already exists."""
        blob = self._blob(key, _sha(data))
        try:
            blob.upload_from_string(data, content_type=_CONTENT_TYPE, checksum="crc32c",
                                    if_generation_match=0, retry=self.retry)
        except gexc.PreconditionFailed:
            return False
        except Exception as exc:
            raise _wrap(exc, key) from None
        return True

    def _put_file(self, key: str, full: str, src: Path, progress: ProgressFn | None) -> str:
        before = src.stat()
        total = before.st_size
        sha, crc = _file_digests(src)
        if total < self.resumable_threshold:
            blob = self._blob(key, sha)
            blob.upload_from_filename(str(src), content_type=_CONTENT_TYPE, checksum="crc32c",
                                      retry=self.retry)
            if progress:
                progress(total, total)
        else:
            self._resumable(full, src, sha, total, progress)
        # A write during the upload moves the file's size or mtime: a stat, not a second read.
        after = src.stat()
        if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
            raise ChecksumMismatch("file changed while uploading", field="path", value=str(src))
        self._check_written(key, total, crc)
        return sha

    def _resumable(self, full: str, src: Path, sha: str, total: int,
                   progress: ProgressFn | None) -> None:
        url = (f"{self.client.api_endpoint}/upload/storage/v1/b/"
               f"{quote(self.bucket_name, safe='')}/o?uploadType=resumable")
        # checksum="crc32c": the library hashes what it sends and compares the stored CRC32C
        # at the end (DataCorruption on a difference).
        upload = ResumableUpload(url, self.chunk_size, checksum="crc32c")
        # The client's authorized session: the transport google-cloud-storage's own uploads use.
        transport = self.client._http
        with open(src, "rb") as stream:
            upload.initiate(transport, stream, {"name": full, "metadata": {META_SHA: sha}},
                            _CONTENT_TYPE, total_bytes=total)
            while not upload.finished:
                upload.transmit_next_chunk(transport)
                if progress:
                    progress(min(upload.bytes_uploaded, total), total)

    def _check_written(self, key: str, size: int, crc: str) -> None:
        blob = self._get_blob(key)
        if blob is None:
            raise StoreError("object missing right after upload", field="key", value=key)
        if int(blob.size or 0) != size or blob.crc32c != crc:
            raise ChecksumMismatch("object read back differs from the file", field="key",
                                   value=key)

    def _blob(self, key: str, sha: str) -> Any:
        blob = self.bucket.blob(self._key(key))
        blob.metadata = {META_SHA: sha}
        return blob

    # ------------------------------------------------------------ reads

    def _get_blob(self, key: str) -> Any:
        try:
            return self.bucket.get_blob(self._key(key), retry=self.retry)
        except Exception as exc:
            raise _wrap(exc, key) from None

    def _must_blob(self, key: str) -> Any:
        blob = self._get_blob(key)
        if blob is None:
            raise ObjectNotFound("no such object", field="key", value=key)
        return blob

    def _chunks(self, blob: Any, key: str, crc: Any) -> Iterator[bytes]:
        """The object's bytes in ranged reads of that generation, feeding the CRC32C."""
        size = int(blob.size or 0)
        start = 0
        while start < size:
            end = min(start + self.read_chunk, size) - 1
            try:
                chunk = blob.download_as_bytes(start=start, end=end, checksum=None,
                                               retry=self.retry)
            except gexc.NotFound:
                # The generation we looked up is gone (overwritten or deleted) mid-read.
                raise ObjectNotFound("object changed while reading", field="key",
                                     value=key) from None
            except Exception as exc:
                raise _wrap(exc, key) from None
            if not chunk:
                raise StoreError("short read", field="key", value=key)
            crc.update(chunk)
            start += len(chunk)
            yield chunk

    def get_bytes(self, key: str, progress: ProgressFn | None = None) -> bytes:
        """The whole object, its CRC32C checked against the stored one."""
        blob = self._must_blob(key)
        total, crc, parts, done = int(blob.size or 0), google_crc32c.Checksum(), [], 0
        for chunk in self._chunks(blob, key, crc):
            parts.append(chunk)
            done += len(chunk)
            if progress:
                progress(done, total)
        _check_crc(crc, blob.crc32c, key)
        return b"".join(parts)

    def get_file(self, key: str, path: str | Path, progress: ProgressFn | None = None) -> None:
        """Stream the object to path (temp file + rename), verifying its CRC32C."""
        blob = self._must_blob(key)
        crc = google_crc32c.Checksum()
        write_atomic(Path(path), self._chunks(blob, key, crc), progress, int(blob.size or 0),
                     lambda _sha: _check_crc(crc, blob.crc32c, key))

    def exists(self, key: str) -> bool:
        """True if the object exists."""
        return self._get_blob(key) is not None

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Objects under prefix, sorted, across every page of the listing."""
        full, root = listing_prefix(self.prefix, prefix)
        try:
            blobs = list(self.client.list_blobs(self.bucket_name, prefix=full,
                                                page_size=self.page_size, retry=self.retry))
        except Exception as exc:
            raise _wrap(exc, full) from None
        out = [ObjectInfo(key=b.name[root:], size=int(b.size or 0)) for b in blobs]
        out.sort(key=lambda o: o.key)
        return out

    def delete(self, key: str) -> None:
        """Remove the object; a missing one is not an error."""
        try:
            self.bucket.blob(self._key(key)).delete(retry=self.retry)
        except gexc.NotFound:
            return
        except Exception as exc:
            raise _wrap(exc, key) from None


def _default_client() -> Any:
    """A client from Application Default Credentials (anonymous against an emulator)."""
    try:
        return storage.Client()
    except Exception as exc:   # no credentials, no project: one clear line, not a traceback
        raise ConfigError(f"no Google Cloud credentials for the gs:// store: {exc}"[:300],
                          field="store_uri", value="gs://",
                          hint="run `gcloud auth application-default login` or set "
                               "GOOGLE_APPLICATION_CREDENTIALS") from None


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _b64_crc(crc: Any) -> str:
    """GCS's crc32c form: base64 of the big-endian 4 bytes."""
    return base64.b64encode(crc.digest()).decode("ascii")


def _crc_of(view: memoryview) -> str:
    """GCS-form CRC32C of a buffer; google-crc32c takes only bytes, so a slice at a time."""
    crc = google_crc32c.Checksum()
    for at in range(0, len(view), _CRC_SLICE):
        crc.update(bytes(view[at:at + _CRC_SLICE]))
    return _b64_crc(crc)


class _RelatedBody:
    """A multipart/related upload body (JSON metadata, then the bytes) that requests streams
    straight from the caller's buffer: a 64 MiB shard is not copied into a new body."""

    def __init__(self, meta: dict[str, Any], view: memoryview) -> None:
        # A boundary of our own: not drawn from the job's `random` stream.
        boundary = f"spotrun-{secrets.token_hex(16)}".encode()
        sep = b"--" + boundary
        head = (sep + b"\r\ncontent-type: application/json; charset=UTF-8\r\n\r\n"
                + json.dumps(meta).encode() + b"\r\n" + sep
                + b"\r\ncontent-type: " + _CONTENT_TYPE.encode() + b"\r\n\r\n")
        self._parts = [memoryview(head), view, memoryview(b"\r\n" + sep + b"--")]
        self._len = sum(len(p) for p in self._parts)
        self.headers = {"content-type": f'multipart/related; boundary="{boundary.decode()}"'}

    def __len__(self) -> int:
        return self._len

    def read(self, size: int = -1) -> memoryview | bytes:
        """The next slice of the body (a view, no copy); b"" at the end."""
        while self._parts and not len(self._parts[0]):
            self._parts.pop(0)
        if not self._parts:
            return b""
        part = self._parts[0]
        n = len(part) if size is None or size < 0 else min(size, len(part))
        self._parts[0] = part[n:]
        return part[:n]


def _file_digests(path: Path) -> tuple[str, str]:
    """SHA256 hex and GCS-form CRC32C of a file, in one pass."""
    sha, crc = hashlib.sha256(), google_crc32c.Checksum()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_READ_CHUNK), b""):
            sha.update(chunk)
            crc.update(chunk)
    return sha.hexdigest(), _b64_crc(crc)


def _check_crc(crc: Any, expected: str | None, key: str) -> None:
    if expected and _b64_crc(crc) != expected:
        raise ChecksumMismatch("crc32c differs from the stored one", field="key", value=key)




__all__ = ["GcsStore"]

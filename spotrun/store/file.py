"""`file://` object store: a directory tree, each write a temp file + fsync + rename."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

from spotrun.errors import ConfigError, ObjectNotFound, StoreError
from spotrun.store.base import ObjectInfo, ProgressFn, StoreFeature, join_key, validate_key
from spotrun.store.localfile import TMP_PREFIX, fsync_dir, write_atomic

_CHUNK = 4 * 1024 * 1024


class FileStore:
    """A store rooted at a local directory."""

    features = frozenset({StoreFeature.LOCAL_PATH, StoreFeature.BUFFER_WRITES})

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.uri = self.root.as_uri()

    @classmethod
    def from_uri(cls, uri: str) -> "FileStore":
        """Open `file:///absolute/path`."""
        parsed = urlparse(uri)
        if parsed.scheme != "file" or parsed.netloc not in ("", "localhost"):
            raise ConfigError("allowed: file:///absolute/path", field="store_uri", value=uri)
        path = unquote(parsed.path)
        if not path.startswith("/"):
            raise ConfigError("path must be absolute", field="store_uri", value=uri)
        return cls(path)

    def _path(self, key: str) -> Path:
        return self.root / validate_key(key)

    def local_path(self, key: str) -> Path:
        """The file (or folder of objects) key names on this machine (LOCAL_PATH)."""
        return self._path(key)

    def sub(self, prefix: str) -> "FileStore":
        """A view rooted at prefix."""
        if not prefix:
            return self
        return FileStore(self._path(prefix.strip("/")))

    def _write_atomic(self, dest: Path, chunks, progress: ProgressFn | None = None,
                      total: int = 0) -> str:
        return write_atomic(dest, chunks, progress, total)

    def put_bytes(self, key: str, data: bytes) -> None:
        """Write atomically."""
        self._write_atomic(self._path(key), [data])

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create key only if missing (link(2) fails if the name exists)."""
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=dest.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, dest)
            except FileExistsError:
                return False
            fsync_dir(dest.parent)
            return True
        finally:
            os.unlink(tmp)

    def put_file(self, key: str, path: str | Path, progress: ProgressFn | None = None) -> str:
        """Copy a local file in atomically; returns its SHA256."""
        src = Path(path)
        total = src.stat().st_size

        def chunks():
            with open(src, "rb") as f:
                while True:
                    b = f.read(_CHUNK)
                    if not b:
                        return
                    yield b

        return self._write_atomic(self._path(key), chunks(), progress, total)

    def get_bytes(self, key: str, progress: ProgressFn | None = None) -> bytes:
        """Read the whole object (in chunks, reporting them, when progress is given)."""
        try:
            if progress is None:
                return self._path(key).read_bytes()
            with open(self._path(key), "rb") as f:
                total = os.fstat(f.fileno()).st_size
                parts: list[bytes] = []
                done = 0
                while chunk := f.read(_CHUNK):
                    parts.append(chunk)
                    done += len(chunk)
                    progress(done, total)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFound("no such object", field="key", value=key) from None
        if not parts:
            progress(0, 0)
        return b"".join(parts)

    def get_file(self, key: str, path: str | Path, progress: ProgressFn | None = None) -> None:
        """Copy the object out to path, atomically."""
        src = self._path(key)
        try:
            total = src.stat().st_size
            f = open(src, "rb")
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFound("no such object", field="key", value=key) from None

        def chunks():
            with f:
                while True:
                    b = f.read(_CHUNK)
                    if not b:
                        return
                    yield b

        self._write_atomic(Path(path), chunks(), progress, total)

    def exists(self, key: str) -> bool:
        """True if the object exists."""
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Objects under prefix (a key prefix, not only a directory), sorted."""
        if prefix:
            validate_key(prefix.rstrip("/") or "x")
        base_dir = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        out: list[ObjectInfo] = []
        if not base_dir.is_dir():
            return out
        for dirpath, _dirs, files in os.walk(base_dir):
            for name in files:
                if name.startswith(TMP_PREFIX):
                    continue
                full = Path(dirpath) / name
                key = full.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    try:
                        out.append(ObjectInfo(key=key, size=full.stat().st_size))
                    except FileNotFoundError:
                        continue
        out.sort(key=lambda o: o.key)
        return out

    def delete(self, key: str) -> None:
        """Remove the object; missing is fine."""
        path = self._path(key)
        try:
            path.unlink()
        except FileNotFoundError:
            return
        except IsADirectoryError:
            raise StoreError("key names a prefix, not an object", field="key", value=key) from None
        # Empty folders are invisible to list(); remove them so retention leaves no husks.
        parent = path.parent
        while parent != self.root and self.root in parent.parents:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent


__all__ = ["FileStore", "join_key"]

"""The job's persisted files: captured with each checkpoint, restored before the command starts.

A job's directory (`SPOTRUN_JOB_DIR`, the same absolute path on every attempt) holds what
the job writes besides its weights: logs, a framework's own checkpoints, metrics. The
paths and globs in the spec's `persist:` (env `SPOTRUN_PERSIST`), plus those a framework
integration registers with `persist()`, are captured when a checkpoint is taken, in the
thread that takes it, so files and weights belong to the same step. The capture goes into
the same checkpoint as `files.json`, listed in its manifest:

    {"format": 1, "files": {"lightning_logs/version_0/metrics.csv":
        {"size": 913, "mode": 420, "mtime_ns": ..., "check": {...},
         "parts": [{"blob": "<sha256>", "size": 700}, {"blob": "<sha256>", "size": 213}]}},
     "skipped": [{"path": ..., "reason": ...}]}

Contents live once, as content-addressed blobs `files/<sha256>` beside the checkpoints
(retention deletes a blob once no kept checkpoint lists it). A file unchanged since the last
capture (same size and mtime) is listed again, not read; a file that only grew (a CSV,
JSONL or TensorBoard log) adds a part holding its new tail; a file that is the
checkpoint's own data (a Trainer checkpoint folder) is referenced as `{"ckpt", "file"}`.
A restore writes each file whole (parts checked against their SHA256) and gives it back its
mode and mtime, so the job directory is the persisted state of that step.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from spotrun.checkpoints.manifests import read_manifest
from spotrun.errors import ChecksumMismatch, ObjectNotFound, StoreError
from spotrun.store.base import ObjectStore
from spotrun.store.localfile import TMP_PREFIX

log = logging.getLogger("spotrun.jobfiles")

JOB_DIR_ENV = "SPOTRUN_JOB_DIR"
PERSIST_ENV = "SPOTRUN_PERSIST"             # JSON list of globs relative to the job directory
RESTORED_ENV = "SPOTRUN_FILES_RESTORED"     # the checkpoint whose files the agent restored
MAX_FILE_ENV = "SPOTRUN_PERSIST_MAX_FILE_MB"
INDEX = "files.json"
BLOBS = "files"
FORMAT = 1
MAX_FILE_BYTES = 2 << 30      # a bigger file is skipped (and listed as skipped)
MAX_PARTS = 64                # a log appended more often than this is captured whole again
FULL_CHECK_BYTES = 16 << 20   # prefix of an appended file checked in full up to this size
EDGE_BYTES = 64 << 10         # bigger prefixes: their first and last 64 KiB are checked
MEMORY_PART_BYTES = 16 << 20  # captured parts up to this size stay in memory, bigger on disk
PROGRESS_EVERY_S = 5.0
LIST_EVERY_S = 5.0            # mark(): the persisted paths globbed again at most this often


@dataclass(frozen=True)
class Marks:
    """Each persisted file's (size, mtime_ns) at a step boundary, and when they were taken."""

    at_ns: int
    files: dict[str, tuple[int, int]]


def blob_key(sha256: str) -> str:
    """Where a persisted file's part lives in the checkpoint store."""
    return f"{BLOBS}/{sha256}"


def job_dir(env: Mapping[str, str] | None = None) -> Path:
    """The job's directory: SPOTRUN_JOB_DIR, else the current directory."""
    env = os.environ if env is None else env
    return Path(env.get(JOB_DIR_ENV) or os.getcwd()).resolve()


def env_patterns(env: Mapping[str, str] | None = None) -> list[str]:
    """The spec's `persist:` globs handed down by the agent (SPOTRUN_PERSIST)."""
    env = os.environ if env is None else env
    raw = (env.get(PERSIST_ENV) or "").strip()
    if not raw:
        return []
    try:
        value = json.loads(raw)
    except ValueError:
        log.warning("%s is not a JSON list: ignored", PERSIST_ENV)
        return []
    return [str(v) for v in value] if isinstance(value, list) else []


def collect(root: Path, patterns: Iterable[str]) -> dict[str, Path]:
    """Files matching the patterns (a matched folder means everything below it), by relative path.

    Nothing outside root is taken, even through a symlink; spotrun's temporary files are not.
    """
    root = root.resolve()
    found: dict[str, Path] = {}
    for pattern in patterns:
        if not pattern or Path(pattern).is_absolute():   # glob() refuses both
            log.warning("persist pattern %r is not a relative glob: ignored", pattern)
            continue
        # "." is the job directory itself (Python 3.11's glob fails on it).
        matches = [root] if pattern.rstrip("/") == "." else sorted(root.glob(pattern))
        for match in matches:
            for path in ([match] if match.is_file() else sorted(match.rglob("*"))):
                if not path.is_file() or path.name.startswith(TMP_PREFIX):
                    continue
                if not path.resolve().is_relative_to(root):
                    log.warning("not persisted (outside the job directory): %s", path)
                    continue
                found.setdefault(path.relative_to(root).as_posix(), path)
    return found


@dataclass
class Part:
    """One captured piece of a file: its bytes (in memory or a staged file) or a reference."""

    entry: dict[str, Any]
    data: bytes | None = None
    staged: Path | None = None


@dataclass
class Capture:
    """The job's files at one moment: the index to publish and the parts still to upload."""

    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    parts: list[Part] = field(default_factory=list)
    read_bytes: int = 0
    capture_s: float = 0.0

    def index(self) -> bytes:
        """files.json as published."""
        return json.dumps({"format": FORMAT, "files": self.files, "skipped": self.skipped},
                          sort_keys=True, separators=(",", ":")).encode()

    def discard(self) -> None:
        """Remove staged copies (after the upload, or when the save is given up)."""
        for part in self.parts:
            if part.staged is not None:
                part.staged.unlink(missing_ok=True)
                part.staged = None


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _check_of(f: Any, size: int) -> dict[str, Any]:
    """What proves later that a file still starts with these `size` bytes."""
    f.seek(0)
    if size <= FULL_CHECK_BYTES:
        return {"kind": "sha256", "digest": _sha(f.read(size))}
    head = f.read(EDGE_BYTES)
    f.seek(size - EDGE_BYTES)
    return {"kind": "edges", "digest": _sha(head + f.read(EDGE_BYTES))}


def _starts_as(path: Path, entry: Mapping[str, Any]) -> bool:
    """The file still starts with the bytes a captured entry describes (it was appended to)."""
    with open(path, "rb") as f:
        return _check_of(f, entry["size"]) == entry.get("check")


class JobFiles:
    """One process's persisted files: what to capture, and what the last capture held."""

    def __init__(self, root: Path | None = None, patterns: Iterable[str] = (), *,
                 max_file_bytes: int | None = None, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.root = (root or job_dir(env)).resolve()
        self.patterns: list[str] = list(dict.fromkeys([*env_patterns(env), *patterns]))
        raw = (env.get(MAX_FILE_ENV) or "").strip()
        self.max_file_bytes = max_file_bytes or (int(float(raw) * (1 << 20)) if raw else
                                                 MAX_FILE_BYTES)
        self.prior: dict[str, dict[str, Any]] = {}   # the last published capture's entries
        self.known_blobs: set[str] = set()           # blobs that capture listed (in the store)
        self._primed = False
        self._lock = threading.Lock()
        self._listed: dict[str, Path] | None = None
        self._listed_at = -1e18
        self._listed_root_ns: int | None = None

    def add(self, *paths: str | os.PathLike[str]) -> None:
        """Persist these paths or globs too (relative to the job directory, or inside it)."""
        for p in paths:
            text = os.fspath(p)
            if os.path.isabs(text):
                try:
                    text = Path(text).resolve().relative_to(self.root).as_posix()
                except ValueError:
                    log.warning("not persisted (outside the job directory %s): %s", self.root, p)
                    continue
            text = text.rstrip("/") or "."
            with self._lock:
                if text not in self.patterns:
                    self.patterns.append(text)

    @property
    def active(self) -> bool:
        """Anything to persist at all."""
        return bool(self.patterns)

    def prime(self, store: ObjectStore, name: str | None) -> None:
        """Start from the index of the checkpoint resumed from: its restored files are not re-sent."""
        if self._primed:
            return
        self._primed = True
        index = read_index(store, name) if name else None
        if index is None:
            return
        self.prior = dict(index.get("files") or {})
        self.known_blobs = blobs_of(index)

    def resume_from(self, store: ObjectStore, name: str,
                    env: Mapping[str, str] | None = None) -> int:
        """Restore checkpoint `name`'s files into the job dir (unless the agent did), then prime.

        Primed only once restored: a failed restore falls back to another checkpoint.
        """
        env = os.environ if env is None else env
        count = 0 if env.get(RESTORED_ENV) == name else restore(store, name, self.root)
        self.prime(store, name)
        if count:
            log.info("restored %d persisted files of %s into %s", count, name, self.root)
        return count

    def mark(self) -> Marks:
        """At a step boundary: each persisted file's size and mtime (a stat each; the paths are
        globbed again at most every LIST_EVERY_S), for a save of that step made later."""
        now = time.monotonic()
        try:   # a file created in the job directory itself changes the directory's mtime
            root_ns = self.root.stat().st_mtime_ns
        except OSError:
            root_ns = None
        if self._listed is None or now - self._listed_at >= LIST_EVERY_S or \
                root_ns != self._listed_root_ns:
            with self._lock:
                patterns = list(self.patterns)
            self._listed, self._listed_at = collect(self.root, patterns), now
            self._listed_root_ns = root_ns
        files: dict[str, tuple[int, int]] = {}
        for rel, path in self._listed.items():
            try:
                st = path.stat()
            except OSError:
                continue
            files[rel] = (st.st_size, st.st_mtime_ns)
        return Marks(time.time_ns(), files)

    def _as_of(self, rel: str, path: Path, marks: Marks) -> tuple[str, Any]:
        """How to take a file for a save of the marked step: ("now"), ("limit", (size, mtime))
        for its first bytes, ("prior", entry) or ("skip"); the loop may have written to it
        since (a validation's log row, a new best.pt)."""
        st = path.stat()
        was = marks.files.get(rel)
        prior = self.prior.get(rel)
        if was is None and st.st_mtime_ns <= marks.at_ns:
            return ("now", None)
        if was is None:   # created since the step (or deep in a folder listed a while ago)
            return ("prior", prior) if prior is not None else ("skip", None)
        size, mtime_ns = was
        if (st.st_size, st.st_mtime_ns) == (size, mtime_ns):
            return ("now", None)
        if prior is not None and (prior["size"], prior["mtime_ns"]) == (size, mtime_ns):
            return ("prior", prior)  # unchanged from the last checkpoint up to the step
        if st.st_size > size:
            appended = prior is None or (prior["size"] <= size and _starts_as(path, prior))
            if appended:
                return ("limit", was)   # appended since: the rows up to the step
        log.warning("persisted file %s was rewritten after the step being saved: saved as it "
                    "is now", rel)
        return ("now", None)

    def capture(self, own: Mapping[str, Path] | None = None, *, checkpoint: str = "",
                as_of: Marks | None = None) -> Capture:
        """The persisted files now; `own` maps the checkpoint's own files (flat name -> path).

        as_of: the marks of the step being saved, when the save comes after its boundary (the
        notice's save from the watchdog): rows appended since are left out, a file replaced
        since is taken as the last checkpoint held it, a file created since is left out.
        """
        t0 = time.monotonic()
        out = Capture()
        with self._lock:
            patterns = list(self.patterns)
        own_by_path = {p.resolve(): flat for flat, p in (own or {}).items()}
        for rel, path in collect(self.root, patterns).items():
            try:
                limit = None
                if as_of is not None:
                    how, arg = self._as_of(rel, path, as_of)
                    if how == "skip":
                        continue
                    if how == "prior":
                        out.files[rel] = arg
                        continue
                    limit = arg
                self._capture_one(out, rel, path, own_by_path.get(path.resolve()), checkpoint,
                                  limit)
            except FileNotFoundError:
                continue   # removed since the glob: not part of this step
            except OSError as exc:
                out.skipped.append({"path": rel, "reason": f"unreadable: {exc.strerror}"})
        out.capture_s = time.monotonic() - t0
        return out

    def _capture_one(self, out: Capture, rel: str, path: Path, own_flat: str | None,
                     checkpoint: str, limit: tuple[int, int] | None = None) -> None:
        st = path.stat()
        # limit: (size, mtime) at the step being saved; the file's first `size` bytes.
        size, mtime_ns = limit if limit is not None else (st.st_size, st.st_mtime_ns)
        base = {"size": size, "mode": st.st_mode & 0o7777, "mtime_ns": mtime_ns}
        if own_flat is not None:
            with open(path, "rb") as f:
                check = _check_of(f, size)
            out.files[rel] = {**base, "check": check, "parts": [
                {"ckpt": checkpoint, "file": own_flat, "size": size}]}
            return
        prior = self.prior.get(rel)
        if prior is not None and (prior["size"], prior["mtime_ns"]) == (size, mtime_ns):
            out.files[rel] = prior
            return
        if size > self.max_file_bytes:
            out.skipped.append({"path": rel, "reason": f"{size} bytes, over the limit of "
                                f"{self.max_file_bytes} ({MAX_FILE_ENV})"})
            return
        with open(path, "rb") as f:
            grew = (prior is not None and size >= prior["size"] > 0
                    and len(prior["parts"]) < MAX_PARTS
                    and _check_of(f, prior["size"]) == prior.get("check"))
            start = prior["size"] if grew and prior is not None else 0
            parts = list(prior["parts"]) if grew and prior is not None else []
            if size > start or not parts:
                parts.append(self._read_part(out, f, start, size - start))
            out.files[rel] = {**base, "check": _check_of(f, size), "parts": parts}

    def _read_part(self, out: Capture, f: Any, offset: int, size: int) -> dict[str, Any]:
        f.seek(offset)
        h = hashlib.sha256()
        if size <= MEMORY_PART_BYTES:
            data = f.read(size)
            h.update(data)
            part = Part({"blob": h.hexdigest(), "size": len(data)}, data=data)
        else:
            fd, tmp = tempfile.mkstemp(prefix="spotrun-persist-")
            left = size
            with os.fdopen(fd, "wb") as dst:
                while left > 0:
                    chunk = f.read(min(left, 4 << 20))
                    if not chunk:
                        break
                    h.update(chunk)
                    dst.write(chunk)
                    left -= len(chunk)
            part = Part({"blob": h.hexdigest(), "size": size - left}, staged=Path(tmp))
        out.read_bytes += part.entry["size"]
        out.parts.append(part)
        return part.entry

    def upload(self, store: ObjectStore, name: str, capture: Capture,
               progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
        """Send the parts the store lacks, then `<name>/files.json`; returns its manifest entry.

        Call before the checkpoint's manifest: the index then belongs to that checkpoint.
        The caller discards the capture afterwards (a retry sends it again).
        """
        todo = [p for p in capture.parts if p.entry["blob"] not in self.known_blobs]
        sent = _Tally(sum(p.entry["size"] for p in todo), progress, "sent")
        for part in todo:
            key = blob_key(part.entry["blob"])
            if part.data is not None:
                store.put_bytes(key, part.data)
            else:
                assert part.staged is not None, "capture discarded before its upload"
                store.put_file(key, part.staged)
            self.known_blobs.add(part.entry["blob"])
            sent.add(part.entry["size"])
        body = capture.index()
        store.put_bytes(f"{name}/{INDEX}", body)
        log.info("persisted files: %d listed, %d bytes sent, %d skipped", len(capture.files),
                 sent.done, len(capture.skipped))
        return {"size": len(body), "sha256": _sha(body)}

    def published(self, capture: Capture) -> None:
        """The checkpoint holding this capture is in the store: later captures build on it."""
        self.prior = dict(capture.files)
        self.known_blobs = blobs_of({"files": capture.files})


def blobs_of(index: Mapping[str, Any]) -> set[str]:
    """Every blob an index lists."""
    return {p["blob"] for e in (index.get("files") or {}).values()
            for p in e.get("parts", []) if "blob" in p}


def checkpoints_of(index: Mapping[str, Any]) -> set[str]:
    """Every checkpoint whose own files an index references."""
    return {p["ckpt"] for e in (index.get("files") or {}).values()
            for p in e.get("parts", []) if "ckpt" in p}


def read_index(store: ObjectStore, name: str) -> dict[str, Any] | None:
    """A checkpoint's files.json, or None if it has none; raises StoreError if it is corrupt."""
    try:
        raw = store.get_bytes(f"{name}/{INDEX}")
    except ObjectNotFound:
        return None
    try:
        index = json.loads(raw)
        if not isinstance(index, dict) or not isinstance(index.get("files"), dict):
            raise ValueError("no files table")
        return index
    except ValueError as exc:
        raise StoreError(f"corrupt {INDEX}: {exc}", field="checkpoint", value=name) from None


def check_index(store: ObjectStore, name: str, index: Mapping[str, Any],
                blob_sizes: Mapping[str, int] | None = None) -> None:
    """Every part an index lists is in the store with its size; raises ChecksumMismatch."""
    if blob_sizes is None:
        blob_sizes = {o.key.rsplit("/", 1)[-1]: o.size for o in store.list(f"{BLOBS}/")}
    for rel, entry in (index.get("files") or {}).items():
        for part in entry.get("parts", []):
            if "blob" in part:
                if blob_sizes.get(part["blob"]) != part["size"]:
                    raise ChecksumMismatch("persisted file's part missing or short",
                                           field="checkpoint", value=f"{name}/{rel}")
            elif not store.exists(f"{part['ckpt']}/{part['file']}"):
                raise ChecksumMismatch("persisted file's checkpoint copy missing",
                                       field="checkpoint", value=f"{name}/{rel}")


def restore(store: ObjectStore, name: str, dest: Path, *,
            progress: Callable[[int, int], None] | None = None) -> int:
    """Write a checkpoint's persisted files into dest (each part SHA256-checked); returns the count."""
    index = read_index(store, name)
    if index is None:
        return 0
    files = index["files"]
    restored = _Tally(sum(int(e["size"]) for e in files.values()), progress, "restored")
    dest = dest.resolve()
    manifests: dict[str, Any] = {}   # checkpoints whose own files parts reference, read once
    for rel, entry in sorted(files.items()):
        target = (dest / rel).resolve()
        if not target.is_relative_to(dest):
            raise StoreError("persisted path leaves the job directory", field="checkpoint",
                             value=f"{name}/{rel}")
        _restore_one(store, name, rel, entry, target, manifests)
        restored.add(int(entry["size"]))
    _stamp_folders(dest, [dest / rel for rel in files])
    for skipped in index.get("skipped") or []:
        log.warning("not persisted at %s: %s (%s)", name, skipped.get("path"), skipped.get("reason"))
    return len(files)


def _stamp_folders(dest: Path, restored: list[Path]) -> None:
    """Each folder that got files back takes its newest file's mtime, as if written then.

    Frameworks order their own checkpoint folders by mtime (Trainer's rotation keeps the
    newest): a restore that wrote every folder just now would scramble that order.
    """
    newest: dict[Path, int] = {}
    for path in restored:
        mtime = path.stat().st_mtime_ns
        folder = path.parent
        while folder != dest and folder.is_relative_to(dest):
            newest[folder] = max(newest.get(folder, 0), mtime)
            folder = folder.parent
    for folder, mtime in newest.items():
        os.utime(folder, ns=(mtime, mtime))


def _restore_one(store: ObjectStore, name: str, rel: str, entry: Mapping[str, Any],
                 target: Path, manifests: dict[str, Any]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_file():
        st = target.stat()
        if (st.st_size, st.st_mtime_ns) == (entry["size"], entry["mtime_ns"]):
            return   # already here (the agent restored it, or the same instance)
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in entry["parts"]:
                out.write(_part_bytes(store, name, rel, part, manifests))
        os.chmod(tmp, int(entry.get("mode", 0o644)))
        os.utime(tmp, ns=(int(entry["mtime_ns"]), int(entry["mtime_ns"])))
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _part_bytes(store: ObjectStore, name: str, rel: str, part: Mapping[str, Any],
                manifests: dict[str, Any]) -> bytes:
    if "blob" in part:
        data = store.get_bytes(blob_key(part["blob"]))
        ok = len(data) == part["size"] and _sha(data) == part["blob"]
    else:
        data = store.get_bytes(f"{part['ckpt']}/{part['file']}")
        if part["ckpt"] not in manifests:
            manifests[part["ckpt"]] = read_manifest(store, part["ckpt"])
        want = manifests[part["ckpt"]].files.get(part["file"], {})
        ok = len(data) == part["size"] and _sha(data) == want.get("sha256")
    if not ok:
        raise ChecksumMismatch("persisted file's part differs from its index", field="checkpoint",
                               value=f"{name}/{rel}")
    return data


def file_bytes(store: ObjectStore, name: str, rel: str) -> bytes:
    """One persisted file of a checkpoint, whole (e.g. to compare it with a local copy)."""
    index = read_index(store, name)
    entry = (index or {}).get("files", {}).get(rel)
    if entry is None:
        raise ObjectNotFound("no such persisted file", field="checkpoint", value=f"{name}/{rel}")
    manifests: dict[str, Any] = {}
    return b"".join(_part_bytes(store, name, rel, p, manifests) for p in entry["parts"])


_DEFAULT: JobFiles | None = None
_DEFAULT_LOCK = threading.Lock()


def default() -> JobFiles:
    """This process's persisted files (the spec's globs plus what integrations registered)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = JobFiles()
        return _DEFAULT


def persist(*paths: str | os.PathLike[str]) -> None:
    """Save these paths or globs (relative to the job directory) with every checkpoint."""
    default().add(*paths)


class _Tally:
    """Bytes moved so far: each step to `progress`, and a log line every PROGRESS_EVERY_S
    for a transfer large enough to be watched (64 MiB and up)."""

    def __init__(self, total: int, progress: Any, verb: str) -> None:
        self.total, self.progress, self.verb = total, progress, verb
        self.done, self._last_log = 0, 0.0

    def add(self, n: int) -> None:
        """Count n more bytes."""
        self.done += n
        if self.progress is not None:
            self.progress(self.done, self.total)
        now = time.monotonic()
        if self.total >= (64 << 20) and (now - self._last_log >= PROGRESS_EVERY_S
                                         or self.done == self.total):
            self._last_log = now
            log.info("persisted files: %d of %d bytes %s", self.done, self.total, self.verb)

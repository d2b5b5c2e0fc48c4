"""The job's code bundle: a tar.gz of its workdir, made at submit, extracted by the agent.

Extraction is defensive because a bundle crosses a trust boundary (any store
writer could plant one): every member is checked before anything is written,
and absolute paths, '..' parts, special files and links leaving the target
directory are refused.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Callable

from spotrun.errors import BadInputError

# Never worth shipping: VCS data, caches, virtual environments.
DEFAULT_EXCLUDES: tuple[str, ...] = (".git", "__pycache__", "*.pyc", ".venv", "venv",
                                     ".mypy_cache", ".pytest_cache")


def _excluded(name: str, excludes: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(name, pat) for pat in excludes)


def make_bundle(workdir: str | Path, dest: str | Path,
                excludes: tuple[str, ...] = DEFAULT_EXCLUDES) -> int:
    """Write workdir as a tar.gz at dest (member names relative); returns the file count."""
    root = Path(workdir).resolve()
    if not root.is_dir():
        raise BadInputError("must be an existing directory", field="workdir", value=str(workdir))
    count = 0
    with tarfile.open(dest, "w:gz") as tar:
        for dirpath, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not _excluded(d, excludes))
            here = Path(dirpath)
            for name in sorted(dirs) + sorted(files):
                if _excluded(name, excludes):
                    continue
                path = here / name
                rel = path.relative_to(root).as_posix()
                if path.is_symlink():
                    _check_symlink_inside(path, rel)
                tar.add(path, arcname=rel, recursive=False)
                if path.is_file() and not path.is_symlink():
                    count += 1
    return count


def _check_symlink_inside(path: Path, rel: str) -> None:
    target = os.readlink(path)
    if os.path.isabs(target) or not _inside(posixpath.dirname(rel), target):
        raise BadInputError("symlink points outside the workdir", field="workdir", value=rel,
                            hint="replace it with a copy or a link inside the workdir")


def _inside(base_rel: str, target: str) -> bool:
    """True when target, taken relative to the folder base_rel, stays inside the root."""
    joined = posixpath.normpath(posixpath.join(base_rel or ".", target))
    return joined != ".." and not joined.startswith("../") and not posixpath.isabs(joined)


def check_member(m: tarfile.TarInfo) -> None:
    """Raise BadInputError if extracting member m could write outside the target folder."""
    name = m.name
    parts = name.replace("\\", "/").split("/")
    if name.startswith("/") or os.path.isabs(name) or ".." in parts or (parts and ":" in parts[0]):
        raise BadInputError(f"unsafe path in bundle: {name}", field="bundle", value=name,
                            hint="members must be relative, without '..'")
    if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
        raise BadInputError(f"special file in bundle: {name}", field="bundle", value=name,
                            hint="only files, folders and links inside the bundle")
    if m.issym():
        if os.path.isabs(m.linkname) or not _inside(posixpath.dirname(name), m.linkname):
            raise BadInputError(f"symlink points outside the bundle: {name} -> {m.linkname}",
                                field="bundle",
                                value=f"{name} -> {m.linkname}")
    if m.islnk():
        link_parts = m.linkname.split("/")
        if m.linkname.startswith("/") or ".." in link_parts:
            raise BadInputError(f"hard link points outside the bundle: {name} -> {m.linkname}",
                                field="bundle",
                                value=f"{name} -> {m.linkname}")


def checked_members(tar: tarfile.TarFile, label: str) -> list[tarfile.TarInfo]:
    """Every member of an open archive, each passed through check_member (first bad one
    raises, naming it); a corrupt archive is bad input too."""
    try:
        members = tar.getmembers()
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise BadInputError(f"corrupt bundle: {exc}", field="bundle", value=label) from None
    for m in members:
        check_member(m)
    return members


def open_bundle(archive: str | Path) -> tarfile.TarFile:
    """An archive opened for reading, or bad input naming it."""
    try:
        return tarfile.open(archive, "r:gz")
    except (tarfile.TarError, OSError) as exc:
        raise BadInputError(f"not a readable tar.gz: {exc}", field="bundle",
                            value=str(archive)) from None


def check_bundle(archive: str | Path) -> int:
    """Check every member of a bundle without writing anything; returns the member count."""
    with open_bundle(archive) as tar:
        return len(checked_members(tar, str(archive)))


def extract_bundle(archive: str | Path, dest: str | Path,
                   skip: frozenset[str] = frozenset()) -> int:
    """Extract a bundle into dest after checking every member (names in skip are checked
    but not written); returns the member count."""
    target = Path(dest)
    with open_bundle(archive) as tar:
        members = checked_members(tar, str(archive))
        target.mkdir(parents=True, exist_ok=True)
        # The stdlib 'data' filter repeats the checks above as a second line of defence.
        tar.extractall(target, members=[m for m in members if m.name not in skip],
                       filter="data")
    return len(members)


def upload_bundle(store: Any, workdir: str | Path, key: str,
                  progress: Callable[[int, int], None] | None = None) -> None:
    """Pack workdir and put it in the store under key (progress: bytes done, total)."""
    with tempfile.TemporaryDirectory(prefix="spotrun-bundle-") as tmp:
        tar = Path(tmp) / "bundle.tar.gz"
        make_bundle(Path(workdir), tar)
        store.put_file(key, tar, progress=progress)


def drop_bundle(store: Any, key: str) -> None:
    """Delete an uploaded bundle no job row refers to (best effort: read by no one anyway)."""
    try:
        store.delete(key)
    except Exception:  # the caller's error is the one to report
        pass

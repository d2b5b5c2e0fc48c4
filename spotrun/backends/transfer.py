"""The remote CLI's transfers: pack the workdir and stream it with the spec (submit), and
download a pull archive and extract it with the bundle's path checks (pull)."""

from __future__ import annotations

import json
import tarfile
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from spotrun.backends.wire import PULL_SUMMARY
from spotrun.bundle import extract_bundle, make_bundle, open_bundle
from spotrun.errors import BadInputError, SpecError, SpotrunError
from spotrun.spec import read_spec_yaml

Progress = Callable[[int, int], None]
CHUNK_B = 1 << 20


def read_spec(spec_file: str) -> bytes:
    """A spec file's bytes, or the one-line error local validation gives."""
    path = Path(spec_file)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror}", field="file",
                        value=str(path)) from None


@contextmanager
def packed(spec_file: str) -> Iterator[tuple[bytes, Path | None]]:
    """The spec file's bytes and its workdir packed as a tar.gz (None: no workdir); the
    spec's other checks are the server's (it knows the catalog and zones)."""
    path = Path(spec_file)
    data = read_spec(spec_file)
    raw = read_spec_yaml(data, str(path))
    workdir = raw.get("workdir") if isinstance(raw, dict) else None
    if not isinstance(workdir, str):
        yield data, None
        return
    folder = (path.resolve().parent / workdir).resolve()
    if not folder.is_dir():
        raise SpecError(f"must be an existing directory; {folder} is "
                        f"{'a file' if folder.exists() else 'missing'}", field="workdir",
                        value=workdir)
    with tempfile.TemporaryDirectory(prefix="spotrun-bundle-") as tmp:
        bundle = Path(tmp) / "bundle.tar.gz"
        make_bundle(folder, bundle)
        yield data, bundle


def submission_body(spec_file: str, spec: bytes, bundle: Path | None,
                    progress: Progress | None) -> tuple[Iterator[bytes], int]:
    """The streamed submit body (spotrun.backends.wire) and its length in bytes."""
    line = json.dumps({"spec_file": Path(spec_file).name,
                       "spec": spec.decode("utf-8", errors="replace")}).encode() + b"\n"
    total = bundle.stat().st_size if bundle is not None else 0

    def chunks() -> Iterator[bytes]:
        yield line
        if bundle is None:
            return
        done = 0
        with open(bundle, "rb") as f:
            for chunk in iter(lambda: f.read(CHUNK_B), b""):
                yield chunk
                done += len(chunk)
                if progress is not None:
                    progress(done, total)
    return chunks(), len(line) + total


def peek_summary(archive: Path) -> dict[str, Any]:
    """A pull archive's summary (its `pull --json` object), or an error naming the server."""
    with open_bundle(archive) as tar:
        try:
            member = tar.extractfile(PULL_SUMMARY)
            summary = json.loads(member.read()) if member is not None else None
        except (KeyError, ValueError, tarfile.TarError, OSError, EOFError):
            summary = None
    if not isinstance(summary, dict):
        raise SpotrunError("the server's pull archive has no summary", field="server",
                           hint="is the server a spotrun server of the same version?")
    return summary


def extract_pull(archive: Path, dest: Path) -> dict[str, Any]:
    """Extract a pull archive into dest with the bundle's checks on every member (nothing
    is written when one would land outside dest); returns its summary (pull --json)."""
    summary = peek_summary(archive)
    try:
        extract_bundle(archive, dest, skip=frozenset({PULL_SUMMARY}))
    except BadInputError as exc:   # the server's archive, not the user's input: exit 1
        raise SpotrunError(f"refused the server's pull archive: {exc.message}",
                           field="server", hint="nothing was written") from None
    summary["to"] = str(dest.resolve())
    return summary

"""Code bundle: round trip, excludes, and refusal of anything escaping the target folder."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from spotrun.bundle import extract_bundle, make_bundle
from spotrun.errors import BadInputError


def test_round_trip_keeps_files_and_inside_links_and_drops_caches(tmp_path):
    wd = tmp_path / "wd"
    (wd / "pkg" / "__pycache__").mkdir(parents=True)
    (wd / ".git").mkdir()
    (wd / "train.py").write_text("print('hi')\n")
    (wd / "pkg" / "model.py").write_text("X = 1\n")
    (wd / "pkg" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    (wd / ".git" / "HEAD").write_text("ref\n")
    os.chmod(wd / "train.py", 0o755)
    os.symlink("pkg/model.py", wd / "model_link.py")
    archive = tmp_path / "b.tar.gz"
    assert make_bundle(wd, archive) == 2
    out = tmp_path / "out"
    extract_bundle(archive, out)
    assert (out / "train.py").read_text() == "print('hi')\n"
    assert os.access(out / "train.py", os.X_OK)
    assert (out / "pkg" / "model.py").read_text() == "X = 1\n"
    assert (out / "model_link.py").is_symlink() and (out / "model_link.py").read_text() == "X = 1\n"
    assert not (out / ".git").exists() and not (out / "pkg" / "__pycache__").exists()


def test_make_bundle_refuses_link_leaving_workdir(tmp_path):
    wd = tmp_path / "wd"
    wd.mkdir()
    os.symlink("/etc/passwd", wd / "passwd")
    with pytest.raises(BadInputError) as ei:
        make_bundle(wd, tmp_path / "b.tar.gz")
    assert ei.value.field == "workdir" and ei.value.value == "passwd"


def test_make_bundle_requires_a_directory(tmp_path):
    with pytest.raises(BadInputError):
        make_bundle(tmp_path / "missing", tmp_path / "b.tar.gz")


def _archive(path: Path, members: list[tarfile.TarInfo]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        ok = tarfile.TarInfo("ok.txt")
        ok.size = 2
        tar.addfile(ok, io.BytesIO(b"ok"))   # a harmless member first: must not be written
        for m in members:
            data = b"x" * m.size if m.isfile() else None
            tar.addfile(m, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str) -> tarfile.TarInfo:
    t = tarfile.TarInfo(name)
    t.size = 1
    return t


def _link(name: str, target: str, kind: bytes) -> tarfile.TarInfo:
    t = tarfile.TarInfo(name)
    t.type = kind
    t.linkname = target
    return t


def _dev(name: str) -> tarfile.TarInfo:
    t = tarfile.TarInfo(name)
    t.type = tarfile.CHRTYPE
    t.devmajor, t.devminor = 1, 3
    return t


@pytest.mark.parametrize("member", [
    _file("../evil.txt"),
    _file("a/../../evil.txt"),
    _file("/tmp/evil.txt"),
    _link("up", "../../outside", tarfile.SYMTYPE),
    _link("deep/up", "../../outside", tarfile.SYMTYPE),
    _link("abs", "/etc/passwd", tarfile.SYMTYPE),
    _link("hard", "../outside", tarfile.LNKTYPE),
    _link("hardabs", "/etc/passwd", tarfile.LNKTYPE),
    _dev("null"),
], ids=["dotdot", "nested-dotdot", "absolute", "symlink-up", "nested-symlink-up",
        "symlink-absolute", "hardlink-up", "hardlink-absolute", "device"])
def test_extract_refuses_escape_and_writes_nothing(tmp_path, member):
    archive = _archive(tmp_path / "evil.tar.gz", [member])
    out = tmp_path / "sandbox" / "out"
    with pytest.raises(BadInputError) as ei:
        extract_bundle(archive, out)
    assert ei.value.field == "bundle"
    assert not out.exists()
    assert not (tmp_path / "sandbox" / "evil.txt").exists() and not (tmp_path / "evil.txt").exists()


def test_extract_allows_link_within_bundle(tmp_path):
    archive = _archive(tmp_path / "fine.tar.gz", [_link("sub/l", "../ok.txt", tarfile.SYMTYPE)])
    out = tmp_path / "out"
    assert extract_bundle(archive, out) == 2
    assert (out / "sub" / "l").read_text() == "ok"


def test_extract_refuses_garbage(tmp_path):
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not a tarball")
    with pytest.raises(BadInputError):
        extract_bundle(bad, tmp_path / "out")

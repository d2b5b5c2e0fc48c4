"""Copying a checkpoint to another store (issue 43: the checkpoint follows a job that moves
cloud): real stores (file:// on disk, s3:// on moto, gs:// on fake-gcs-server, both on
127.0.0.1) and checkpoints saved the way a job with persisted files saves them. What is
checked is what the next attempt finds in the destination: the same bytes, a checkpoint that
verifies and is the resume point, the job's files restored as from the source; and that a
killed copy, a corrupt source or a stale save in the destination never leaves a checkpoint a
reader would trust."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from aws.moto_fixtures import moto, moto_server  # noqa: F401  (fixtures)
from gcp.gcs_emulator import gcs_emulator  # noqa: F401  (fixture)
from polling import wait_for
from test_store_contract import _gcs_store, _s3_store
import spotrun
from spotrun.checkpoints import (MANIFEST, checkpoint_name, jobfiles, resume_point,
                                 sha256_hex, torch_shard_name, verify, write_manifest)
from spotrun.checkpoints import transfer
from spotrun.checkpoints.transfer import JOURNAL, CopyReport, copy_checkpoint
from spotrun.errors import ChecksumMismatch, ObjectNotFound
from spotrun.store.base import ObjectStore
from spotrun.store.file import FileStore

SHARD_BYTES = 256 << 10


def _save(store: ObjectStore, jf: jobfiles.JobFiles, step: int, data: dict[str, bytes],
          own: dict[str, Path] | None = None) -> str:
    """One checkpoint as a job publishes it: persisted files, data files, manifest last."""
    name = checkpoint_name(step)
    capture = jf.capture(own, checkpoint=name)
    index_entry = jf.upload(store, name, capture)
    capture.discard()
    for fname, blob in data.items():
        store.put_bytes(f"{name}/{fname}", blob)
    files = {fname: {"size": len(b), "sha256": sha256_hex(b)} for fname, b in data.items()}
    write_manifest(store, step, {**files, jobfiles.INDEX: index_entry})
    jf.published(capture)
    return name


def _job_checkpoints(store: ObjectStore, tmp_path: Path, shards: int = 4,
                     extra: dict[str, bytes] | None = None) -> str:
    """Two checkpoints; the second's index lists blobs (a log that grew: two parts) and the
    first checkpoint's own file (weights the job also keeps in its directory, as a Trainer
    does). Returns the second's name."""
    job = tmp_path / "job"
    (job / "out").mkdir(parents=True)
    (job / "logs").mkdir()
    jf = jobfiles.JobFiles(job, ["out", "logs"], env={})
    weights = job / "out" / "w.bin"
    weights.write_bytes(os.urandom(100_000))
    log = job / "logs" / "metrics.csv"
    log.write_text("step,loss\n1,0.9\n")
    _save(store, jf, 1, {"weights.bin": weights.read_bytes()}, own={"weights.bin": weights})
    with open(log, "a") as f:
        f.write("2,0.8\n")
    data = {torch_shard_name(i): os.urandom(SHARD_BYTES) for i in range(shards)}
    return _save(store, jf, 2, {**data, **(extra or {})})


def _contents(store: ObjectStore) -> dict[str, bytes]:
    return {o.key: store.get_bytes(o.key) for o in store.list()}


def _restored(store: ObjectStore, name: str, dest: Path) -> dict[str, bytes]:
    jobfiles.restore(store, name, dest)
    return {p.relative_to(dest).as_posix(): p.read_bytes()
            for p in sorted(dest.rglob("*")) if p.is_file()}


def _assert_same_checkpoint(src: ObjectStore, dst: ObjectStore, name: str,
                            tmp_path: Path) -> None:
    """dst resumes exactly as src: same objects and bytes, verified, the job's files back."""
    assert _contents(dst) == _contents(src)
    assert verify(dst, name, deep=True).name == name
    resumed = resume_point(dst)
    assert resumed is not None and resumed.name == name
    assert _restored(dst, name, tmp_path / "from-dst") == \
        _restored(src, name, tmp_path / "from-src")


def test_file_to_file_copies_everything_a_resume_needs(tmp_path):
    src, dst = FileStore(tmp_path / "src"), FileStore(tmp_path / "dst")
    name = _job_checkpoints(src, tmp_path)
    index = jobfiles.read_index(src, name)
    assert index is not None and jobfiles.blobs_of(index)
    assert jobfiles.checkpoints_of(index) == {checkpoint_name(1)}

    report = copy_checkpoint(src, dst, name)

    _assert_same_checkpoint(src, dst, name, tmp_path)
    # The earlier checkpoint came whole: a restore reads its manifest for the file's SHA256.
    assert verify(dst, checkpoint_name(1), deep=True).step == 1
    total = sum(len(b) for b in _contents(src).values())
    assert (report.objects_copied, report.objects_skipped) == (len(src.list()), 0)
    assert report.bytes_copied == report.bytes_total == total
    assert report.to_dict() == {
        "name": name, "src_uri": src.uri, "dst_uri": dst.uri,
        "objects_copied": report.objects_copied, "objects_skipped": 0,
        "bytes_copied": total, "bytes_total": total, "seconds": report.seconds}
    assert not any(o.key.endswith(JOURNAL) for o in dst.list())


@pytest.mark.parametrize("direction", ["s3-to-gs", "gs-to-s3"])
def test_between_clouds(direction, request, tmp_path, monkeypatch):
    s3 = _s3_store(request.getfixturevalue("moto"))
    gs = _gcs_store(request.getfixturevalue("gcs_emulator"), monkeypatch)
    src, dst = (s3, gs) if direction == "s3-to-gs" else (gs, s3)
    # One object over the threshold: through temp files (get_file, put_file) both ways.
    monkeypatch.setattr(transfer, "LARGE_OBJECT_BYTES", 1 << 20)
    name = _job_checkpoints(src, tmp_path, extra={"big.bin": os.urandom(2 << 20)})

    report = copy_checkpoint(src, dst, name)

    _assert_same_checkpoint(src, dst, name, tmp_path)
    assert report.bytes_copied == report.bytes_total > 2 << 20


CHILD = """
import sys, threading
from spotrun.checkpoints.transfer import copy_checkpoint
from spotrun.store.file import FileStore

class SlowSource(FileStore):
    # Each read waits a little, so the copy is killed with some objects written, not all.
    def get_bytes(self, key, progress=None):
        threading.Event().wait(0.1)
        return super().get_bytes(key, progress)

copy_checkpoint(SlowSource(sys.argv[1]), FileStore(sys.argv[2]), sys.argv[3])
"""


def test_a_killed_copy_shows_no_checkpoint_and_the_next_one_keeps_what_it_wrote(tmp_path):
    src, dst = FileStore(tmp_path / "src"), FileStore(tmp_path / "dst")
    name = _job_checkpoints(src, tmp_path, shards=16)
    env = {**os.environ, "PYTHONPATH": str(Path(spotrun.__file__).resolve().parents[1])}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(src.root), str(dst.root), name],
                             env=env)
    try:
        wait_for(lambda: any(not o.key.endswith(JOURNAL) for o in dst.list()), 30,
                 "the copy's first object in dst")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    assert child.returncode == -signal.SIGKILL
    assert not dst.exists(f"{name}/{MANIFEST}") and resume_point(dst) is None
    there = {o.key for o in dst.list() if not o.key.endswith(JOURNAL)}
    assert there and len(there) < len(src.list())

    seen: list[tuple[int, int]] = []
    report = copy_checkpoint(src, dst, name, progress=lambda d, t: seen.append((d, t)))

    assert report.objects_skipped == len(there) >= 1
    assert report.objects_copied + report.objects_skipped == len(src.list())
    assert seen[0] == (report.bytes_total - report.bytes_copied, report.bytes_total)
    assert seen[-1] == (report.bytes_total, report.bytes_total)
    _assert_same_checkpoint(src, dst, name, tmp_path)


def test_a_stale_save_of_the_same_step_in_dst_is_replaced_not_kept(tmp_path):
    src, dst = FileStore(tmp_path / "src"), FileStore(tmp_path / "dst")
    name = _job_checkpoints(src, tmp_path)
    # A save of this step the job began in dst during an earlier stay there, killed before
    # its manifest: same files and sizes, other bytes. Sizes alone would keep them.
    for o in src.list(f"{name}/"):
        if not o.key.endswith(MANIFEST):
            dst.put_bytes(o.key, os.urandom(o.size))

    report = copy_checkpoint(src, dst, name)

    assert report.objects_skipped == 0
    _assert_same_checkpoint(src, dst, name, tmp_path)


def test_a_corrupt_source_object_stops_the_copy_before_any_manifest(tmp_path):
    src, dst = FileStore(tmp_path / "src"), FileStore(tmp_path / "dst")
    name = _job_checkpoints(src, tmp_path)
    shard = f"{name}/{torch_shard_name(1)}"
    path = src.local_path(shard)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01                   # bit rot: same size, one bit off
    path.write_bytes(bytes(data))

    with pytest.raises(ChecksumMismatch) as err:
        copy_checkpoint(src, dst, name)

    assert err.value.value == shard
    assert not dst.exists(f"{name}/{MANIFEST}") and resume_point(dst) is None
    assert not dst.exists(shard)
    with pytest.raises(ObjectNotFound) as missing:
        copy_checkpoint(src, dst, checkpoint_name(7))
    assert missing.value.value == f"{checkpoint_name(7)}/{MANIFEST}"


def test_progress_only_grows_and_ends_at_the_total(tmp_path, monkeypatch):
    src, dst = FileStore(tmp_path / "src"), FileStore(tmp_path / "dst")
    monkeypatch.setattr(transfer, "LARGE_OBJECT_BYTES", 1 << 20)
    name = _job_checkpoints(src, tmp_path, extra={"big.bin": os.urandom(9 << 20)})
    seen: list[tuple[int, int]] = []

    # One worker: the biggest object goes first, so the first steps are its own.
    report = copy_checkpoint(src, dst, name, progress=lambda d, t: seen.append((d, t)),
                             workers=1)

    done = [d for d, _ in seen]
    assert done == sorted(done) and {t for _, t in seen} == {report.bytes_total}
    assert seen[0] == (0, report.bytes_total)
    assert seen[-1] == (report.bytes_total, report.bytes_total)
    # The big object reports within itself: its read and its write, 4 MiB at a time.
    assert 0 < seen[1][0] < 9 << 20


def test_a_checkpoint_already_in_dst_copies_nothing(tmp_path):
    src, dst = FileStore(tmp_path / "src"), FileStore(tmp_path / "dst")
    name = _job_checkpoints(src, tmp_path)
    first = copy_checkpoint(src, dst, name)
    stamps = {o.key: (dst.local_path(o.key).stat().st_ino,
                      dst.local_path(o.key).stat().st_mtime_ns) for o in dst.list()}
    seen: list[tuple[int, int]] = []

    again = copy_checkpoint(src, dst, name, progress=lambda d, t: seen.append((d, t)))

    assert isinstance(again, CopyReport)
    assert (again.objects_copied, again.bytes_copied) == (0, 0)
    assert again.objects_skipped == first.objects_copied
    assert again.bytes_total == first.bytes_total
    assert seen == [(again.bytes_total, again.bytes_total)]
    assert {o.key: (dst.local_path(o.key).stat().st_ino,
                    dst.local_path(o.key).stat().st_mtime_ns) for o in dst.list()} == stamps

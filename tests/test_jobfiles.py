"""The job's persisted files (docs/job-spec.md, "persist"): captured with a checkpoint, restored.

Real files and the real file store; what is checked is what a resumed job finds in its
directory and what the store holds (blobs sent once, growing logs sent as tails, retention).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from spotrun import jobfiles
from spotrun.checkpoints import (apply_retention, list_complete, put_checkpoint_files,
                                 resume_point, verify)
from spotrun.errors import ChecksumMismatch
from spotrun.integrations._common import upload_files
from spotrun.store import open_store


def _save(jf: jobfiles.JobFiles, store, step: int, own=None) -> dict:
    """A checkpoint of `step` with the job's files, as a writer publishes it."""
    name = f"ckpt-{step:012d}"
    cap = jf.capture(own, checkpoint=name)
    entry = jf.upload(store, name, cap)
    cap.discard()
    put_checkpoint_files(store, step, {"weights.bin": f"w{step}".encode()})
    # put_checkpoint_files wrote the manifest without the index: publish again with it.
    from spotrun.checkpoints import read_manifest, write_manifest
    files = dict(read_manifest(store, name).files, **{jobfiles.INDEX: entry})
    write_manifest(store, step, files)
    jf.published(cap)
    return json.loads(store.get_bytes(f"{name}/{jobfiles.INDEX}"))


def _blobs(store) -> list[str]:
    return sorted(o.key for o in store.list("files/"))


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture()
def rig(tmp_path: Path):
    job = tmp_path / "job"
    (job / "logs").mkdir(parents=True)
    store = open_store((tmp_path / "store").as_uri())
    jf = jobfiles.JobFiles(job, ["logs", "best.txt"], env={})
    return job, store, jf


def test_restore_gives_back_the_files_of_the_saved_step_with_mode_and_mtime(rig, tmp_path):
    job, store, jf = rig
    (job / "logs" / "metrics.csv").write_text("step,loss\n1,0.9\n")
    (job / "best.txt").write_text("0.9")
    os.chmod(job / "best.txt", 0o600)
    (job / "notes.txt").write_text("not persisted")
    name = "ckpt-000000000001"
    cap = jf.capture(checkpoint=name)
    # Written after the capture: belongs to a later step, not to this checkpoint.
    (job / "logs" / "metrics.csv").write_text("step,loss\n1,0.9\n2,0.8\n")
    entry = jf.upload(store, name, cap)
    cap.discard()
    put_checkpoint_files(store, 1, {jobfiles.INDEX: store.get_bytes(f"{name}/{jobfiles.INDEX}")})
    assert entry["size"] == len(store.get_bytes(f"{name}/{jobfiles.INDEX}"))
    saved = {"logs/metrics.csv": b"step,loss\n1,0.9\n", "best.txt": b"0.9"}
    mtime = cap.files["best.txt"]["mtime_ns"]

    fresh = tmp_path / "other-instance" / "job"
    assert jobfiles.restore(store, name, fresh) == 2
    assert _tree(fresh) == saved
    assert (fresh / "best.txt").stat().st_mode & 0o777 == 0o600
    assert (fresh / "best.txt").stat().st_mtime_ns == mtime


def test_unchanged_files_are_not_sent_again_and_a_growing_log_sends_its_tail(rig, tmp_path):
    job, store, jf = rig
    log = job / "logs" / "events.jsonl"
    big = job / "logs" / "model.bin"
    log.write_text("".join(json.dumps({"step": i}) + "\n" for i in range(100)))
    big.write_bytes(os.urandom(100_000))
    _save(jf, store, 1)
    assert len(_blobs(store)) == 2
    with open(log, "a") as f:
        f.write(json.dumps({"step": 100}) + "\n")
    index = _save(jf, store, 2)
    parts = index["files"]["logs/events.jsonl"]["parts"]
    assert len(parts) == 2 and parts[1]["size"] == len(json.dumps({"step": 100}) + "\n")
    assert len(_blobs(store)) == 3   # the tail only; model.bin not sent again
    # A rewrite (not an append) is captured whole.
    log.write_text("rewritten\n")
    index = _save(jf, store, 3)
    assert len(index["files"]["logs/events.jsonl"]["parts"]) == 1
    fresh = tmp_path / "b"
    jobfiles.restore(store, "ckpt-000000000003", fresh)
    assert _tree(fresh) == _tree(job)


def test_files_that_are_the_checkpoints_own_are_referenced_not_sent_twice(rig, tmp_path):
    job, store, jf = rig
    jf.add(str(job / "out"))            # an absolute path inside the job dir
    ck = job / "out" / "checkpoint-5"
    ck.mkdir(parents=True)
    (ck / "model.safetensors").write_bytes(os.urandom(50_000))
    upload_own = {"model.safetensors": ck / "model.safetensors"}
    os.environ.pop(jobfiles.PERSIST_ENV, None)
    old = jobfiles._DEFAULT
    jobfiles._DEFAULT = jf
    try:
        upload_files(store, 5, upload_own, "test/1", keep=3)
    finally:
        jobfiles._DEFAULT = old
    index = json.loads(store.get_bytes(f"ckpt-000000000005/{jobfiles.INDEX}"))
    assert index["files"]["out/checkpoint-5/model.safetensors"]["parts"] == [
        {"ckpt": "ckpt-000000000005", "file": "model.safetensors", "size": 50_000}]
    assert _blobs(store) == []
    fresh = tmp_path / "c"
    jobfiles.restore(store, "ckpt-000000000005", fresh)
    assert (fresh / "out/checkpoint-5/model.safetensors").read_bytes() == \
        (ck / "model.safetensors").read_bytes()
    assert verify(store, "ckpt-000000000005").step == 5


def test_retention_keeps_blobs_and_checkpoints_a_kept_index_needs(rig):
    job, store, jf = rig
    (job / "best.txt").write_text("first")
    _save(jf, store, 1)
    (job / "logs" / "a.txt").write_text("a")
    _save(jf, store, 2)
    (job / "best.txt").write_text("second")
    _save(jf, store, 3)
    first_blob = jobfiles.blob_key(jobfiles._sha(b"first"))
    assert first_blob in _blobs(store)
    apply_retention(store, keep=1)
    assert list_complete(store) == ["ckpt-000000000003"]
    assert first_blob not in _blobs(store)               # only deleted checkpoints listed it
    assert jobfiles.blob_key(jobfiles._sha(b"a")) in _blobs(store)   # still listed by step 3
    # A Trainer-like reference to an older checkpoint's own file keeps that checkpoint.
    store2 = open_store(str(store.uri).replace("store", "store2"))
    jf2 = jobfiles.JobFiles(job, ["out"], env={})
    (job / "out").mkdir()
    (job / "out" / "w.bin").write_bytes(b"weights of 10")
    _save(jf2, store2, 10, own={"weights.bin": job / "out" / "w.bin"})
    (job / "out" / "log.txt").write_text("later")
    for step in (11, 12):
        _save(jf2, store2, step)
    apply_retention(store2, keep=1)
    assert list_complete(store2) == ["ckpt-000000000010", "ckpt-000000000012"]


def test_a_checkpoint_whose_persisted_blob_is_gone_is_not_a_resume_point(rig):
    job, store, jf = rig
    (job / "best.txt").write_text("one")
    _save(jf, store, 1)
    (job / "best.txt").write_text("two")
    _save(jf, store, 2)
    assert resume_point(store).step == 2
    store.delete(jobfiles.blob_key(jobfiles._sha(b"two")))
    with pytest.raises(ChecksumMismatch):
        verify(store, "ckpt-000000000002")
    assert resume_point(store).step == 1


def test_a_file_over_the_limit_is_skipped_and_listed(rig, tmp_path):
    job, store, _ = rig
    jf = jobfiles.JobFiles(job, ["logs"], env={jobfiles.MAX_FILE_ENV: "0.001"})
    (job / "logs" / "huge.bin").write_bytes(b"x" * 5000)
    (job / "logs" / "small.txt").write_text("ok")
    index = _save(jf, store, 1)
    assert list(index["files"]) == ["logs/small.txt"]
    assert index["skipped"][0]["path"] == "logs/huge.bin"
    assert jobfiles.MAX_FILE_ENV in index["skipped"][0]["reason"]


def test_nothing_outside_the_job_directory_is_taken(rig, tmp_path):
    job, store, jf = rig
    (tmp_path / "secret.txt").write_text("outside")
    (job / "logs" / "link.txt").symlink_to(tmp_path / "secret.txt")
    jf.add("../*", str(tmp_path / "secret.txt"))
    index = _save(jf, store, 1)
    assert index["files"] == {}


def test_dot_is_the_whole_job_directory_and_an_absolute_glob_is_ignored(tmp_path):
    # "." used to crash the save (Python 3.11's Path.glob raises IndexError on it).
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "a.txt").write_text("a")
    (tmp_path / "best.pt").write_text("b")
    assert sorted(jobfiles.collect(tmp_path, ["."])) == ["best.pt", "logs/a.txt"]
    assert jobfiles.collect(tmp_path, [str(tmp_path / "*"), ""]) == {}


def test_restored_folders_keep_the_order_of_their_files_mtimes(rig, tmp_path):
    """Trainer rotates checkpoint-N folders by mtime: a restore must not reorder them."""
    job, store, _ = rig
    jf = jobfiles.JobFiles(job, ["out"], env={})
    for i, step in enumerate((30, 10, 20)):   # written in this order
        folder = job / "out" / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "w.bin").write_text(str(step))
        os.utime(folder / "w.bin", ns=(10**18 + i * 10**9,) * 2)
    _save(jf, store, 1)
    fresh = tmp_path / "d"
    jobfiles.restore(store, "ckpt-000000000001", fresh)
    by_mtime = sorted((fresh / "out").iterdir(), key=lambda p: p.stat().st_mtime_ns)
    assert [p.name for p in by_mtime] == ["checkpoint-30", "checkpoint-10", "checkpoint-20"]

"""One contract for every object store: file:// on disk, s3:// on moto (127.0.0.1)."""

from __future__ import annotations

import hashlib
import threading
import os
from pathlib import Path

import pytest

from aws.moto_fixtures import MotoServer, moto, moto_server  # noqa: F401  (fixtures)
from spotrun import checkpoints
from spotrun.aws_clients import RetryPolicy, make_client
from spotrun.errors import ChecksumMismatch, ObjectNotFound, StoreError
from spotrun.store import ObjectStore, open_store
from spotrun.store.file import FileStore
from spotrun.store.s3 import MIN_PART_SIZE, S3Store

BUCKET = "spotrun-test"


def _s3_store(server: MotoServer) -> S3Store:
    client = make_client("s3", region="us-east-1", endpoint_url=server.url)
    client.create_bucket(Bucket=BUCKET)
    # Small pages and a low multipart threshold so pagination and parts are exercised.
    return S3Store(BUCKET, "root/prefix", client=client, page_size=2,
                   multipart_threshold=MIN_PART_SIZE, part_size=MIN_PART_SIZE,
                   retry=RetryPolicy(attempts=4, base_s=0.001, max_s=0.01))


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    """Each store kind, empty."""
    if request.param == "file":
        return FileStore(tmp_path / "store")
    return _s3_store(request.getfixturevalue("moto"))


def test_roundtrip_overwrite_and_exists(store):
    assert not store.exists("a/b.txt")
    store.put_bytes("a/b.txt", b"one")
    store.put_bytes("a/b.txt", b"two")
    assert store.get_bytes("a/b.txt") == b"two"
    assert store.exists("a/b.txt")


def test_missing_object_raises_not_found(store, tmp_path):
    with pytest.raises(ObjectNotFound):
        store.get_bytes("nope/x")
    with pytest.raises(ObjectNotFound):
        store.get_file("nope/x", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_put_if_absent_creates_once(store):
    assert store.put_if_absent("m/MANIFEST.json", b"first") is True
    assert store.put_if_absent("m/MANIFEST.json", b"second") is False
    assert store.get_bytes("m/MANIFEST.json") == b"first"


def test_list_is_sorted_paginated_and_prefix_filtered(store):
    keys = [f"jobs/j1/logs/{i:06d}.log" for i in (3, 0, 4, 1, 2)] + ["jobs/j10/x", "other/y"]
    for k in keys:
        store.put_bytes(k, k.encode())
    listed = store.list("jobs/j1/")
    assert [o.key for o in listed] == [f"jobs/j1/logs/{i:06d}.log" for i in range(5)]
    assert all(o.size == len(o.key) for o in listed)
    assert [o.key for o in store.list("jobs/j1")] == [o.key for o in listed] + ["jobs/j10/x"]
    assert len(store.list()) == 7


def test_delete_is_idempotent(store):
    store.put_bytes("d/x", b"1")
    store.delete("d/x")
    store.delete("d/x")
    assert not store.exists("d/x") and store.list("d/") == []


def test_sub_view_sees_only_its_prefix(store):
    store.put_bytes("jobs/j1/a", b"a")
    store.put_bytes("jobs/j2/b", b"b")
    sub = store.sub("jobs/j1")
    assert [o.key for o in sub.list()] == ["a"]
    sub.put_bytes("c/d", b"cd")
    assert store.get_bytes("jobs/j1/c/d") == b"cd"
    with pytest.raises(StoreError):
        sub.get_bytes("../j2/b")


def test_large_file_goes_up_in_parts_with_progress(store, tmp_path):
    src = tmp_path / "big.bin"
    data = os.urandom(2 * MIN_PART_SIZE + 12345)
    src.write_bytes(data)
    seen: list[tuple[int, int]] = []
    threads: set[str] = set()

    def progress(done: int, total: int) -> None:
        seen.append((done, total))
        threads.add(threading.current_thread().name)
    digest = store.put_file("ckpt/model.pt", src, progress=progress)
    assert digest == hashlib.sha256(data).hexdigest()
    assert seen[-1] == (len(data), len(data))
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    if isinstance(store, S3Store):
        # Three parts (a multipart ETag ends in -<parts>), sent by TransferManager's workers.
        etag = store.client.head_object(Bucket=store.bucket, Key=store._key("ckpt/model.pt"))
        assert etag["ETag"].strip('"').endswith("-3"), etag["ETag"]
        assert len(threads) >= 2, threads
    got: list[tuple[int, int]] = []
    store.get_file("ckpt/model.pt", tmp_path / "back.bin", progress=lambda d, t: got.append((d, t)))
    assert (tmp_path / "back.bin").read_bytes() == data
    assert got[-1] == (len(data), len(data))


def test_checkpoint_manifest_last_and_verified(store):
    ck = store.sub("checkpoints")
    checkpoints.put_checkpoint_files(ck, 10, {"model.pt": b"w" * 100, "opt.pt": b"o" * 50})
    # A partial checkpoint (data, no manifest) is never the latest.
    ck.put_bytes(f"{checkpoints.checkpoint_name(20)}/model.pt", b"partial")
    latest = checkpoints.latest_verified(ck)
    assert latest is not None and latest.step == 10
    checkpoints.put_checkpoint_files(ck, 30, {"model.pt": b"x" * 10})
    # Keep 1: step 10 goes, and so does the stale partial step 20.
    assert checkpoints.apply_retention(ck, keep=1) == [checkpoints.checkpoint_name(10),
                                                      checkpoints.checkpoint_name(20)]
    assert checkpoints.list_complete(ck) == [checkpoints.checkpoint_name(30)]


def test_open_store_by_uri(store):
    assert type(open_store(store.uri)) is type(store)


# ---------------------------------------------------------------- s3 only


def test_s3_corrupted_object_is_detected(moto):  # noqa: F811
    st = _s3_store(moto)
    st.put_bytes("x/data", b"good bytes")
    # Someone (or a broken server) changes the bytes but not the recorded SHA256.
    st.client.copy_object(Bucket=BUCKET, Key="root/prefix/x/data",
                          CopySource={"Bucket": BUCKET, "Key": "root/prefix/x/data"},
                          MetadataDirective="REPLACE", Metadata={"sha256": "0" * 64})
    with pytest.raises(ChecksumMismatch):
        st.get_bytes("x/data")


def test_s3_sends_sha256_checksums(moto):  # noqa: F811
    st = _s3_store(moto)
    st.put_bytes("k", b"payload")
    head = st.client.head_object(Bucket=BUCKET, Key="root/prefix/k", ChecksumMode="ENABLED")
    assert head.get("ChecksumSHA256")
    assert head["Metadata"]["sha256"] == hashlib.sha256(b"payload").hexdigest()


def test_s3_throttling_is_retried(moto):  # noqa: F811
    st = _s3_store(moto)
    moto.layer.fail("s3:PUT", "SlowDown", status=503, times=2)
    st.put_bytes("t/x", b"1")
    assert st.get_bytes("t/x") == b"1"
    assert [c.status for c in moto.layer.calls("s3:PUT")][-3:] == [503, 503, 200]


def test_s3_failed_multipart_is_aborted(moto, tmp_path):  # noqa: F811
    st = _s3_store(moto)
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(MIN_PART_SIZE + 10))
    moto.layer.fail("s3:PUT", "AccessDenied", status=403, times=None)
    with pytest.raises(StoreError):
        st.put_file("b/big", src)
    moto.layer.reset()
    assert st.client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []
    assert not st.exists("b/big")

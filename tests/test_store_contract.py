"""One contract for every object store: file:// on disk, s3:// on moto, gs:// on a GCS emulator
(fake-gcs-server), both on 127.0.0.1; each store's declared features included."""

from __future__ import annotations

import hashlib
import threading
import os
import random
from pathlib import Path

import pytest

from aws.moto_fixtures import MotoServer, moto, moto_server  # noqa: F401  (fixtures)
from gcp.gcs_emulator import GcsEmulator, gcs_emulator  # noqa: F401  (fixture)
from spotrun import checkpoints
from spotrun.aws_clients import RetryPolicy, make_client
from spotrun.errors import ChecksumMismatch, ConfigError, ObjectNotFound, StoreError
from spotrun.store import ObjectStore, StoreFeature, open_store
from spotrun.store.file import FileStore
from spotrun.store.gcs import GcsStore
from spotrun.store.progress import TransferProgress, network_progress
from spotrun.store.s3 import MIN_PART_SIZE, S3Store

BUCKET = "spotrun-test"


def _s3_store(server: MotoServer) -> S3Store:
    client = make_client("s3", region="us-east-1", endpoint_url=server.url)
    client.create_bucket(Bucket=BUCKET)
    # Small pages and a low multipart threshold so pagination and parts are exercised.
    return S3Store(BUCKET, "root/prefix", client=client, page_size=2,
                   multipart_threshold=MIN_PART_SIZE, part_size=MIN_PART_SIZE,
                   retry=RetryPolicy(attempts=4, base_s=0.001, max_s=0.01))


_gcs_buckets = iter(range(10**6))


def _gcs_store(emu: GcsEmulator, monkeypatch: pytest.MonkeyPatch) -> GcsStore:
    # A bucket per test (the emulator lives for the session); small pages, resumable chunks
    # and ranged reads so pagination, chunked uploads and streamed reads are exercised.
    bucket = emu.make_bucket(f"spotrun-test-{next(_gcs_buckets)}")
    # open_store() builds its own client: STORAGE_EMULATOR_HOST makes it anonymous, local.
    for k, v in emu.env.items():
        monkeypatch.setenv(k, v)
    return GcsStore(bucket, "root/prefix", client=emu.client(), page_size=2,
                    chunk_size=MIN_PART_SIZE, resumable_threshold=MIN_PART_SIZE,
                    read_chunk=1024 * 1024)


@pytest.fixture(params=["file", "s3", "gcs"])
def store(request: pytest.FixtureRequest, tmp_path: Path,
          monkeypatch: pytest.MonkeyPatch) -> ObjectStore:
    """Each store kind, empty."""
    if request.param == "file":
        return FileStore(tmp_path / "store")
    if request.param == "gcs":
        return _gcs_store(request.getfixturevalue("gcs_emulator"), monkeypatch)
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
    if isinstance(store, GcsStore):
        # One resumable upload in 5 MiB chunks: a progress call after each of the three.
        assert [d for d, _ in seen] == [MIN_PART_SIZE, 2 * MIN_PART_SIZE, len(data)]
        blob = store.bucket.get_blob(store._key("ckpt/model.pt"))
        assert blob.metadata == {"sha256": digest} and blob.size == len(data)
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


# ---------------------------------------------------------------- declared features

# What each store declares beyond the protocol (spotrun.store.base.StoreFeature).
DECLARED = {FileStore: {StoreFeature.LOCAL_PATH, StoreFeature.BUFFER_WRITES},
            S3Store: {StoreFeature.NETWORK},
            GcsStore: {StoreFeature.NETWORK, StoreFeature.BUFFER_WRITES}}


def test_declares_its_features_and_has_a_method_only_for_a_declared_one(store):
    assert isinstance(store, ObjectStore)
    assert store.features == DECLARED[type(store)]
    assert store.sub("jobs/j1").features == store.features
    # A feature named after a method (local_path): the method exists exactly where declared.
    assert hasattr(store, "local_path") == (StoreFeature.LOCAL_PATH in store.features)


def test_every_read_reports_its_bytes(store, tmp_path):
    data = os.urandom(3 * 1024 * 1024 + 7)
    store.put_bytes("r/obj", data)
    for read in (lambda p: store.get_bytes("r/obj", progress=p),
                 lambda p: store.get_file("r/obj", tmp_path / "out", progress=p)):
        seen: list[tuple[int, int]] = []
        got = read(lambda d, t: seen.append((d, t)))
        assert (got if got is not None else (tmp_path / "out").read_bytes()) == data
        assert seen and seen[-1] == (len(data), len(data))
        assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_a_network_store_shows_its_long_transfers(store):
    with network_progress(store, "restoring ckpt-1") as progress:
        shown = isinstance(progress, TransferProgress)
    assert shown == (StoreFeature.NETWORK in store.features)


def test_local_path_is_the_object_and_buffer_writes_take_a_view(store):
    data = bytearray(b"0123456789" * 100)
    payload = memoryview(data)[10:90] if StoreFeature.BUFFER_WRITES in store.features \
        else bytes(data[10:90])
    store.put_bytes("f/part", payload)
    assert store.get_bytes("f/part") == bytes(data[10:90])
    if StoreFeature.LOCAL_PATH in store.features:
        assert store.local_path("f/part").read_bytes() == bytes(data[10:90])
        assert store.sub("f").local_path("part") == store.local_path("f/part")


def test_no_module_asks_a_store_its_class_or_probes_it() -> None:
    # Callers read a store's declared features; its class (or a getattr) is no contract.
    import ast

    import spotrun
    root = Path(spotrun.__file__).resolve().parent
    classes = {"FileStore", "S3Store", "GcsStore"}
    asks = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and len(node.args) >= 2):
                continue
            first, second = (ast.unparse(a) for a in node.args[:2])
            if node.func.id == "isinstance" and any(c in second for c in classes):
                asks.append(f"{rel}:{node.lineno}")
            if node.func.id in ("getattr", "hasattr") and "store" in first.lower():
                asks.append(f"{rel}:{node.lineno}")
    assert asks == []


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


# ---------------------------------------------------------------- gs only


def _damage_on_disk(emu: GcsEmulator, st: GcsStore, key: str) -> None:
    """Flip one byte of the stored object behind the emulator's back (bit rot)."""
    path = emu.object_path(st.bucket_name, st._key(key))
    with open(path, "r+b") as f:
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 0xFF]))


def test_gcs_corrupted_object_is_detected(gcs_emulator, monkeypatch, tmp_path):  # noqa: F811
    st = _gcs_store(gcs_emulator, monkeypatch)
    st.put_bytes("x/data", b"good bytes")
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(3 * 1024 * 1024 + 7))
    st.put_file("x/big", big)
    _damage_on_disk(gcs_emulator, st, "x/data")
    _damage_on_disk(gcs_emulator, st, "x/big")
    with pytest.raises(ChecksumMismatch):
        st.get_bytes("x/data")
    with pytest.raises(ChecksumMismatch):
        st.get_bytes("x/big", progress=lambda d, t: None)
    with pytest.raises(ChecksumMismatch):
        st.get_file("x/big", tmp_path / "back.bin")
    assert not (tmp_path / "back.bin").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")] == []


def test_gcs_objects_carry_the_stored_crc32c_and_sha256(gcs_emulator, monkeypatch):  # noqa: F811
    import base64

    import google_crc32c
    st = _gcs_store(gcs_emulator, monkeypatch)
    st.put_bytes("k", b"payload")
    blob = st.bucket.get_blob("root/prefix/k")
    assert blob.crc32c == base64.b64encode(google_crc32c.Checksum(b"payload").digest()).decode()
    assert blob.metadata == {"sha256": hashlib.sha256(b"payload").hexdigest()}


def test_gcs_put_if_absent_has_exactly_one_winner(gcs_emulator, monkeypatch):  # noqa: F811
    st = _gcs_store(gcs_emulator, monkeypatch)
    results: list[bool] = []
    lock = threading.Lock()

    def create(i: int) -> None:
        won = st.put_if_absent("lock/owner", f"writer {i}".encode())
        with lock:
            results.append(won)
    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(results) == [False] * 7 + [True]
    assert st.get_bytes("lock/owner").startswith(b"writer ")


def test_gcs_reads_fail_when_the_object_is_replaced_midway(gcs_emulator, monkeypatch,
                                                          tmp_path):  # noqa: F811
    st = _gcs_store(gcs_emulator, monkeypatch)
    src = tmp_path / "v1.bin"
    src.write_bytes(b"1" * (3 * 1024 * 1024))
    st.put_file("obj", src)
    replaced: list[bool] = []

    def progress(done: int, total: int) -> None:
        # After the first 1 MiB range: a new version replaces the one being read.
        if not replaced:
            st.put_bytes("obj", b"2" * (3 * 1024 * 1024))
            replaced.append(True)
    # GCS answers 404 for the generation being read (ObjectNotFound); the emulator serves the
    # new version's bytes instead, which the CRC32C of the old one catches. Either way the read
    # fails and writes nothing: never half of one version and half of the other.
    with pytest.raises((ObjectNotFound, ChecksumMismatch)):
        st.get_file("obj", tmp_path / "out.bin", progress=progress)
    assert not (tmp_path / "out.bin").exists()
    assert st.get_bytes("obj") == b"2" * (3 * 1024 * 1024)


def test_gs_uri_opens_through_the_emulator_env(gcs_emulator, monkeypatch):  # noqa: F811
    bucket = gcs_emulator.make_bucket("spotrun-uri")
    for k, v in gcs_emulator.env.items():
        monkeypatch.setenv(k, v)
    st = open_store(f"gs://{bucket}/jobs")
    assert isinstance(st, GcsStore) and st.uri == f"gs://{bucket}/jobs"
    st.put_bytes("a", b"via uri")
    assert gcs_emulator.client().bucket(bucket).blob("jobs/a").download_as_bytes() == b"via uri"
    with pytest.raises(ConfigError, match="gs://bucket/prefix"):
        open_store("gs:///no-bucket")


def test_gcs_uploads_leave_the_jobs_random_stream_alone(gcs_emulator, monkeypatch,  # noqa: F811
                                                        tmp_path):
    # A checkpoint is uploaded from the training process: drawing the upload's multipart
    # boundary from the global `random` stream would change the job's random numbers, and a
    # resumed run would no longer be bitwise the uninterrupted one.
    st = _gcs_store(gcs_emulator, monkeypatch)
    big = tmp_path / "big"
    big.write_bytes(b"z" * (3 * 1024 * 1024))
    random.seed(7)
    expected = [random.random() for _ in range(3)]
    random.seed(7)
    st.put_bytes("rng/small", b"x")
    st.put_if_absent("rng/once", b"y")
    st.put_file("rng/big", big)
    assert [random.random() for _ in range(3)] == expected

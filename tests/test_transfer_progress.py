"""Progress of long transfers: S3 reads report their bytes (moto on 127.0.0.1), a checkpoint
restore from S3 or GCS (fake-gcs-server on 127.0.0.1) adds its shards up and shows them, and
the display shows only once a transfer is long."""

from __future__ import annotations

import io
import os

import pytest
import torch
from rich.console import Console
from structlog.testing import capture_logs

from aws.moto_fixtures import MotoServer, moto, moto_server  # noqa: F401  (fixtures)
from gcp.gcs_emulator import GcsEmulator, gcs_emulator  # noqa: F401  (fixture)
import spotrun.store.progress as progress_mod
from spotrun.aws_clients import RetryPolicy, make_client
from spotrun.store.base import ObjectStore
from spotrun.store.file import FileStore
from spotrun.store.gcs import GcsStore
from spotrun.store.progress import ByteTally, TransferProgress, network_progress
from spotrun.store.s3 import S3Store
from spotrun.torch import Checkpointer, RuntimeOptions, SaveOptions
from spotrun.torch.storage import read_checkpoint

BUCKET = "spotrun-progress"


@pytest.fixture
def s3(moto: MotoServer) -> S3Store:  # noqa: F811
    client = make_client("s3", region="us-east-1", endpoint_url=moto.url)
    client.create_bucket(Bucket=BUCKET)
    return S3Store(BUCKET, "p", client=client,
                   retry=RetryPolicy(attempts=3, base_s=0.001, max_s=0.01))


def test_s3_read_reports_bytes_summing_to_the_object_size(s3: S3Store):
    data = os.urandom(3 * 1024 * 1024 + 123)     # several 1 MiB chunks and a short last one
    s3.put_bytes("big", data)
    calls: list[tuple[int, int]] = []
    assert s3.get_bytes("big", progress=lambda d, t: calls.append((d, t))) == data
    steps = [b - a for (a, _), (b, _) in zip([(0, 0)] + calls, calls)]
    assert len(calls) >= 4 and all(s > 0 for s in steps)
    assert sum(steps) == len(data) and calls[-1] == (len(data), len(data))
    assert {t for _, t in calls} == {len(data)}


def test_restore_from_s3_reports_every_shard_byte(s3: S3Store):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 8))
    opt = torch.optim.Adam(model.parameters())
    ckpt = Checkpointer(model=model, optimizer=opt, store=s3,
                        runtime=RuntimeOptions(env={}, install_signal=False),
                        save=SaveOptions(shard_bytes=8 * 1024))
    ckpt.save(5, wait=True)
    ckpt.close()
    name = s3.list()[0].key.split("/")[0]
    seen: list[tuple[int, int]] = []
    _, meta, data = read_checkpoint(s3, name, readers=3,
                                    progress=lambda d, t: seen.append((d, t)))
    nbytes = int(meta["nbytes"])
    assert nbytes > 3 * 8 * 1024                    # several shards, read in parallel
    assert seen[-1] == (nbytes, nbytes) and len(data) == nbytes
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)   # the whole only grows
    with network_progress(s3, "restoring") as progress:
        assert isinstance(progress, TransferProgress)
    again = Checkpointer(model=model, optimizer=opt, store=s3,
                         runtime=RuntimeOptions(env={}, install_signal=False))
    assert again.restore() == 5      # the restore itself goes through network_progress
    again.close()


def _store(kind: str, request: pytest.FixtureRequest, tmp_path) -> ObjectStore:
    if kind == "s3":
        return request.getfixturevalue("s3")
    if kind == "gs":
        emu: GcsEmulator = request.getfixturevalue("gcs_emulator")
        return GcsStore(emu.make_bucket(f"spotrun-progress-{tmp_path.name.lower()}"[:60]),
                        "p", client=emu.client(), read_chunk=4 * 1024)
    return FileStore(tmp_path / "store")


@pytest.mark.parametrize("kind", ["s3", "gs", "file"])
def test_a_restore_over_the_network_shows_its_progress(kind, request, tmp_path, monkeypatch):
    # gs:// as s3:// (each declares NETWORK); file:// is a local copy and shows nothing.
    store = _store(kind, request, tmp_path)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 8))
    opt = torch.optim.Adam(model.parameters())
    ckpt = Checkpointer(model=model, optimizer=opt, store=store,
                        runtime=RuntimeOptions(env={}, install_signal=False),
                        save=SaveOptions(shard_bytes=8 * 1024))
    ckpt.save(5, wait=True)
    ckpt.close()
    # Every restore is "long" here, and off a terminal: each progress call is a log line.
    monkeypatch.setattr(progress_mod, "TransferProgress", lambda what: TransferProgress(
        what, after_s=0.0, every_s=0.0, console=Console(file=io.StringIO())))
    again = Checkpointer(model=model, optimizer=opt, store=store,
                         runtime=RuntimeOptions(env={}, install_signal=False))
    with capture_logs() as logs:
        assert again.restore() == 5
    again.close()
    lines = [(e["what"], e["bytes_done"], e["bytes_total"]) for e in logs
             if e["event"] == "transfer_progress"]
    if kind == "file":
        assert lines == []
        return
    what, done, total = lines[-1]
    assert what.startswith("restoring ckpt-") and done == total > 3 * 8 * 1024
    assert len(lines) > 3                               # shard by shard, not one line


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_short_transfers_show_nothing_long_ones_log_every_few_seconds():
    clock = Clock()
    off_terminal = Console(file=io.StringIO())
    with capture_logs() as logs, TransferProgress("restoring ckpt-1", after_s=2.0, every_s=5.0,
                                                  console=off_terminal, clock=clock) as p:
        p(10, 100)                      # t=0: too early to show
        clock.t += 2.5
        p(40, 100)                      # long now: one line
        clock.t += 1.0
        p(50, 100)                      # within every_s: no line
        clock.t += 5.0
        p(100, 100)
    lines = [(e["bytes_done"], e["bytes_total"]) for e in logs
             if e["event"] == "transfer_progress"]
    assert lines == [(40, 100), (100, 100)]


def test_a_long_transfer_on_a_terminal_draws_a_rich_bar():
    clock = Clock()
    out = io.StringIO()
    term = Console(file=out, force_terminal=True, width=100)
    with TransferProgress("restoring ckpt-7", console=term, clock=clock, after_s=1.0) as p:
        p(1, 10)
        assert out.getvalue() == ""
        clock.t += 1.5
        p(5, 10)
        assert p._bar is not None
    assert "restoring ckpt-7" in out.getvalue() and p._bar is None


def test_tally_sums_parts_reported_from_each_object():
    seen: list[tuple[int, int]] = []
    tally = ByteTally(lambda d, t: seen.append((d, t)), 30)
    a, b = tally.part("a"), tally.part("b")
    a(5, 10)
    b(20, 20)
    a(10, 10)
    assert seen == [(5, 30), (25, 30), (30, 30)]

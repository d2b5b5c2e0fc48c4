"""Copying a checkpoint between clouds (issue 43): gs:// <- s3://, one object at a time against
a few in flight (spotrun.checkpoints.transfer.copy_checkpoint's `workers`).

The source is moto's S3 server as its own process and the destination fake-gcs-server (the
emulators the tests use), both on 127.0.0.1, so the figure is the library's, the clients' and
the emulators' cost on this box, not a cloud link's: between real clouds each object waits on
round trips and a link, which is what objects in flight overlap. Each run copies the same
checkpoint (`--shards` data files of `--shard-mb` MiB, the layout spotrun.torch writes) into a
fresh prefix; the worker counts alternate so the box's load falls on both alike.

    .venv/bin/python bench/copy_checkpoint.py                        # 8 x 64 MiB, 3 rounds
    .venv/bin/python bench/copy_checkpoint.py --shards 16 --shard-mb 16
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

from aws.moto_fixtures import FAKE_ENV  # noqa: E402  (tests/aws/moto_fixtures.py)
from gcp.gcs_emulator import _free_port, start_emulator  # noqa: E402
from polling import wait_for  # noqa: E402

from spotrun.aws_clients import make_client  # noqa: E402
from spotrun.checkpoints import put_checkpoint_files, torch_shard_name  # noqa: E402
from spotrun.checkpoints.transfer import copy_checkpoint  # noqa: E402
from spotrun.store.gcs import GcsStore  # noqa: E402
from spotrun.store.s3 import S3Store  # noqa: E402


def start_moto(workdir: Path) -> tuple[subprocess.Popen, str]:
    """moto's server as a process of its own, so its CPU is not this process's."""
    port = _free_port()
    log = open(workdir / "moto.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            make_client("s3", region="us-east-1", endpoint_url=url).list_buckets()
            return True
        except Exception:  # noqa: BLE001 - not listening yet
            return False
    wait_for(up, 30, "moto to answer", interval_s=0.2)
    return proc, url


def main(argv: list[str] | None = None) -> int:
    """Time the copy with one worker and with several; print seconds and MB/s of each."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--shard-mb", type=int, default=64)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    os.environ.update(FAKE_ENV)
    work = Path(tempfile.mkdtemp(prefix="bench-copy-"))
    moto, url = start_moto(work)
    emu = start_emulator(work / "gcs")
    try:
        client = make_client("s3", region="us-east-1", endpoint_url=url)
        client.create_bucket(Bucket="src")
        src = S3Store("src", "job", client=client)
        shards = {torch_shard_name(i): os.urandom(args.shard_mb << 20)
                  for i in range(args.shards)}
        name = put_checkpoint_files(src, 1, shards).name
        nbytes = sum(len(b) for b in shards.values())
        bucket = emu.make_bucket("dst")
        gcs_client = emu.client()
        times: dict[int, list[float]] = {w: [] for w in args.workers}
        for r in range(args.rounds):
            for w in (args.workers if r % 2 == 0 else list(reversed(args.workers))):
                dst = GcsStore(bucket, f"run-{r}-{w}", client=gcs_client)
                report = copy_checkpoint(src, dst, name, workers=w)
                assert report.bytes_copied == report.bytes_total
                times[w].append(report.seconds)
                print(f"round {r} workers {w}: {report.seconds:.2f} s", flush=True)
        print(f"\n{args.shards} x {args.shard_mb} MiB ({nbytes / 1e6:.0f} MB), s3 (moto) -> "
              f"gs (fake-gcs-server), median of {args.rounds}:")
        for w, ts in times.items():
            med = statistics.median(ts)
            print(f"  workers {w}: {med:6.2f} s  {nbytes / med / 1e6:7.1f} MB/s  "
                  f"(min {min(ts):.2f}, max {max(ts):.2f})")
    finally:
        emu.stop()
        moto.terminate()
        moto.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())

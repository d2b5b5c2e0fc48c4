"""`spotrun logs` has an attempt's output up to its end when the instance had a notice: from
the notice on the agent ships the job's output as it comes, so what the job prints after it
(the emergency save's line, a validation result) is in the store before the reclaim."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

import agent_helpers
from agent_helpers import ImdsServer, make_config
from polling import wait_for
from spotrun import layout
from spotrun.agent.logship import LogShipper
from spotrun.agent.storeio import Reporter
from spotrun.bundle import make_bundle
from spotrun.secrets import Redactor
from spotrun.store import open_store

JOB = "job-logs"
# Trains until the notice, prints what a training script prints then, and trains on until
# the reclaim takes the instance (it never exits by itself).
# Plain print(): no flush, as most training scripts print.
TRAIN = r'''
import signal, time
noticed = []
signal.signal(signal.SIGUSR1, lambda s, f: noticed.append(1))
print("step 1 loss 0.9")
while not noticed:
    time.sleep(0.01)
print("emergency checkpoint at step 52")
print("val loss 0.4321")
print("last checkpoint at step 52")
while True:
    time.sleep(0.05)
'''


@pytest.fixture()
def imds():
    server = ImdsServer().start()
    yield server
    server.stop()


def _shipped(store_dir: Path) -> str:
    segs = sorted((store_dir / layout.log_prefix(JOB, 1)).glob("*.log"))
    return b"".join(p.read_bytes() for p in segs).decode()


def test_output_after_the_notice_is_in_the_store_before_the_reclaim(tmp_path, imds):
    store_dir = tmp_path / "store"
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(TRAIN)
    make_bundle(code, tmp_path / "bundle.tar.gz")
    open_store(store_dir.as_uri()).put_file(layout.bundle_key(JOB), tmp_path / "bundle.tar.gz")
    # The loop's own flush never comes within the test: what ships is the notice's doing.
    cfg = make_config(store_dir, imds.url, job_id=JOB, log_flush_interval_s=600.0,
                      command=f"{sys.executable} train.py")
    # An environment without PYTHONUNBUFFERED (a shell's, the local market's).
    proc, stderr = agent_helpers.start_agent(tmp_path, cfg, env={"PYTHONUNBUFFERED": ""})
    try:
        output = tmp_path / "agent-instance" / "spotrun-agent" / "output.log"
        wait_for(lambda: output.exists() and b"step 1" in output.read_bytes(), 30,
                 "the job's first line")
        imds.arm_notice("terminate", "2030-01-01T00:02:00Z")
        wait_for(lambda: "last checkpoint at step 52" in _shipped(store_dir), 15,
                 "the job's last line in the store")
    finally:
        proc.send_signal(signal.SIGKILL)   # the reclaim: the instance is gone at once
        proc.wait(timeout=10)
    assert _shipped(store_dir) == ("step 1 loss 0.9\nemergency checkpoint at step 52\n"
                                   "val loss 0.4321\nlast checkpoint at step 52\n"), \
        stderr.read_text()[-2000:]


def test_after_ship_now_output_ships_as_it_comes_until_the_final_flush(tmp_path):
    store = open_store((tmp_path / "store").as_uri())
    log = tmp_path / "output.log"
    log.write_bytes(b"before\n")
    shipper = LogShipper(Reporter(store), "logs/0001", log, Redactor(["pw123"]))
    shipper.ship_now()
    wait_for(lambda: shipper.seq == 1, what="what was there at the notice")
    with open(log, "ab") as f:
        f.write(b"after pw123\n")
    wait_for(lambda: shipper.seq == 2, what="output after the notice, with no flush called")
    assert shipper.flush() == 0          # the loop's flush leaves it to the follower
    with open(log, "ab") as f:
        f.write(b"end")
    shipper.flush(final=True)
    text = b"".join(store.get_bytes(o.key) for o in store.list("logs/0001/"))
    assert text == b"before\nafter ***\nend"
    shipper.ship_now()                   # after the final flush: nothing follows any more
    assert shipper._follower is not None and not shipper._follower.is_alive()

"""spotrun.torch across torchrun nodes (gloo on 127.0.0.1): a notice on one node saves the
whole job at one step; a save the writer must defer is deferred on every rank."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from spotrun.checkpoints import list_complete, read_manifest
from spotrun.store import open_store

from multinode_helpers import JOB_SCRIPT, free_port, torchrun_node
from polling import wait_for

pytestmark = pytest.mark.slow


def _kill(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:       # torchrun and its workers (own sessions), nothing else
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


@pytest.mark.parametrize("sharded", [False, True], ids=["unsharded", "sharded"])
def test_a_notice_on_one_node_during_evaluation_saves_every_rank_at_the_next_step(tmp_path,
                                                                                  sharded):
    hold, ckpts = tmp_path / "hold", tmp_path / "ckpt"
    hold.mkdir()
    endpoint = f"127.0.0.1:{free_port()}"
    args = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}", "--rdzv-id=notice", str(JOB_SCRIPT), "--steps", "12",
            "--every", "5", "--hold-at", "7", "--hold-dir", str(hold), "--timeout-s", "20"]
    if sharded:
        args.append("--sharded")
    procs = []
    try:
        for node in (0, 1):
            d = tmp_path / f"node{node}"
            procs.append(torchrun_node({
                "SPOTRUN_CHECKPOINT_URI": ckpts.as_uri(), "OMP_NUM_THREADS": "1",
                "SPOTRUN_PROGRESS_FILE": str(d / "progress.json"),
                "SPOTRUN_NOTICE_FILE": str(d / "notice.json"),
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                "PET_RDZV_CONF": f"is_host={1 - node}"}, d, args, tmp_path / f"node{node}.log"))
        wait_for(lambda: all((hold / f"held-{r}").exists() for r in (0, 1)), 120,
                 "both ranks to be in the evaluation at step 7")
        # The notice reaches node 1 only, as a file (its workers never see the agent's signal).
        (tmp_path / "node1" / "notice.json").write_text(json.dumps(
            {"action": "terminate", "time": None, "terminate_at_unix_s": None}))
        (hold / "release").write_text("")
        for p in procs:
            p.wait(timeout=120)
    finally:
        _kill(procs)
    logs = [(tmp_path / f"node{n}.log").read_text()[-3000:] for n in (0, 1)]
    assert [p.returncode for p in procs] == [0, 0], logs
    store = open_store(ckpts.as_uri())
    steps = sorted(read_manifest(store, n).step for n in list_complete(store))
    assert 8 in steps, steps          # the emergency save: step 8, the first boundary after it
    for node in (0, 1):               # every node's first rank reports the same save
        progress = _read(tmp_path / f"node{node}" / "progress.json")
        assert progress.get("emergency_checkpoint_step") == 8, (node, progress, logs)


SLOW_WRITER = r'''
import json, sys, threading
from datetime import timedelta
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from spotrun.store.file import FileStore
from spotrun.torch import Checkpointer, RuntimeOptions

class SlowStore(FileStore):
    """The writer's store takes its time: a persist is still in flight at the next save."""
    def put_bytes(self, key, data):
        threading.Event().wait(0.2)
        return super().put_bytes(key, data)

dist.init_process_group("gloo", timeout=timedelta(seconds=15))
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
ck = Checkpointer(model=model, optimizer=opt, store=SlowStore(sys.argv[1]), every_steps=1,
                  runtime=RuntimeOptions(env={}, install_signal=False))
ck.restore()
for step in range(6):
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
    ck.step(step + 1)
ck.finish(6)
sys.stdout.write(f"DEFERRED {rank} {ck.deferred}\n")   # one write: ranks share a pipe
sys.stdout.flush()
ck.close()
dist.destroy_process_group()
'''


def test_a_persist_in_flight_on_the_writer_defers_the_save_on_every_rank(tmp_path):
    script = tmp_path / "slow_writer.py"
    script.write_text(SLOW_WRITER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPOTRUN_", "PET_"))}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--nnodes=1",
         "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0", str(script),
         str(tmp_path / "ckpt")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        _kill([proc])
    assert proc.returncode == 0, out[-3000:]
    # Searched, not matched at a line start: the ranks and torchrun share one pipe.
    deferred = {r: int(n) for r, n in re.findall(r"DEFERRED (\d+) (\d+)", out)}
    assert set(deferred) == {"0", "1"}, out[-2000:]
    assert deferred["0"] > 0 and deferred["0"] == deferred["1"], out[-2000:]

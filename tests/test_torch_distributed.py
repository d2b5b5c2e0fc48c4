"""torchrun with two gloo ranks: rank 0 writes unsharded state; sharded state via DCP; both resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _worker(out: Path) -> None:
    """One rank: save at step 2, scramble, restore, check params and this rank's own RNG."""
    import torch
    import torch.distributed as tdist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from spotrun.torch import Checkpointer, RuntimeOptions, SaveOptions

    from datetime import timedelta
    tdist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = tdist.get_rank()
    result = {}
    for mode in ("unsharded", "sharded"):
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(4, 2))
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        kw = dict(uri=(out / mode).as_uri(), every_steps=2, keep=5,
                  save=SaveOptions(sharded=mode == "sharded"),
                  runtime=RuntimeOptions(env={}, install_signal=False))
        ck = Checkpointer(model=model, optimizer=opt, extras={"rank_seen": rank}, **kw)
        assert ck.restore() == 0
        torch.manual_seed(100 + rank)          # every rank has its own RNG stream
        for step in range(2):
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
            ck.step(step + 1)
        ck.finish(2)
        expect_draw = torch.rand(3).tolist()
        expect_params = [p.detach().clone() for p in model.parameters()]
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
        torch.manual_seed(999)
        extras: dict = {}
        ck2 = Checkpointer(model=model, optimizer=opt, extras=extras, **kw)
        start = ck2.restore()
        ok = (start == 2 and torch.rand(3).tolist() == expect_draw
              and all(torch.equal(a, b) for a, b in zip(model.parameters(), expect_params))
              and extras.get("rank_seen") == rank)
        result[mode] = {"ok": ok, "start": start, "progress_writer": ck.dist.is_writer}
        ck2.close()
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    tdist.destroy_process_group()


def test_torchrun_two_ranks_unsharded_and_sharded(tmp_path):
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTRUN_")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--nnodes=1",
         "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0", __file__, str(tmp_path)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        _, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:       # kill torchrun and its workers, nothing else
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    for rank in (0, 1):
        res = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for mode in ("unsharded", "sharded"):
            assert res[mode]["ok"], (rank, mode, res)
    from spotrun.checkpoints import verify
    from spotrun.store.file import FileStore
    unsharded = sorted(p.name for p in (tmp_path / "unsharded" / "ckpt-000000000002").iterdir())
    assert unsharded == ["MANIFEST.json", "data-000.bin", "meta.json"]
    sharded = [p.name for p in (tmp_path / "sharded" / "ckpt-000000000002").iterdir()]
    assert sum(n.endswith(".distcp") for n in sharded) == 2     # one shard file per rank
    for mode in ("unsharded", "sharded"):
        assert verify(FileStore(tmp_path / mode), "ckpt-000000000002").step == 2


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))

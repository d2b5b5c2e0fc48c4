"""The Checkpointer in-process: round trip, skipping bad checkpoints, retention, notice, failures."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import numpy as np  # noqa: E402

from polling import wait_for  # noqa: E402
from spotrun.checkpoints import apply_retention, list_complete, list_names, verify  # noqa: E402
from spotrun.errors import CheckpointError, ConfigError  # noqa: E402
from spotrun.store.file import FileStore  # noqa: E402
from spotrun.torch import (Checkpointer, NoticeOptions, RuntimeOptions, SaveOptions,  # noqa: E402
                           StatefulSampler, young_daly_s)

QUIET = RuntimeOptions(env={}, install_signal=False)   # no agent, SIGUSR1 left alone


def _objs(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    return model, opt, sched


def _train(model, opt, sched, n: int) -> None:
    for _ in range(n):
        x = torch.randn(4, 8) + float(np.random.rand()) + random.random()
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


def _ckpt(tmp_path: Path, model, opt, sched, **kw) -> Checkpointer:
    kw.setdefault("runtime", QUIET)
    return Checkpointer(model=model, optimizer=opt, scheduler=sched, store=FileStore(tmp_path),
                        **kw)


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def _saved_at(tmp_path: Path, steps: list[int], **kw) -> dict[int, torch.nn.Module]:
    """Train and save at each step; return deep copies of the model at each."""
    import copy
    model, opt, sched = _objs()
    kw.setdefault("keep", 10)
    ck = _ckpt(tmp_path, model, opt, sched, **kw)
    done, copies = 0, {}
    for s in steps:
        _train(model, opt, sched, s - done)
        done = s
        assert ck.save(s, wait=True)
        copies[s] = copy.deepcopy(model)
    ck.close()
    return copies


def test_round_trip_restores_everything_and_continues_identically(tmp_path):
    model, opt, sched = _objs()
    sampler = StatefulSampler(10, seed=3)
    scaler = torch.amp.GradScaler("cpu", init_scale=128.0)
    extras = {"sampler": sampler, "epoch": 2, "note": ("a", 1, 2.5, None, b"\x00")}
    _train(model, opt, sched, 5)
    it = iter(sampler)
    drawn = [next(it) for _ in range(4)]
    ck = _ckpt(tmp_path, model, opt, sched, scaler=scaler, extras=extras,
               save=SaveOptions(async_save=True))
    assert ck.save(5)
    ck.wait()
    assert ck.last_checkpoint_step == 5
    # What the uninterrupted run does next.
    _train(model, opt, sched, 3)
    expect_next = [next(it) for _ in range(3)]

    m2, o2, s2 = _objs(seed=99)
    sampler2 = StatefulSampler(10, seed=3)
    scaler2 = torch.amp.GradScaler("cpu", init_scale=1.0)
    extras2 = {"sampler": sampler2}
    ck2 = _ckpt(tmp_path, m2, o2, s2, scaler=scaler2, extras=extras2)
    assert ck2.restore() == 5
    assert extras2["epoch"] == 2 and extras2["note"] == ("a", 1, 2.5, None, b"\x00")
    assert scaler2.get_scale() == 128.0
    assert sampler2.position == 4 and s2.last_epoch == 5
    _train(m2, o2, s2, 3)
    assert _same(model, m2)
    assert list(iter(sampler2))[:3] == expect_next and drawn


def test_dtypes_shapes_and_views_survive(tmp_path):
    from spotrun.torch.flatten import Slot, decode, plan
    from spotrun.torch.snapshot import SnapshotBuffer
    tree = {"bf16": torch.randn(3, 5).to(torch.bfloat16), "scalar": torch.tensor(7.5),
            "bool": torch.tensor([True, False]), "empty": torch.empty(0, 3),
            "strided": torch.arange(20.0).reshape(4, 5)[:, 1::2], "i64": torch.arange(5),
            "np": np.arange(6, dtype=np.uint32).reshape(2, 3), 3: [1, (2, 3)], "nan": float("nan")}
    snap = SnapshotBuffer().capture(1, tree)
    meta = json.loads(json.dumps(snap.meta()))
    back = decode(meta["structure"], [Slot.from_json(s) for s in meta["slots"]], bytes(snap.data))
    for k in ("bf16", "scalar", "bool", "empty", "strided", "i64"):
        assert back[k].dtype == tree[k].dtype and torch.equal(back[k], tree[k]), k
    assert (back["np"] == tree["np"]).all() and back["np"].dtype == np.uint32
    assert back[3] == [1, (2, 3)] and back["nan"] != back["nan"]
    assert all(s.offset % 64 == 0 for s in plan(tree).slots)


def test_truncated_data_file_is_skipped_with_a_warning(tmp_path, caplog):
    copies = _saved_at(tmp_path, [3, 6])
    shard = tmp_path / "ckpt-000000000006" / "data-000.bin"
    shard.write_bytes(shard.read_bytes()[:-10])
    m, o, s = _objs(seed=5)
    with caplog.at_level(logging.WARNING):
        assert _ckpt(tmp_path, m, o, s).restore() == 3
    assert "ckpt-000000000006" in caplog.text
    assert _same(m, copies[3])


def test_flipped_byte_is_skipped(tmp_path):
    _saved_at(tmp_path, [3, 6])
    shard = tmp_path / "ckpt-000000000006" / "data-000.bin"
    raw = bytearray(shard.read_bytes())
    raw[100] ^= 0xFF
    shard.write_bytes(bytes(raw))
    m, o, s = _objs(seed=5)
    assert _ckpt(tmp_path, m, o, s).restore() == 3


def test_missing_manifest_is_skipped_with_a_warning(tmp_path, caplog):
    copies = _saved_at(tmp_path, [3, 6])
    (tmp_path / "ckpt-000000000006" / "MANIFEST.json").unlink()
    m, o, s = _objs(seed=5)
    with caplog.at_level(logging.WARNING):
        assert _ckpt(tmp_path, m, o, s).restore() == 3
    assert "ckpt-000000000006" in caplog.text
    assert _same(m, copies[3])


def test_fresh_start_returns_zero_and_named_resume_wins(tmp_path):
    m, o, s = _objs()
    assert _ckpt(tmp_path, m, o, s).restore() == 0
    copies = _saved_at(tmp_path, [2, 4, 6])
    m, o, s = _objs(seed=5)
    ck = _ckpt(tmp_path, m, o, s, runtime=RuntimeOptions(
        env={"SPOTRUN_RESUME_CHECKPOINT": "ckpt-000000000004"}, install_signal=False))
    assert ck.restore() == 4 and _same(m, copies[4])


def test_retention_keeps_n_and_never_the_newest_verified(tmp_path):
    _saved_at(tmp_path, [1, 2, 3, 4, 5], keep=2)
    store = FileStore(tmp_path)
    assert list_names(store) == ["ckpt-000000000004", "ckpt-000000000005"]
    # The newest complete checkpoint is corrupt: the newest verified one must survive keep=1.
    shard = tmp_path / "ckpt-000000000005" / "data-000.bin"
    shard.write_bytes(shard.read_bytes()[:-1])
    apply_retention(store, 1)
    assert "ckpt-000000000004" in list_names(store)
    m, o, s = _objs(seed=5)
    assert _ckpt(tmp_path, m, o, s).restore() == 4


def test_retention_runs_after_each_save(tmp_path):
    model, opt, sched = _objs()
    ck = _ckpt(tmp_path, model, opt, sched, keep=2, every_steps=1)
    for s in range(1, 6):
        _train(model, opt, sched, 1)
        ck.step(s)
        ck.wait()
    ck.close()
    assert list_complete(FileStore(tmp_path)) == ["ckpt-000000000004", "ckpt-000000000005"]
    assert ck.buffer.allocations == 1        # one host buffer, reused by every save


def test_sigusr1_makes_the_next_step_save_and_report(tmp_path):
    model, opt, sched = _objs()
    progress = tmp_path / "progress.json"
    ck = Checkpointer(model=model, optimizer=opt, scheduler=sched, store=FileStore(tmp_path / "s"),
                      runtime=RuntimeOptions(env={"SPOTRUN_PROGRESS_FILE": str(progress),
                                                  "SPOTRUN_TOTAL_STEPS": "10",
                                                  "SPOTRUN_CHECKPOINT_INTERVAL_S": "100000"}),
                      notice=NoticeOptions(grace_s=600.0))   # the boundary, not the watchdog, saves
    try:
        assert signal.getsignal(signal.SIGUSR1) == ck.guard._on_signal
        _train(model, opt, sched, 1)
        assert ck.step(1) is False
        os.kill(os.getpid(), signal.SIGUSR1)   # the handler only records the notice
        # Delivered to the watchdog thread (the main thread has it blocked), so not at once.
        wait_for(lambda: ck.guard.pending, timeout_s=30, what="the notice to be received")
        assert list_names(FileStore(tmp_path / "s")) == []
        _train(model, opt, sched, 1)
        assert ck.step(2) is True
        fields = json.loads(progress.read_text())
        assert fields["emergency_checkpoint_step"] == 2 and fields["last_checkpoint_step"] == 2
        assert fields["total_steps"] == 10 and fields["emergency_save_s"] > 0
        assert verify(FileStore(tmp_path / "s"), "ckpt-000000000002").step == 2
    finally:
        ck.close()
    assert signal.getsignal(signal.SIGUSR1) != ck.guard._on_signal


def test_persist_failure_is_retried_then_surfaces_on_next_step(tmp_path, caplog):
    model, opt, sched = _objs()
    # A plain file where the checkpoint folder must go: every write fails in the OS.
    (tmp_path / "ckpt-000000000001").write_text("in the way")
    ck = _ckpt(tmp_path, model, opt, sched, every_steps=1,
               save=SaveOptions(retries=2, retry_backoff_s=0.001))
    _train(model, opt, sched, 1)
    with caplog.at_level(logging.WARNING):
        assert ck.step(1) is True           # snapshot taken, persist in the background
        ck.persister.wait()
        with pytest.raises(CheckpointError, match="3 tries"):
            ck.step(2)
    assert caplog.text.count("persist try") == 3


class _FlakyStore(FileStore):
    """A real FileStore whose first data write fails (a transient network error)."""

    fails = 1

    def put_bytes(self, key, data):
        if key.endswith(".bin") and self.fails:
            self.fails -= 1
            raise OSError("connection reset")
        super().put_bytes(key, data)


def test_transient_persist_failure_is_retried(tmp_path):
    model, opt, sched = _objs()
    ck = Checkpointer(model=model, optimizer=opt, store=_FlakyStore(tmp_path), runtime=QUIET,
                      save=SaveOptions(retry_backoff_s=0.001))
    assert ck.save(1)
    ck.wait()
    assert ck.last_checkpoint_step == 1
    verify(FileStore(tmp_path), "ckpt-000000000001")


class _GatedStore(FileStore):
    """A real FileStore whose data writes hold until released (a slow upload)."""

    def __init__(self, root):
        super().__init__(root)
        self.writing = threading.Event()
        self.release = threading.Event()

    def put_bytes(self, key, data):
        if key.endswith(".bin"):
            self.writing.set()
            assert self.release.wait(30)
        super().put_bytes(key, data)


def test_emergency_save_abandons_a_slow_in_flight_persist(tmp_path):
    model, opt, sched = _objs()
    store = _GatedStore(tmp_path)
    ck = Checkpointer(model=model, optimizer=opt, store=store, runtime=QUIET,
                      save=SaveOptions(shard_bytes=256))
    assert ck.save(1)
    assert store.writing.wait(30) and ck.persister.busy
    _train(model, opt, sched, 1)
    ck.notice()   # what the SIGUSR1 handler does
    # Release the stuck upload only once the abandon was requested.
    threading.Thread(target=lambda: (ck.persister._cancel.wait(30), store.release.set())).start()
    assert ck.step(2) is True
    assert ck.emergency_checkpoint_step == 2
    store.release.set()
    assert list_complete(FileStore(tmp_path)) == ["ckpt-000000000002"]


def test_bad_settings_are_config_errors(tmp_path):
    model, opt, _ = _objs()
    with pytest.raises(ConfigError, match="SPOTRUN_CHECKPOINT_URI"):   # under spotrun, no URI
        Checkpointer(model=model, optimizer=opt,
                     runtime=RuntimeOptions(env={"SPOTRUN_JOB_ID": "j-1"}, install_signal=False))
    with pytest.raises(ConfigError, match="SPOTRUN_CHECKPOINT_INTERVAL_S"):
        Checkpointer(model=model, store=FileStore(tmp_path), runtime=RuntimeOptions(
            env={"SPOTRUN_CHECKPOINT_INTERVAL_S": "soon"}, install_signal=False))


def test_auto_interval_follows_young_daly(tmp_path):
    assert young_daly_s(2.0, 3600.0) == pytest.approx((2 * 2.0 * 3600.0) ** 0.5)
    assert young_daly_s(1e-6, 10.0) == 30.0
    model, opt, _ = _objs()
    ck = Checkpointer(model=model, optimizer=opt, store=FileStore(tmp_path),
                      runtime=RuntimeOptions(env={"SPOTRUN_CHECKPOINT_INTERVAL_S": "auto"},
                                             install_signal=False),
                      save=SaveOptions(mtbf_s=7200.0))
    ck.save(1, wait=True)
    assert ck.interval_s == young_daly_s(ck.checkpoint_save_s, 7200.0)


def test_overlapped_snapshot_captures_the_state_at_save_time(tmp_path):
    import copy
    model, opt, sched = _objs()
    _train(model, opt, sched, 2)
    at_save = copy.deepcopy(model)
    opt_at_save = copy.deepcopy(opt.state_dict())
    ck = _ckpt(tmp_path, model, opt, sched)
    assert ck.save(2)
    assert ck._copying is not None          # parameters and Adam state copy in the background
    _train(model, opt, sched, 3)            # optimizer.step waits for that copy (pre-hook)
    ck.wait()
    m2, o2, s2 = _objs(seed=7)
    assert _ckpt(tmp_path, m2, o2, s2).restore() == 2
    assert _same(m2, at_save)
    assert all(torch.equal(o2.state_dict()["state"][k]["exp_avg"], v["exp_avg"])
               for k, v in opt_at_save["state"].items())
    assert not _same(model, at_save)

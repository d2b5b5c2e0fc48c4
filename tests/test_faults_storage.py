"""Checkpoint store faults: the daemon judges checkpoints as the agent and the library do,
and a corrupt manifest is replaced by the next save of its step instead of blocking it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from spotrun.agent.config import AgentConfig  # noqa: E402
from spotrun.agent.setup import find_resume_point  # noqa: E402
from spotrun.checkpoints import (MANIFEST, checkpoint_name, put_checkpoint_files,  # noqa: E402
                                 read_manifest, verify)
from spotrun.config import load_settings  # noqa: E402
from spotrun.daemon.context import DaemonContext  # noqa: E402
from spotrun.db import open_db  # noqa: E402
from spotrun.store.file import FileStore  # noqa: E402
from spotrun.torch import Checkpointer, RuntimeOptions, SaveOptions  # noqa: E402


def _model(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _ckpt(store: FileStore, seed: int, **kw) -> Checkpointer:
    model, opt = _model(seed)
    return Checkpointer(model=model, optimizer=opt, store=store, keep=10,
                        runtime=RuntimeOptions(env={}, install_signal=False), **kw)


def _flip_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))       # same size, other bytes


def test_resume_point_of_the_daemon_is_where_the_job_really_resumes(tmp_path: Path):
    ckpt_dir = tmp_path / "ckpt"
    store = FileStore(ckpt_dir)
    ck = _ckpt(store, seed=0, save=SaveOptions(shard_bytes=256))
    for step in (5, 10):
        assert ck.save(step, wait=True)
    ck.close()
    shard = ckpt_dir / checkpoint_name(10) / "data-001.bin"
    size = shard.stat().st_size
    _flip_one_byte(shard)
    assert shard.stat().st_size == size

    # The daemon: the step it records as the next attempt's start (what `status` shows).
    settings = load_settings(str(tmp_path / "home"))
    engine = open_db(settings.database_url)
    ctx = DaemonContext(engine=engine, settings=settings, provider=None, store=store)
    daemon_step = ctx.checkpointed_step("job-1", store.uri, fallback=0)
    engine.dispose()
    # The agent picks the resume checkpoint; the library restores it (or an older one).
    config = AgentConfig(job_id="job-1", attempt=2, store_uri=store.uri,
                         checkpoint_uri=store.uri, command="true")
    picked = find_resume_point(config, checkpoint_store=store)
    job_step = _ckpt(store, seed=1, resume=picked).restore()
    assert job_step == 5
    assert daemon_step == job_step


def test_layout_rules_are_shared_a_shard_missing_from_the_manifest_is_refused(tmp_path: Path):
    store = FileStore(tmp_path / "ckpt")
    ck = _ckpt(store, seed=0, save=SaveOptions(shard_bytes=256))
    assert ck.save(5, wait=True) and ck.save(10, wait=True)
    ck.close()
    # Rewrite step 10's manifest without its last shard: sizes and hashes of what is listed
    # still match, but the buffer is short. Neither the daemon nor the library may use it.
    import json
    name = checkpoint_name(10)
    doc = json.loads((tmp_path / "ckpt" / name / MANIFEST).read_bytes())
    last = sorted(k for k in doc["files"] if k.startswith("data-"))[-1]
    del doc["files"][last]
    (tmp_path / "ckpt" / name / MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(Exception):
        verify(store, name)
    settings = load_settings(str(tmp_path / "home"))
    engine = open_db(settings.database_url)
    ctx = DaemonContext(engine=engine, settings=settings, provider=None, store=store)
    assert ctx.checkpointed_step("job-1", store.uri, fallback=0) == 5
    engine.dispose()
    assert _ckpt(store, seed=1).restore() == 5


def test_a_corrupt_manifest_is_replaced_by_the_next_save_of_its_step(tmp_path: Path):
    store = FileStore(tmp_path / "ckpt")
    put_checkpoint_files(store, 7, {"state.json": b'{"step": 7}'})
    manifest = tmp_path / "ckpt" / checkpoint_name(7) / MANIFEST
    manifest.write_bytes(b"\x00{ not json")
    # The torch-free writer (agents' own workloads) ...
    m = put_checkpoint_files(store, 7, {"state.json": b'{"step": 7, "again": 1}'})
    assert m.step == 7 and verify(store, checkpoint_name(7)).step == 7
    # ... and the training library, for every later save of that step.
    manifest.write_bytes(b"garbage")
    ck = _ckpt(store, seed=3)
    assert ck.save(7, wait=True)
    ck.close()
    assert read_manifest(store, checkpoint_name(7)).extra.get("kind") == "spotrun.torch/1"
    assert _ckpt(store, seed=4).restore() == 7


def test_status_shows_the_step_the_job_really_resumed_from(tmp_home: Path, tmp_path: Path):
    """End to end: the daemon launches a job whose newest checkpoint has a shard altered with
    the same size; `status` must name the start step the job's own process resumed from."""
    import json
    import subprocess
    import sys

    from conftest import kill_leftovers, write_trace
    from daemon_helpers import DaemonProc, live_instance_pids, write_home, write_job
    from polling import wait_for
    from spotrun.jobs import submit, validate_submission
    from spotrun.store import open_store

    trace = write_trace(tmp_path / "trace.csv", {"za": [1] * 40}, tick_s=600.0)
    write_home(tmp_home, trace)
    settings = load_settings(str(tmp_home))
    sub = validate_submission(write_job(tmp_path, "resumer", steps=30), settings)
    ckpts = open_store(sub.checkpoint_uri)
    for step in (5, 10):      # what an earlier attempt left: the torch-free workload's format
        put_checkpoint_files(ckpts, step, {"state.json": json.dumps({"step": step}).encode()})
    state = Path(sub.checkpoint_uri[len("file://"):]) / checkpoint_name(10) / "state.json"
    state.write_bytes(state.read_bytes().replace(b"10", b"99"))     # same size
    engine = open_db(settings.database_url)
    job_id = submit(sub, engine).id
    engine.dispose()

    def cli(*args: str) -> subprocess.CompletedProcess:
        env = dict(os.environ, SPOTRUN_HOME=str(tmp_home))
        env.pop("SPOTRUN_DB_URL", None)
        return subprocess.run([sys.executable, "-m", "spotrun", *args], env=env, text=True,
                              capture_output=True, timeout=120)

    def done() -> bool:
        out = cli("status", job_id, "--json")
        return out.returncode == 0 and json.loads(out.stdout)["state"] == "succeeded"

    daemon = DaemonProc(tmp_home, tmp_path / "daemon.log")
    try:
        wait_for(done, 120, "the job to succeed")
    finally:
        daemon.terminate()
        kill_leftovers(tmp_home / "market")
    first = json.loads(cli("status", job_id, "--json").stdout)["attempts"][0]
    logs = cli("logs", job_id).stdout
    really = int(logs.split("start ", 1)[1].split()[0])   # the workload prints "start N"
    assert really == 5
    assert first["start_step"] == really
    assert not live_instance_pids(tmp_home)

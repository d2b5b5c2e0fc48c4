"""The agent's part of the reclaim truth (issue 40), as a real `spotrun agent` process: it
reports its way back to training (started, restored, first new step) and, after a notice,
a heartbeat at every new step, since a reclaim kills it before any exit report."""

from __future__ import annotations

import json
import signal
import sys
from datetime import datetime
from pathlib import Path

import pytest

import agent_helpers
from agent_helpers import imds, make_config, read_json  # noqa: F401 (fixture)
from polling import wait_for
from spotrun import layout
from spotrun.bundle import make_bundle
from spotrun.checkpoints import put_checkpoint_files
from spotrun.store import open_store

JOB = "job-test"
# A torch-free job that reports its progress as spotrun's library does: its first write
# (step 0) before the restore, the restored step once restored, then at most once a second,
# and at every step once SIGUSR1 (the notice) came; its steps then slow down, so each one
# is seen on its own.
WORKLOAD = r'''
import json, os, signal, threading, time
progress = os.environ["SPOTRUN_PROGRESS_FILE"]
resume = os.environ.get("SPOTRUN_RESUME_CHECKPOINT", "")
start = int(resume.split("-")[1]) if resume else 0
noticed = threading.Event()
signal.signal(signal.SIGUSR1, lambda s, f: noticed.set())
pause = threading.Event()
written = [0.0]

def write(step):
    with open(progress + ".tmp", "w") as f:
        json.dump({"step": step, "total_steps": 1000000}, f)
    os.replace(progress + ".tmp", progress)
    written[0] = time.monotonic()

write(0)
pause.wait(0.3)    # the restore
write(start)
step = start
while True:
    pause.wait(0.4 if noticed.is_set() else 0.05)   # one step's work
    step += 1
    if noticed.is_set() or time.monotonic() - written[0] >= 1.0:
        write(step)
'''


@pytest.fixture()
def agent_proc(tmp_path: Path, imds):
    """A running agent resumed from a checkpoint at step 5, beating every 30 s on its own."""
    root = tmp_path / "store"
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    (workdir / "train.py").write_text(WORKLOAD)
    make_bundle(workdir, tmp_path / "bundle.tar.gz")
    open_store(root.as_uri()).put_file(layout.bundle_key(JOB), tmp_path / "bundle.tar.gz")
    cfg = make_config(root, imds.url, heartbeat_interval_s=30.0, notice_poll_interval_s=0.2,
                      command=f"{sys.executable} train.py")
    put_checkpoint_files(open_store(cfg.checkpoint_uri), 5, {"state.json": b"{}"})
    proc, _stderr = agent_helpers.start_agent(tmp_path, cfg)
    yield proc, root / layout.heartbeat_key(JOB, 1), tmp_path / "agent-instance"
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except Exception:
            proc.kill()
            proc.wait()


def _progress_step(instance: Path) -> int | None:
    found = [p for p in instance.rglob("progress.json")]
    body = read_json(found[0]) if found else None
    return body.get("step") if body else None


def test_agent_reports_its_way_back_and_beats_every_step_after_a_notice(agent_proc, imds):
    proc, hb_path, instance = agent_proc
    beat = wait_for(lambda: (hb := read_json(hb_path)) and hb.get("first_step_at") and hb,
                    timeout_s=30, what="a heartbeat with the first new step")
    assert beat["resumed_from"] == 5
    times = [datetime.fromisoformat(beat[k]) for k in
             ("restore_started_at", "restore_done_at", "first_step_at")]
    assert times == sorted(times)   # started, then restored (step 5 shown), then step 6+
    imds.arm_notice("terminate", "2030-01-01T00:02:00Z")
    wait_for(lambda: (read_json(hb_path) or {}).get("notice") is True, what="notice beat")
    # From the notice on, the last heartbeat follows the job's every step (the regular beat
    # is 30 s away): whenever the reclaim comes, the heartbeat holds the job's last step.
    for _ in range(3):
        now = wait_for(lambda: _progress_step(instance), what="the job's progress")
        wait_for(lambda: ((read_json(hb_path) or {}).get("step") or 0) >= now,
                 timeout_s=5, what=f"a heartbeat at the job's step {now}")
    assert proc.poll() is None
    assert json.loads(hb_path.read_text())["first_step_at"] == beat["first_step_at"]   # once

"""Issue 23, point 5, at the library level: the notice lands during a long validation.

A plain loop (tests/torch_jobs/plain_val_loop.py) logs its training loss from a forward
after the update, the model still in train mode; a BatchNorm model's train-mode forward
used to mark the state "a step has started", so the watchdog never saved, the loop never
reached another step boundary, and the notice during the validation that followed saved
nothing (the next attempt resumed at the last periodic checkpoint, 80 of 100).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from polling import wait_for  # noqa: E402
from spotrun.agent.child import signal_group, spawn, write_notice_file  # noqa: E402
from spotrun.checkpoints import list_complete  # noqa: E402
from spotrun.store.file import FileStore  # noqa: E402
from spotrun.torch import Checkpointer, RuntimeOptions  # noqa: E402

QUIET = RuntimeOptions(env={}, install_signal=False)   # no agent, SIGUSR1 left alone

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "torch_jobs" / "plain_val_loop.py"
NOTICE_WALL_S = 12.0


def _progress(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}


@pytest.mark.slow
def test_notice_during_a_long_validation_saves_the_last_step_before_the_deadline(tmp_path,
                                                                                cpu_load):
    store_dir, progress, notice = tmp_path / "ckpt", tmp_path / "progress.json", tmp_path / "n.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTRUN_")}
    env.update(SPOTRUN_CHECKPOINT_URI=store_dir.as_uri(), SPOTRUN_PROGRESS_FILE=str(progress),
               SPOTRUN_NOTICE_FILE=str(notice), SPOTRUN_TOTAL_STEPS="100")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    log = tmp_path / "job.log"
    # The agent's own spawn: bash with SIGUSR1 ignored, the job in its own process group.
    proc = spawn(f"{sys.executable} {JOB} --steps 100 --val-batches 30 --val-sleep-s 1.5",
                 cwd=tmp_path, env=env, log_path=log)
    try:
        wait_for(lambda: "validation-batch: 2" in log.read_text() or proc.poll() is not None,
                 timeout_s=120, what="training to end and the validation to run 2 batches")
        assert proc.poll() is None, log.read_text()[-2000:]
        # The heartbeat's step: the last step, not the last one written before it.
        wait_for(lambda: _progress(progress).get("step") == 100, timeout_s=10,
                 what="the progress file to report step 100 during the validation")
        # What the agent does on a notice: the file (with the termination time), then SIGUSR1.
        seen = time.time()
        deadline = seen + NOTICE_WALL_S
        write_notice_file(notice, {"action": "terminate", "time": None}, seen_wall_s=seen,
                          terminate_at_unix_s=deadline)
        assert signal_group(proc, signal.SIGUSR1)
        wait_for(lambda: _progress(progress).get("emergency_checkpoint_step") is not None,
                 timeout_s=max(0.0, deadline - time.time()),
                 what="the emergency checkpoint before the termination time")
        assert proc.poll() is None               # still validating: no step() was reached
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)   # the reclaim
            proc.wait(timeout=30)
    assert _progress(progress)["emergency_checkpoint_step"] == 100, log.read_text()[-2000:]
    assert list_complete(FileStore(store_dir))[-1] == "ckpt-000000000100"


def _bn_model(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                torch.nn.Linear(16, 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_a_train_mode_forward_after_the_step_still_saves_that_step_exactly(tmp_path):
    model, opt = _bn_model(0)
    ck = Checkpointer(model=model, optimizer=opt, store=FileStore(tmp_path / "store"),
                      runtime=QUIET, interval_s=1e9)
    try:
        for step in range(1, 4):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            ck.step(step)
        at_step = {k: v.clone() for k, v in model.state_dict().items()}
        with torch.no_grad():                     # a logging forward: BatchNorm stats move
            model(torch.randn(4, 8) + 5.0)
        moved = model.state_dict()["1.running_mean"]
        assert not torch.equal(moved, at_step["1.running_mean"])
        ck.notice()
        model.eval()                              # the validation: no step() until saved
        wait_for(lambda: ck.emergency_checkpoint_step, timeout_s=30,
                 what="the watchdog's emergency checkpoint")
        assert ck.emergency_checkpoint_step == 3 and ck.guard.background_saves == 1
    finally:
        ck.close()
    model2, opt2 = _bn_model(5)
    ck2 = Checkpointer(model=model2, optimizer=opt2, store=FileStore(tmp_path / "store"),
                       runtime=QUIET, interval_s=1e9)
    assert ck2.restore() == 3
    ck2.close()
    # Step 3's state, buffers included: not the statistics the later forward left.
    assert all(torch.equal(at_step[k], v) for k, v in model2.state_dict().items())

"""Issue 40, point 1: the notice is honoured in any loop, and every notice gets an outcome.

A loop without a `torch.optim` optimizer (weights updated by hand through `.data`) used to get
no save from the watchdog at all, and nothing told the user. Now a backward pass, another
optimizer, or any in-place change ends "clean at step n", whatever the loop looks like, and
the progress file (then the agent's notice.json, then `status`) says what became of the notice.
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
from spotrun.torch import Checkpointer, NoticeOptions, RuntimeOptions  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LM = ROOT / "tests" / "torch_jobs" / "word_lm_manual.py"
FINAL = "final-params-sha256: "


def _progress(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}


def _mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _manual_step(model: torch.nn.Module, lr: float = 0.1, *, update: bool = True) -> None:
    """One step of a hand-written loop: backward, then `p.data.add_` (no optimizer)."""
    model.zero_grad()
    model(torch.randn(4, 8)).pow(2).mean().backward()
    if update:
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)


def _ck(tmp_path: Path, model, opt=None, *, env: dict | None = None, background: bool = True,
        progress_interval_s: float = 1.0, **kw) -> Checkpointer:
    kw.setdefault("interval_s", 1e9)
    runtime = RuntimeOptions(env={} if env is None else env, install_signal=False,
                             progress_file=str(tmp_path / "progress.json"),
                             progress_interval_s=progress_interval_s)
    return Checkpointer(model=model, optimizer=opt, store=FileStore(tmp_path / "store"),
                        runtime=runtime, notice=NoticeOptions(grace_s=0.0, background=background),
                        **kw)


def _restored(tmp_path: Path, seed: int = 7) -> tuple[int, dict]:
    model = _mlp(seed)
    ck = Checkpointer(model=model, store=FileStore(tmp_path / "store"),
                      runtime=RuntimeOptions(env={}, install_signal=False))
    step = ck.restore()
    ck.close()
    return step, model.state_dict()


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_loop_with_hand_written_updates_gets_its_save_during_a_no_grad_validation(tmp_path):
    model = _mlp()
    ck = _ck(tmp_path, model)
    try:
        for step in range(1, 4):
            _manual_step(model)
            ck.step(step)
        at_3 = {k: v.clone() for k, v in model.state_dict().items()}
        ck.notice()
        model.eval()
        with torch.no_grad():   # the validation: no step() until it ends
            wait_for(lambda: model(torch.randn(4, 8)) is not None and ck.emergency_checkpoint_step,
                     timeout_s=30, what="the watchdog's emergency checkpoint")
        assert ck.emergency_checkpoint_step == 3 and ck.guard.background_saves == 1
        outcome = _progress(tmp_path / "progress.json")["notice_outcome"]
        assert outcome.startswith("emergency checkpoint at step 3 in ")
    finally:
        ck.close()
    step, weights = _restored(tmp_path)
    assert step == 3 and _same(weights, at_3)


def test_a_backward_pass_starts_the_step_and_the_save_follows_at_its_end(tmp_path):
    model = _mlp()
    ck = _ck(tmp_path, model)
    try:
        for step in range(1, 3):
            _manual_step(model)
            ck.step(step)
        model.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()    # step 3 is under way
        ck.notice()
        outcome = wait_for(lambda: "under way" in (o := _progress(
            tmp_path / "progress.json").get("notice_outcome") or "") and o, timeout_s=30,
            what="the outcome to say a step is under way")
        assert outcome == ("no emergency checkpoint: a training step is under way (a backward "
                           "pass after step 2); it saves at the step's end")
        assert list_complete(FileStore(tmp_path / "store")) == []   # step 2 is gone: not saved
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-0.1)                      # invisible to version counters
        after = {k: v.clone() for k, v in model.state_dict().items()}
        ck.step(3)
        assert ck.emergency_checkpoint_step == 3
    finally:
        ck.close()
    step, weights = _restored(tmp_path)
    assert step == 3 and _same(weights, after)


@pytest.mark.parametrize("change", ["parameter", "optimizer-state", "extras-tensor",
                                    "scheduler"])
def test_an_in_place_change_after_the_step_is_never_saved_as_that_step(tmp_path, change):
    torch.manual_seed(0)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    extras = {"hidden": torch.zeros(3)}
    ck = _ck(tmp_path, model, opt, scheduler=sched, extras=extras)
    try:
        for step in range(1, 3):
            opt.zero_grad()
            model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()
            sched.step()
            ck.step(step)
        # After the boundary, outside any step the hooks see: a weight clip under no_grad, a
        # momentum reset, an extra changed in place (the docs say: rebind it), a late LR step.
        with torch.no_grad():
            if change == "parameter":
                model[0].weight.clamp_(-0.01, 0.01)
            elif change == "optimizer-state":
                opt.state[model[0].weight]["momentum_buffer"].zero_()
            elif change == "extras-tensor":
                extras["hidden"].add_(1.0)
            else:
                sched.step()
        ck.notice()
        outcome = wait_for(lambda: "changed" in (o := _progress(
            tmp_path / "progress.json").get("notice_outcome") or "") and o, timeout_s=30,
            what="the outcome to name the change")
        assert "changed in place after step 2" in outcome, outcome
        assert list_complete(FileStore(tmp_path / "store")) == [], "a changed state saved as step 2"
        opt.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
        ck.step(3)                                   # the next boundary saves the live state
        assert ck.emergency_checkpoint_step == 3
    finally:
        ck.close()


def test_a_second_optimizer_and_module_in_extras_start_the_step(tmp_path):
    """A GAN's shape: G is the model, D and its optimizer ride in extras."""
    torch.manual_seed(0)
    gen, disc = _mlp(1), torch.nn.Sequential(torch.nn.Linear(4, 1))
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3)
    ck = _ck(tmp_path, gen, opt_g, extras={"disc": disc, "opt_d": opt_d})
    try:
        for step in range(1, 3):
            opt_d.zero_grad()
            disc(gen(torch.randn(4, 8)).detach()).mean().backward()
            opt_d.step()
            opt_g.zero_grad()
            (-disc(gen(torch.randn(4, 8))).mean()).backward()
            opt_g.step()
            ck.step(step)
        opt_d.zero_grad()
        disc(gen(torch.randn(4, 8)).detach()).mean().backward()   # D's half of step 3
        ck.notice()
        wait_for(lambda: "under way" in (_progress(tmp_path / "progress.json")
                                         .get("notice_outcome") or ""), timeout_s=30,
                 what="the outcome to say a step is under way")
        assert list_complete(FileStore(tmp_path / "store")) == []
    finally:
        ck.close()


def test_with_watchdog_saves_off_the_outcome_says_so_then_names_the_save(tmp_path):
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ck = _ck(tmp_path, model, opt, background=False)
    try:
        opt.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
        ck.step(1)
        ck.notice()
        wait_for(lambda: "watchdog saves are off" in (_progress(tmp_path / "progress.json")
                                                      .get("notice_outcome") or ""),
                 timeout_s=30, what="the outcome to say why there is no save yet")
        ck.step(2)
        assert _progress(tmp_path / "progress.json")["notice_outcome"].startswith(
            "emergency checkpoint at step 2 in ")
    finally:
        ck.close()


def test_after_a_notice_the_progress_file_reports_every_step(tmp_path):
    model = _mlp()
    ck = _ck(tmp_path, model, progress_interval_s=1e9)
    try:
        _manual_step(model)
        ck.step(1)
        ck.notice()
        for step in range(2, 6):
            _manual_step(model)
            ck.step(step)
            # The next attempt's count of lost steps reads the last finished step from here.
            assert _progress(tmp_path / "progress.json")["step"] == step
    finally:
        ck.close()


@pytest.mark.slow
def test_hand_written_updates_noticed_in_a_long_no_grad_validation_resume_there(tmp_path,
                                                                               cpu_load):
    """The acceptance: word_language_model's shape, noticed during its validation."""
    store_dir, progress, notice = tmp_path / "ckpt", tmp_path / "progress.json", tmp_path / "n.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTRUN_")}
    env.update(SPOTRUN_CHECKPOINT_URI=store_dir.as_uri(), SPOTRUN_PROGRESS_FILE=str(progress),
               SPOTRUN_NOTICE_FILE=str(notice), SPOTRUN_JOB_ID="job-lm", SPOTRUN_ATTEMPT="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")

    def run(name: str, args: str):
        return spawn(f"{sys.executable} {LM} {args}", cwd=tmp_path, env=env,
                     log_path=tmp_path / f"{name}.log")

    ref = run("ref", "")
    assert ref.wait(timeout=240) == 0
    ref_hash = (tmp_path / "ref.log").read_text().split(FINAL)[1].split()[0]
    store_dir_ref = tmp_path / "ckpt-ref"
    store_dir.rename(store_dir_ref)

    log = tmp_path / "first.log"
    proc = run("first", "--val-sleep-s 0.5")   # 25 validation batches: a 12.5 s validation
    try:
        # Noticed 5 s into the validation (the case: 5 s into 45 s; scaled to keep
        # the suite short, the same for the watchdog, which saves within its 1 s grace).
        wait_for(lambda: "validation-batch: 10" in log.read_text() or proc.poll() is not None,
                 timeout_s=240, what="the first epoch and 10 validation batches")
        assert proc.poll() is None, log.read_text()[-2000:]
        trained = int(log.read_text().split("trained-steps: ")[1].split()[0])
        seen = time.time()
        write_notice_file(notice, {"action": "terminate", "time": None}, seen_wall_s=seen,
                          terminate_at_unix_s=seen + 120)
        assert signal_group(proc, signal.SIGUSR1)
        wait_for(lambda: _progress(progress).get("emergency_checkpoint_step") is not None,
                 timeout_s=30, what="the emergency checkpoint during the validation")
        assert "trained-steps: " not in log.read_text().split("validation-batch: 10")[1], \
            "the save came only after the validation"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)   # the reclaim
            proc.wait(timeout=30)
    assert _progress(progress)["emergency_checkpoint_step"] == trained
    assert _progress(progress)["notice_outcome"].startswith(
        f"emergency checkpoint at step {trained} in ")
    assert f"emergency checkpoint at step {trained}" in log.read_text()   # the job's own log
    notice.unlink()
    resumed = run("second", "")
    assert resumed.wait(timeout=240) == 0
    text = (tmp_path / "second.log").read_text()
    assert f"resumed-at: {trained}" in text
    assert text.split(FINAL)[1].split()[0] == ref_hash


def test_framework_callbacks_report_the_outcome_and_every_step_after_a_notice(tmp_path):
    """The Trainer and Lightning callbacks share one progress writer: same promise."""
    from spotrun.integrations._common import Notice, Progress
    path = tmp_path / "progress.json"
    notice = Notice(install=False, notice_file="")
    progress = Progress(env={"SPOTRUN_PROGRESS_FILE": str(path)}, interval_s=1e9, notice=notice)
    progress.step(1)
    progress.step(2)
    assert _progress(path)["step"] == 1            # throttled before the notice
    notice.set()
    progress.step(3)
    assert _progress(path)["step"] == 3
    assert _progress(path)["notice_outcome"].startswith("no emergency checkpoint: ")
    progress.saved(3, 0.2, emergency_s=0.5)
    notice.clear()
    progress.step(4)
    assert _progress(path)["step"] == 4             # still every step once noticed
    assert _progress(path)["notice_outcome"] == "emergency checkpoint at step 3 in 0.50 s"


def test_a_save_from_the_watchdog_takes_the_job_files_as_of_its_step(tmp_path):
    """A validation's log row and best.pt written after step 3 are not part of checkpoint 3.

    The resume at 3 runs that validation again (docs: validation at the top of the
    iteration) and writes them again: had the save taken them, the log would hold the row twice.
    """
    job = tmp_path / "job"
    job.mkdir()
    env = {"SPOTRUN_JOB_DIR": str(job), "SPOTRUN_PERSIST": json.dumps(["log.csv", "best.pt"])}
    model = _mlp()
    log_csv, best = job / "log.csv", job / "best.pt"
    ck = _ck(tmp_path, model, env=env)
    try:
        for step in range(1, 4):
            _manual_step(model)
            with open(log_csv, "a") as f:
                f.write(f"train,{step}\n")
            if step == 2:
                best.write_bytes(b"best-at-2")
                ck.save(2, wait=True)          # a periodic save: best.pt as of step 2 is stored
            ck.step(step)
        at_step = log_csv.read_bytes()
        with open(log_csv, "a") as f:            # the validation after step 3
            f.write("val,3\n")
        best.write_bytes(b"best-at-3-validation")
        ck.notice()
        wait_for(lambda: ck.emergency_checkpoint_step, timeout_s=30,
                 what="the watchdog's emergency checkpoint")
        assert ck.emergency_checkpoint_step == 3
    finally:
        ck.close()
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    model2 = _mlp(3)
    ck2 = Checkpointer(model=model2, store=FileStore(tmp_path / "store"), runtime=RuntimeOptions(
        env={"SPOTRUN_JOB_DIR": str(fresh), "SPOTRUN_PERSIST": json.dumps(["log.csv", "best.pt"])},
        install_signal=False))
    assert ck2.restore() == 3
    ck2.close()
    assert (fresh / "log.csv").read_bytes() == at_step == b"train,1\ntrain,2\ntrain,3\n"
    assert (fresh / "best.pt").read_bytes() == b"best-at-2"

"""Notice honoured anywhere, notice before the handler, last-moment save, finish(), local default."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from polling import wait_for  # noqa: E402
from spotrun.agent.child import (child_env, notice_deadline_unix_s, notice_path,  # noqa: E402
                                 record_notice, signal_group, spawn)
from spotrun.agent.config import AgentConfig  # noqa: E402
from spotrun.checkpoints import list_complete  # noqa: E402
from spotrun.store.file import FileStore  # noqa: E402
from spotrun.torch import Checkpointer, NoticeOptions, RuntimeOptions, SaveOptions  # noqa: E402
from spotrun.torch.notice import NoticeGuard  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "torch_jobs" / "carried_state.py"
FINAL = "final-params-sha256: "
QUIET = RuntimeOptions(env={}, install_signal=False)   # no agent, SIGUSR1 left alone


def _objs(seed: int = 0, bn: bool = False):
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(8, 16)] + ([torch.nn.BatchNorm1d(16)] if bn else []) + \
        [torch.nn.Linear(16, 4)]
    model = torch.nn.Sequential(*layers)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _train(model, opt, n: int = 1) -> None:
    for _ in range(n):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def _ck(tmp_path: Path, model, opt, **kw) -> Checkpointer:
    kw.setdefault("runtime", QUIET)
    kw.setdefault("interval_s", 1e9)
    return Checkpointer(model=model, optimizer=opt, store=FileStore(tmp_path / "store"), **kw)


# -- finish() and the local default (bug fixes) --------------------------------------------


def test_finish_saves_extras_changed_after_the_last_save(tmp_path):
    model, opt = _objs()
    extras = {"best": 1.0}
    ck = _ck(tmp_path, model, opt, extras=extras)
    _train(model, opt)
    assert ck.save(1, wait=True)
    extras["best"] = 0.25            # e.g. a final evaluation after the last step
    ck.finish(1)
    saves = ck.saves
    ck.finish(1)                      # nothing changed since: no second write
    assert ck.saves == saves
    ck.close()
    back = {"best": None}
    ck2 = _ck(tmp_path, *_objs(1), extras=back)
    assert ck2.restore() == 1 and back["best"] == 0.25
    ck2.close()


def test_outside_spotrun_checkpoints_go_to_a_local_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, opt = _objs()
    ck = Checkpointer(model=model, optimizer=opt, runtime=QUIET)
    _train(model, opt)
    ck.finish(1)
    ck.close()
    assert list_complete(FileStore(tmp_path / "spotrun-checkpoints")) == ["ckpt-000000000001"]


# -- the notice between steps ------------------------------------------------------------


def test_watchdog_saves_the_last_finished_step_during_a_long_evaluation(tmp_path):
    model, opt = _objs(bn=True)
    ck = _ck(tmp_path, model, opt, notice=NoticeOptions(grace_s=0.0))
    try:
        _train(model, opt, 3)
        ck.step(3)
        weights = {k: v.clone() for k, v in model.state_dict().items()}
        torch.randn(100)              # evaluation draws random numbers: not part of step 3's state
        ck.notice()
        model.eval()
        with torch.no_grad():         # a long evaluation: no step() call until it is saved
            wait_for(lambda: model(torch.randn(4, 8)) is not None and ck.emergency_checkpoint_step,
                     timeout_s=30, what="emergency checkpoint from the watchdog")
        assert ck.emergency_checkpoint_step == 3 and ck.guard.background_saves == 1
        model.train()
    finally:
        ck.close()
    model2, opt2 = _objs(5, bn=True)
    ck2 = _ck(tmp_path, model2, opt2)
    assert ck2.restore() == 3
    assert all(torch.equal(weights[k], v) for k, v in model2.state_dict().items())
    ck2.close()


class _GatedStore(FileStore):
    """A real FileStore whose data writes hold until released (a slow upload)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        import threading
        self.writing, self.release = threading.Event(), threading.Event()

    def put_bytes(self, key, data):
        if key.endswith(".bin"):
            self.writing.set()
            assert self.release.wait(30)
        super().put_bytes(key, data)


def test_watchdog_waits_for_an_in_flight_persist_of_the_same_step(tmp_path):
    model, opt = _objs()
    store = _GatedStore(tmp_path / "store")
    ck = Checkpointer(model=model, optimizer=opt, store=store, runtime=QUIET, interval_s=1e9,
                      every_steps=3, notice=NoticeOptions(grace_s=0.0),
                      save=SaveOptions(shard_bytes=256))
    try:
        _train(model, opt, 3)
        assert ck.step(3) is True                 # periodic save of step 3, persisting
        assert store.writing.wait(30)
        ck.notice()                               # during the evaluation that follows
        wait_for(lambda: ck.guard.busy, timeout_s=30, what="the watchdog to take the notice")
        assert not ck.persister._cancel.is_set()  # not abandoned: it is the state to save
        store.release.set()
        wait_for(lambda: ck.emergency_checkpoint_step == 3, timeout_s=30, what="emergency at 3")
        assert ck.saves == 1                      # the periodic persist was the emergency one
    finally:
        store.release.set()
        ck.close()


def test_a_notice_mid_step_waits_for_the_step_boundary(tmp_path):
    model, opt = _objs(bn=True)
    ck = _ck(tmp_path, model, opt, notice=NoticeOptions(grace_s=0.0))
    try:
        _train(model, opt, 1)
        ck.step(1)
        loss = model(torch.randn(4, 8)).pow(2).mean()   # train-mode forward: step 2 has begun
        ck.notice()
        assert ck.guard.tick() is None                  # the watchdog must not save a half step
        loss.backward()
        opt.step()
        assert ck.step(2) is True and ck.emergency_checkpoint_step == 2
    finally:
        ck.close()


def test_poll_saves_at_a_point_the_loop_marks_safe(tmp_path):
    model, opt = _objs()
    ck = _ck(tmp_path, model, opt, notice=NoticeOptions(background=False))
    try:
        _train(model, opt, 2)
        ck.step(2)
        assert ck.poll() is None
        ck.notice()
        assert ck.poll() == "emergency" and ck.emergency_checkpoint_step == 2
        assert ck.poll() is None
    finally:
        ck.close()
    assert list_complete(FileStore(tmp_path / "store")) == ["ckpt-000000000002"]


def _pending_signals(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("ShdPnd:"):
            return int(line.split()[1], 16)
    return 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_processes_the_loop_starts_are_not_killed_by_the_notice(tmp_path):
    # A spawn/forkserver DataLoader worker or a subprocess: exec resets a handled signal to
    # its default action (the end of the process); the library leaves it blocked instead.
    model, opt = _objs()
    ck = _ck(tmp_path, model, opt, runtime=RuntimeOptions(env={}))
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        os.kill(child.pid, signal.SIGUSR1)
        bit = 1 << (signal.SIGUSR1 - 1)
        wait_for(lambda: child.poll() is not None or _pending_signals(child.pid) & bit,
                 timeout_s=30, what="SIGUSR1 pending in the child")
        assert child.poll() is None               # held pending, not the default action
        child.stdin.close()
        assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        ck.close()
    assert signal.SIGUSR1 not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


# -- the last-moment save (injected clock) --------------------------------------------------


class _Clock:
    """Test time: steps and store writes advance it; nothing waits."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def wall(self) -> float:
        return 1.7e9 + self.t


class _SlowStore(FileStore):
    """A real FileStore whose every data shard costs `shard_s` of test time."""

    def __init__(self, root: Path, clock: _Clock, shard_s: float) -> None:
        super().__init__(root)
        self.clock, self.shard_s = clock, shard_s

    def put_bytes(self, key, data):
        if key.endswith(".bin"):
            self.clock.t += self.shard_s
        super().put_bytes(key, data)


@pytest.mark.parametrize("last_moment", [True, False])
def test_last_moment_save_bounds_the_steps_lost_to_one_save(tmp_path, last_moment):
    clock = _Clock()
    model, opt = _objs()
    step_s, window_s, margin_s = 1.0, 120.0, 1.0
    store = _SlowStore(tmp_path / "store", clock, shard_s=5.0)
    ck = Checkpointer(model=model, optimizer=opt, store=store, interval_s=1e9,
                      runtime=RuntimeOptions(env={}, install_signal=False, clock=clock,
                                             wall=clock.wall),
                      notice=NoticeOptions(background=False, margin_s=margin_s))
    step = 0
    deadline = None
    while deadline is None or clock.t < deadline:   # the reclaim at `deadline` ends the process
        _train(model, opt)
        clock.t += step_s
        step += 1
        ck.step(step)
        if step == 10:
            deadline = clock.t + window_s
            ck.notice(terminate_at_unix_s=clock.wall() + window_s if last_moment else None)
    saved = max(int(n.split("-")[1]) for n in list_complete(FileStore(tmp_path / "store")))
    lost = step - saved
    save_steps = ck.guard.save_s / step_s            # one save's time, in steps
    assert ck.emergency_checkpoint_step == 11 and ck.guard.save_s == pytest.approx(5.0)
    if last_moment:
        assert ck.last_moment_checkpoint_step == saved
        assert lost <= save_steps + margin_s / step_s + 1
    else:                                            # without it: the whole window is lost
        assert lost >= window_s / step_s - save_steps - 1
    ck.close()


# -- real processes: the agent's spawn, a real signal, the job script ----------------------


def _env(tmp: Path, name: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTRUN_")}
    env.update(SPOTRUN_CHECKPOINT_URI=(tmp / name).as_uri(),
               SPOTRUN_PROGRESS_FILE=str(tmp / f"{name}.progress.json"),
               SPOTRUN_NOTICE_FILE=str(tmp / f"{name}.notice.json"))
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _progress(tmp: Path, name: str) -> dict:
    try:
        return json.loads((tmp / f"{name}.progress.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


def _start(tmp: Path, name: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(JOB), *args], env=_env(tmp, name), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _final(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith(FINAL), out[-2000:]
    return last[len(FINAL):]


@pytest.mark.slow
def test_notice_during_a_long_validation_resumes_bitwise_from_the_last_step(tmp_path):
    reference = _start(tmp_path, "ref")            # uninterrupted, alongside
    hold = tmp_path / "hold"
    hold.mkdir()
    proc = subprocess.Popen([sys.executable, str(JOB), "--hold-dir", str(hold), "--hold-at", "20"],
                            env=_env(tmp_path, "run"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (hold / "validating-20").exists() or proc.poll() is not None,
                 timeout_s=60, what="validation of step 20")
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        proc.send_signal(signal.SIGUSR1)
        wait_for(lambda: _progress(tmp_path, "run").get("emergency_checkpoint_step") is not None,
                 timeout_s=30, what="the emergency checkpoint, taken mid-validation")
        assert proc.poll() is None                  # still validating: no step() was reached
        assert _progress(tmp_path, "run")["emergency_checkpoint_step"] == 20
        proc.kill()                                 # the reclaim
        proc.wait(timeout=30)
        assert list_complete(FileStore(tmp_path / "run")) == ["ckpt-000000000020"]
        # Resumed at 20, validation run again: bitwise the uninterrupted run's weights.
        assert _final(_start(tmp_path, "run")) == _final(reference)
    finally:
        for p in (proc, reference):
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)


@pytest.mark.slow
def test_a_notice_sent_before_the_handler_exists_is_honoured(tmp_path):
    go = tmp_path / "go"
    log = tmp_path / "job.log"
    env = _env(tmp_path, "early")
    # The agent's own spawn: bash with `trap '' USR1`, its own process group.
    proc = spawn(f"{sys.executable} {JOB} --steps 30 --wait-file {go}", cwd=tmp_path, env=env,
                 log_path=log)
    try:
        wait_for(lambda: "ready" in log.read_text() or proc.poll() is not None, timeout_s=60,
                 what="the job's python to start")
        # What the agent does on a notice: the file first, then the signal to the group.
        record_notice(Path(env["SPOTRUN_NOTICE_FILE"]), {"action": "terminate", "time": None},
                      seen_wall_s=0.0, time_scale=1.0)
        assert signal_group(proc, signal.SIGUSR1)
        go.write_text("")                          # only now does the job import the library
        assert proc.wait(timeout=120) == 0, log.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    fields = _progress(tmp_path, "early")
    assert fields["emergency_checkpoint_step"] is not None, log.read_text()[-2000:]


# -- the agent's side: the notice file --------------------------------------------------------


def test_notice_file_carries_the_termination_time_on_the_wall_clock(tmp_path):
    aws = {"action": "terminate", "time": "2026-12-01T10:02:00Z"}
    assert notice_deadline_unix_s(aws, seen_wall_s=0.0, time_scale=1.0) == 1796119320.0
    # Local market at x60: a 120 market-s window is 2 wall s from when the agent saw it.
    local = {"action": "terminate", "time": "2026-12-01T10:02:00Z"}
    got = notice_deadline_unix_s(local, seen_wall_s=500.0, time_scale=60.0,
                                 notice_time="2026-12-01T10:00:00Z", poll_wall_s=0.1)
    assert got == pytest.approx(500.0 + 2.0 - 0.1)
    assert notice_deadline_unix_s(local, seen_wall_s=5.0, time_scale=60.0) is None
    path = notice_path(tmp_path / "progress.json")
    assert record_notice(path, aws, seen_wall_s=1.0, time_scale=1.0) == 1796119320.0
    guard = NoticeGuard(lambda *a: None, notice_file=path, env={}, install_signal=False,
                        background=False, clock=lambda: 10.0, wall=lambda: 1796119300.0)
    guard.start()
    try:
        assert guard.pending and guard.deadline == pytest.approx(30.0)
    finally:
        guard.close()


def test_the_job_is_told_the_notice_file_and_a_stale_one_is_removed(tmp_path):
    cfg = AgentConfig(job_id="j-1", attempt=2, store_uri="file:///x", checkpoint_uri="file:///c",
                      command="true")
    env = child_env(cfg, base={"PATH": os.environ.get("PATH", "")}, secrets={}, resume_checkpoint=None,
                    progress_file=tmp_path / "state" / "progress.json")
    notice = Path(env["SPOTRUN_NOTICE_FILE"])
    assert notice == (tmp_path / "state" / "notice.json").resolve()
    notice.parent.mkdir(parents=True)
    notice.write_text('{"action": "terminate"}')     # left by an earlier attempt on this disk
    proc = spawn("true", cwd=tmp_path, env=env, log_path=tmp_path / "state" / "out.log")
    assert proc.wait(timeout=30) == 0 and not notice.exists()


# -- through the real agent: IMDS notice -> notice file + signal -> last-moment save --------

AGENT_JOB = r'''
import torch
from spotrun.torch import Checkpointer, RuntimeOptions
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ckpt = Checkpointer(model=model, optimizer=opt, interval_s=1e9,
                    runtime=RuntimeOptions(progress_interval_s=0.05))
step = ckpt.restore()
while True:                      # runs until the agent stops it
    loss = model(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    step += 1
    ckpt.step(step)
'''


@pytest.mark.slow
def test_agent_notice_file_gives_the_library_the_termination_time(tmp_path):
    import agent_helpers
    from agent_helpers import ImdsServer, make_config, read_json
    from spotrun import layout
    from spotrun.bundle import make_bundle
    from spotrun.store import open_store

    store_dir, workdir = tmp_path / "store", tmp_path / "workdir"
    workdir.mkdir()
    (workdir / "train.py").write_text(AGENT_JOB)
    bundle = tmp_path / "bundle.tar.gz"
    make_bundle(workdir, bundle)
    open_store(store_dir.as_uri()).put_file(layout.bundle_key("job-test"), bundle)
    imds = ImdsServer().start()
    # The local market's scaled clock: 240 market s of notice are 4 wall s at x60.
    cfg = make_config(store_dir, imds.url, total_steps=None, time_scale=60.0)
    proc, stderr = agent_helpers.start_agent(tmp_path, cfg)
    progress = tmp_path / "agent-instance" / "spotrun-agent" / "progress.json"
    notice = progress.with_name("notice.json")
    try:
        wait_for(lambda: (read_json(progress) or {}).get("step"), timeout_s=60, what="steps")
        imds.arm_rebalance("2030-01-01T00:00:00Z")
        imds.arm_notice("terminate", "2030-01-01T00:04:00Z")
        body = wait_for(lambda: read_json(notice), timeout_s=30, what="the job's notice file")
        poll_wall_s = 5.0 / 60.0
        assert body["terminate_at_unix_s"] - body["seen_at_unix_s"] == \
            pytest.approx(240.0 / 60.0 - poll_wall_s)
        got = wait_for(lambda: (p := read_json(progress) or {}).get("last_moment_checkpoint_step")
                       and p, timeout_s=60, what="the last-moment checkpoint")
        assert got["emergency_checkpoint_step"] < got["last_moment_checkpoint_step"]
        assert proc.poll() is None, stderr.read_text()[-2000:]
    finally:
        (store_dir / layout.control_key("job-test")).parent.mkdir(parents=True, exist_ok=True)
        (store_dir / layout.control_key("job-test")).write_text(json.dumps({"cancel": True}))
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            imds.stop()

"""Exact resume of the real demo training script after kill -9 (and after an emergency save)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from spotrun.checkpoints import verify  # noqa: E402
from spotrun.store.file import FileStore  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "configs" / "demo" / "train.py"
STEPS = 300
TINY = ["--steps", str(STEPS), "--hidden", "64", "--layers", "2", "--samples", "1024",
        "--batch", "64", "--log-every", "100000", "--progress-interval-s", "0"]
FINAL = "final-params-sha256: "
pytestmark = pytest.mark.slow


def _env(tmp: Path, name: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTRUN_")}
    env.update(SPOTRUN_CHECKPOINT_URI=(tmp / name).as_uri(),
               SPOTRUN_PROGRESS_FILE=str(tmp / f"{name}.progress.json"),
               SPOTRUN_CHECKPOINT_KEEP="3", **extra)
    return env


def _start(tmp: Path, name: str, *args: str, **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(TRAIN), *TINY, *args], env=_env(tmp, name, **extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _final_sha(proc: subprocess.Popen[str]) -> tuple[str, str]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith(FINAL), out[-2000:]
    return last[len(FINAL):], out


def _progress(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}


# A deadline to fail by, not a timing assumption: a loaded 2-core box took over 60 s to
# start torch and reach step 150 once.
def _poll(pred, proc: subprocess.Popen[str], deadline_s: float = 240.0):
    """Poll pred() until truthy; fail if the process ends first or the deadline passes."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        assert proc.poll() is None, f"training ended before the condition: {proc.stderr.read()[-2000:]}"
        time.sleep(0.002)   # poll interval, not a timing assumption
    pytest.fail("deadline passed while polling")


class _Reference:
    """An uninterrupted run, started once and run alongside the tests' own processes."""

    def __init__(self, tmp: Path) -> None:
        self.proc = _start(tmp, "ref", "--checkpoint-every-steps", "50")
        self._sha: str | None = None

    def sha(self) -> str:
        if self._sha is None:
            self._sha, _ = _final_sha(self.proc)
        return self._sha


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Final parameter hash of an uninterrupted run (call .sha())."""
    ref = _Reference(tmp_path_factory.mktemp("ref"))
    yield ref
    if ref.proc.poll() is None:
        ref.proc.kill()
        ref.proc.wait()


def _resume(tmp: Path, name: str) -> tuple[int, str]:
    sha, out = _final_sha(_start(tmp, name, "--checkpoint-every-steps", "25"))
    start = int(out.splitlines()[0].split()[2].split("/")[0])
    return start, sha


def test_kill9_at_random_step_then_resume_is_bitwise_identical(tmp_path, reference):
    seed = int.from_bytes(os.urandom(4), "little")
    kill_at = random.Random(seed).randrange(40, STEPS // 2)
    proc = _start(tmp_path, "run", "--checkpoint-every-steps", "25")
    prog = tmp_path / "run.progress.json"
    _poll(lambda: _progress(prog).get("step", 0) >= kill_at, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    killed_step = _progress(prog)["step"]

    start, sha = _resume(tmp_path, "run")
    assert 0 < start <= killed_step + 1, (seed, start, killed_step)
    assert sha == reference.sha(), f"kill at step ~{killed_step} (seed {seed}) diverged"


def test_emergency_save_on_sigusr1_then_kill9_resumes_from_it(tmp_path, reference):
    seed = int.from_bytes(os.urandom(4), "little")
    notice_at = random.Random(seed).randrange(40, STEPS // 2)
    # No periodic saves: the only checkpoint is the emergency one.
    proc = _start(tmp_path, "run", SPOTRUN_CHECKPOINT_INTERVAL_S="100000")
    prog = tmp_path / "run.progress.json"
    _poll(lambda: _progress(prog).get("step", 0) >= notice_at, proc)
    proc.send_signal(signal.SIGUSR1)
    got = _poll(lambda: _progress(prog).get("emergency_checkpoint_step"), proc)
    fields = _progress(prog)
    assert fields["last_checkpoint_step"] == got and fields["emergency_save_s"] > 0
    store = FileStore(tmp_path / "run")
    assert verify(store, f"ckpt-{got:012d}").step == got   # in the store, verified, at once
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)

    start, sha = _resume(tmp_path, "run")
    assert start == got, (seed, start, got)
    assert sha == reference.sha(), f"emergency save at step {got} (seed {seed}) diverged"

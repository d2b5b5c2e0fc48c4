"""Run a framework workload (tests/workloads/) as a real process, signal it, kill it, resume it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import pytest
from polling import wait_for
from test_e2e_local import finished as e2e_finished, running_attempt as e2e_running_attempt

from spotrun.checkpoints import list_complete, read_manifest
from spotrun.store import open_store

WORKLOADS = Path(__file__).resolve().parent / "workloads"
STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def reap_workloads():
    """Every workload a test started is gone when it ends (import this into the test module)."""
    yield
    while STARTED:
        kill(STARTED.pop())


@contextmanager
def local_rig(home: Path, tmp: Path, workload: str, spec_body: str) -> Iterator[tuple]:
    """Daemon + local market (capacity in two zones) with a tests/workloads/ script as the
    job's code; yields (ctx, runner, spec path) and stops both afterwards."""
    from conftest import kill_leftovers, write_trace
    from spotrun.config import load_settings
    from spotrun.daemon.app import build_context, build_runner
    from test_e2e_local import TOML
    trace = write_trace(tmp / "trace.csv", {"zone-a": [1] * 50, "zone-b": [1] * 50},
                        tick_s=600.0)
    (home / "spotrun.toml").write_text(TOML.format(trace=trace))
    code = tmp / "code"
    code.mkdir()
    (code / workload).write_text((WORKLOADS / workload).read_text())
    spec = tmp / "job.yaml"
    spec.write_text(spec_body)
    ctx = build_context(load_settings(str(home)))
    runner = build_runner(ctx)
    try:
        yield ctx, runner, spec
    finally:
        runner.stop(wait=True)
        kill_leftovers(home / "market")


# test_e2e_local's waits for a daemon's job, polled every 0.2 s rather than every 20 ms: these
# tests wait a minute or more, where 50 DB reads a second cost the loaded box seconds of CPU,
# and a gate holds its attempt until the notice comes, so a later look loses nothing.
POLL_S = 0.2


def running_attempt(ctx, job_id: str, number: int, min_progress: int):
    """test_e2e_local's running_attempt, polled every POLL_S."""
    return e2e_running_attempt(ctx, job_id, number, min_progress, interval_s=POLL_S)


def finished(ctx, job_id: str):
    """test_e2e_local's finished, polled every POLL_S."""
    return e2e_finished(ctx, job_id, interval_s=POLL_S)


def clean_env(**extra: str) -> dict[str, str]:
    """os.environ without any SPOTRUN_* variable, plus extra."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTRUN_")}
    env.update(extra)
    return env


def start(script: str, cwd: Path, env: dict[str, str], *args: str) -> subprocess.Popen:
    """Start tests/workloads/<script> in cwd, its output in cwd/output.log."""
    cwd.mkdir(parents=True, exist_ok=True)
    out = open(cwd / "output.log", "ab")
    proc = subprocess.Popen([sys.executable, str(WORKLOADS / script), *args], cwd=cwd, env=env,
                            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    out.close()
    STARTED.append(proc)
    return proc


def finish(proc: subprocess.Popen, cwd: Path, timeout_s: float = 120.0) -> str:
    """Wait for a clean exit; the process output."""
    rc = proc.wait(timeout=timeout_s)
    text = (cwd / "output.log").read_text()
    assert rc == 0, text[-3000:]
    return text


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL the workload's whole group (the instance vanishes)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)   # the group: leftovers of an exited leader too
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


@contextmanager
def shared_run(script: str, cwd: Path, env: dict[str, str],
               *args: str) -> Iterator[Callable[[], str]]:
    """A workload run several tests compare with (a module's uninterrupted reference): started
    now, so it overlaps them; yields a function that waits for its clean exit once and returns
    its output. Not reaped with a test's workloads; killed when the context ends."""
    proc = start(script, cwd, env, *args)
    STARTED.remove(proc)
    texts: list[str] = []

    def text() -> str:
        if not texts:
            texts.append(finish(proc, cwd))
        return texts[0]
    try:
        yield text
    finally:
        kill(proc)


def final_sha(text: str) -> str:
    """The workload's last `final-params-sha256:` line."""
    lines = [ln for ln in text.splitlines() if ln.startswith("final-params-sha256: ")]
    assert lines, text[-3000:]
    return lines[-1].split(": ", 1)[1].strip()


def steps_in_store(uri: str, kind: str) -> list[int]:
    """Steps of the complete checkpoints of this kind in the store at uri."""
    store = open_store(uri)
    return [read_manifest(store, n).step for n in list_complete(store)
            if read_manifest(store, n).extra.get("kind") == kind]


def emergency_step(progress: Path) -> int | None:
    """emergency_checkpoint_step in a progress file (what the agent watches)."""
    try:
        return json.loads(progress.read_text()).get("emergency_checkpoint_step")
    except (FileNotFoundError, ValueError):
        return None


def notice_and_kill(proc: subprocess.Popen, cwd: Path, marker: str, uri: str, kind: str,
                    progress: Path) -> int:
    """Once the workload shows marker, SIGUSR1 it, wait for the emergency save, SIGKILL it; its step."""
    wait_for(lambda: (cwd / marker).exists() or proc.poll() is not None, 120, marker)
    assert proc.poll() is None, (cwd / "output.log").read_text()[-3000:]
    os.killpg(proc.pid, signal.SIGUSR1)
    step = wait_for(lambda: emergency_step(progress), 60, "the emergency checkpoint")
    kill(proc)
    assert step in steps_in_store(uri, kind)
    return step

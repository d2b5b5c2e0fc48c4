"""Test utilities for the agent: an IMDSv2 server on 127.0.0.1, a torch-free workload,
and a way to start the real `spotrun agent` process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spotrun.agent.config import AgentConfig
from spotrun.providers.local.market import imds as imds_mod


def ImdsServer() -> "imds_mod.ImdsServer":
    """An IMDSv2 on 127.0.0.1 for one agent: the project's one implementation
    (market.imds.ImdsServer, the protocol the market serves). A test arms the
    spot notice or the rebalance hint; counters tell how the client behaved."""
    return imds_mod.ImdsServer("i-0agenttest")


@pytest.fixture()
def imds():
    """A started ImdsServer, stopped after the test (import it into a test module)."""
    server = ImdsServer().start()
    yield server
    server.stop()


# A torch-free stand-in for a training job: counts steps, writes the progress
# file atomically, saves a checkpoint when SIGUSR1 arrives (the handler only
# sets a flag), prints its SPOTRUN_* environment and the secret it was given.
WORKLOAD = r'''
import json, os, signal, sys, time
from spotrun.checkpoints import put_checkpoint_files
from spotrun.store import open_store

flags = {"save": False}
signal.signal(signal.SIGUSR1, lambda s, f: flags.__setitem__("save", True))
if os.environ.get("WORKLOAD_IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
total = int(os.environ.get("SPOTRUN_TOTAL_STEPS") or 20)
step_s = float(os.environ.get("WORKLOAD_STEP_S", "0.01"))
progress = os.environ["SPOTRUN_PROGRESS_FILE"]
resume = os.environ.get("SPOTRUN_RESUME_CHECKPOINT", "")
start = int(resume.split("-")[1]) if resume else 0
print("ENV " + json.dumps({k: v for k, v in os.environ.items() if k.startswith("SPOTRUN_")}),
      flush=True)
print("SECRET[" + os.environ.get("API_TOKEN", "") + "]", flush=True)
emergency = None
last_ckpt = None
for step in range(start + 1, total + 1):
    time.sleep(step_s)  # the "work" of one step
    if flags["save"]:
        flags["save"] = False
        store = open_store(os.environ["SPOTRUN_CHECKPOINT_URI"])
        put_checkpoint_files(store, step, {"state.json": json.dumps({"step": step}).encode()})
        emergency = last_ckpt = step
        print("EMERGENCY %d" % step, flush=True)
    tmp = progress + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"step": step, "total_steps": total, "steps_per_s": 1.0 / step_s,
                   "last_checkpoint_step": last_ckpt, "checkpoint_save_s": None,
                   "emergency_checkpoint_step": emergency, "ts": time.time()}, f)
    os.replace(tmp, progress)
    if step % 10 == 0:
        print("step %d token=%s" % (step, os.environ.get("API_TOKEN", "")), flush=True)
print("done", flush=True)
sys.exit(int(os.environ.get("WORKLOAD_EXIT", "0")))
'''


def make_config(store_dir: Path, imds_url: str, **overrides: Any) -> AgentConfig:
    """An AgentConfig on file:// stores with short intervals for tests."""
    job = overrides.pop("job_id", "job-test")
    fields: dict[str, Any] = dict(
        job_id=job, attempt=1, store_uri=store_dir.as_uri(),
        checkpoint_uri=(store_dir / "jobs" / job / "checkpoints").as_uri(),
        command=f"{sys.executable} train.py", bundle_key=f"jobs/{job}/bundle.tar.gz",
        total_steps=20, imds_endpoint=imds_url, time_scale=50.0, heartbeat_interval_s=0.2,
        notice_poll_interval_s=5.0, log_flush_interval_s=0.2, control_poll_interval_s=0.1,
        stop_grace_s=5.0)
    fields.update(overrides)
    return AgentConfig(**fields)


def start_agent(tmp_path: Path, config: AgentConfig, *, env: dict[str, str] | None = None,
                name: str = "agent") -> tuple[subprocess.Popen, Path]:
    """Start `python -m spotrun agent` as a real process; returns it and its stderr file."""
    user_data = tmp_path / f"{name}-user-data.json"
    user_data.write_text(config.to_json())
    instance = tmp_path / f"{name}-instance"
    instance.mkdir()
    stderr_path = tmp_path / f"{name}-stderr.log"
    full_env = dict(os.environ)
    full_env.pop("SPOTRUN_IMDS_ENDPOINT", None)
    full_env.update(env or {})
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "spotrun", "agent", "--user-data",
                                 str(user_data), "--dir", str(instance)],
                                cwd=instance, env=full_env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err)
    return proc, stderr_path


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON file's content, or None while it is missing or half-written."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None

"""Test utilities for the agent: an IMDSv2 server on 127.0.0.1, a torch-free workload,
and a way to start the real `spotrun agent` process."""

from __future__ import annotations

import json
import os
import secrets as pysecrets
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from spotrun.agent.config import AgentConfig

TOKEN_PATH = "/latest/api/token"
ACTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
USER_DATA_PATH = "/latest/user-data"


class ImdsServer:
    """A tiny IMDSv2: tokens by PUT (TTL enforced), GETs rejected (401) without a live token.

    A test arms the spot notice or the rebalance hint; counters tell how the
    client behaved (token PUTs, polls, rejected requests).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tokens: dict[str, float] = {}       # token -> monotonic expiry
        self.instance_action: dict[str, Any] | None = None
        self.rebalance: dict[str, Any] | None = None
        self.user_data: str | None = None
        self.token_puts = 0
        self.rejected = 0
        self.action_polls = 0
        self.action_polls_after_arm = 0
        self.max_ttl_s = 21600
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:   # keep test output clean
                pass

            def _send(self, code: int, body: str = "") -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:
                if self.path != TOKEN_PATH:
                    return self._send(404)
                try:
                    ttl = int(self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", ""))
                except ValueError:
                    return self._send(400, "missing or bad TTL header")
                if not 1 <= ttl <= server.max_ttl_s:
                    return self._send(400, "TTL out of range")
                token = pysecrets.token_hex(16)
                with server.lock:
                    server.tokens[token] = time.monotonic() + ttl
                    server.token_puts += 1
                self._send(200, token)

            def do_GET(self) -> None:
                token = self.headers.get("X-aws-ec2-metadata-token", "")
                with server.lock:
                    expiry = server.tokens.get(token)
                    if expiry is None or time.monotonic() >= expiry:
                        server.rejected += 1
                        return self._send(401)
                    if self.path == ACTION_PATH:
                        server.action_polls += 1
                        if server.instance_action is not None:
                            server.action_polls_after_arm += 1
                    body = {ACTION_PATH: server.instance_action,
                            REBALANCE_PATH: server.rebalance}.get(self.path)
                    user_data = server.user_data
                if self.path == USER_DATA_PATH and user_data is not None:
                    return self._send(200, user_data)
                if body is None:
                    return self._send(404)
                self._send(200, json.dumps(body))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    def start(self) -> "ImdsServer":
        """Serve in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Shut the server down."""
        self.httpd.shutdown()
        self.httpd.server_close()

    def arm_notice(self, action: str = "terminate", when: str = "2030-01-01T00:02:00Z") -> None:
        """From now on, instance-action answers the notice."""
        with self.lock:
            self.instance_action = {"action": action, "time": when}

    def arm_rebalance(self, when: str = "2030-01-01T00:00:00Z") -> None:
        """From now on, the rebalance recommendation is present."""
        with self.lock:
            self.rebalance = {"noticeTime": when}


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

"""Helpers for tests that run `python -m spotrun daemon` as a real process on the local market.

A torch-free workload counts steps, rewrites SPOTRUN_PROGRESS_FILE, checkpoints every
CKPT_EVERY steps and on SIGUSR1 (the handler only sets a flag) and resumes from
SPOTRUN_RESUME_CHECKPOINT.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from sqlmodel import select


from spotrun.config import load_settings
from spotrun.db import Attempt, Job, LedgerMark, open_db, session
from spotrun.jobs import submit, validate_submission
from spotrun.providers.local.market import procs
from spotrun.providers.local.market.state import DB_FILE, MarketState

WORKLOAD = r'''
import json, os, signal, sys, time
from spotrun.checkpoints import put_checkpoint_files
from spotrun.store import open_store

flags = {"save": False}
signal.signal(signal.SIGUSR1, lambda s, f: flags.__setitem__("save", True))
total = int(os.environ.get("SPOTRUN_TOTAL_STEPS") or 100)
step_s = float(os.environ.get("WORKLOAD_STEP_S", "0.01"))
every = int(os.environ.get("WORKLOAD_CKPT_EVERY", "50"))
progress = os.environ["SPOTRUN_PROGRESS_FILE"]
resume = os.environ.get("SPOTRUN_RESUME_CHECKPOINT", "")
start = int(resume.split("-")[1]) if resume else 0
print("start %d secret=%s" % (start, os.environ.get("API_TOKEN", "")), flush=True)
if os.environ.get("WORKLOAD_FAIL"):
    print("failing on purpose", flush=True)
    sys.exit(3)
store = open_store(os.environ["SPOTRUN_CHECKPOINT_URI"])
last = None
for step in range(start + 1, total + 1):
    time.sleep(step_s)
    if flags["save"] or step % every == 0 or step == total:
        flags["save"] = False
        put_checkpoint_files(store, step, {"state.json": json.dumps({"step": step}).encode()})
        last = step
    tmp = progress + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"step": step, "total_steps": total, "steps_per_s": 1.0 / step_s,
                   "last_checkpoint_step": last, "checkpoint_save_s": 0.001,
                   "emergency_checkpoint_step": None, "ts": time.time()}, f)
    os.replace(tmp, progress)
print("done", flush=True)
'''

# These tests time faults against a linear market clock: the fixed pacing keeps it linear
# (tests/test_market_pacing.py, test_demo_e2e.py and test_rehearsal_startup.py cover the
# default rehearsal pacing).
FAST_TOML = """
[local]
trace = "{trace}"
time_scale = {scale}
notice_s = 120.0
pacing = "fixed"
[daemon]
schedule_interval_s = 0.2
reconcile_interval_s = 0.2
heartbeat_interval_s = 0.3
spend_interval_s = 0.5
liveness_interval_s = 1.0
heartbeat_timeout_s = {hb_timeout}
lease_ttl_s = {lease_ttl}
lease_renew_interval_s = 0.5
orphan_interval_s = 0.5
orphan_grace_s = 2.0
[agent]
heartbeat_interval_s = 0.2
notice_poll_interval_s = 0.2
log_flush_interval_s = 0.5
"""


def write_home(home: Path, trace: Path, *, scale: float = 600.0, hb_timeout: float = 30.0,
               lease_ttl: float = 3.0, extra: str = "") -> None:
    """spotrun.toml with short loops for a test home."""
    (home / "spotrun.toml").write_text(FAST_TOML.format(
        trace=trace, scale=scale, hb_timeout=hb_timeout, lease_ttl=lease_ttl) + extra)


def write_job(tmp: Path, name: str, *, steps: int, env: dict[str, str] | None = None,
              secrets: dict[str, str] | None = None, restarts: int | None = None) -> Path:
    """A job spec (and its code dir) running the workload."""
    code = tmp / f"code-{name}"
    code.mkdir(exist_ok=True)
    (code / "train.py").write_text(WORKLOAD)
    lines = [f"name: {name}", f"command: {sys.executable} train.py", f"workdir: {code}",
             f"work: {{total_steps: {steps}}}", "policy: {market: spot"
             + (f", max_restarts_on_error: {restarts}" if restarts is not None else "") + "}"]
    if env:
        lines.append("env: {" + ", ".join(f"{k}: '{v}'" for k, v in env.items()) + "}")
    if secrets:
        lines.append("secrets: {" + ", ".join(f"{k}: '{v}'" for k, v in secrets.items()) + "}")
    spec = tmp / f"{name}.yaml"
    spec.write_text("\n".join(lines) + "\n")
    return spec


def submit_job(home: Path, spec: Path) -> str:
    """Submit through the same code path as `spotrun submit`; the job id."""
    settings = load_settings(str(home))
    engine = open_db(settings.database_url)
    job = submit(validate_submission(spec, settings), engine)
    engine.dispose()
    return job.id


class DaemonProc:
    """`python -m spotrun daemon` in its own session, stdout appended to a log file."""

    def __init__(self, home: Path, log_path: Path, env: dict[str, str] | None = None) -> None:
        self.home = home
        self.log_path = log_path
        full = dict(os.environ, SPOTRUN_HOME=str(home), **(env or {}))
        full.pop("SPOTRUN_DB_URL", None) if "SPOTRUN_DB_URL" not in (env or {}) else None
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "spotrun", "daemon"],
                                         env=full, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self) -> None:
        """SIGKILL (a crash), then reap."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait for the exit status."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        return self.proc.wait(timeout=timeout_s)


def jobs_and_attempts(engine) -> tuple[dict[str, Job], list[Attempt]]:
    """Every job by id and every attempt."""
    with session(engine) as s:
        return ({j.id: j for j in s.exec(select(Job))}, list(s.exec(select(Attempt))))


def all_booked(engine) -> bool:
    """True when every attempt with an instance has a closed ledger mark."""
    with session(engine) as s:
        atts = [a for a in s.exec(select(Attempt)) if a.instance_id]
        marks = {m.key: m for m in s.exec(select(LedgerMark))}
    return all(marks.get(f"attempt:{a.id}") is not None and marks[f"attempt:{a.id}"].closed
               for a in atts)


def market_records(home: Path) -> list[Any]:
    """The market's instance records, read from its state database."""
    state = MarketState(home / "market")
    try:
        return state.all()
    finally:
        state.close()


def live_instance_pids(home: Path) -> dict[str, set[int]]:
    """Instance id -> processes still alive, for every instance the market ever started."""
    if not (home / "market" / DB_FILE).exists():
        return {}
    out = {}
    for rec in market_records(home):
        pids = procs.instance_pids(rec.instance_id, rec.pid, rec.pid_start_ticks)
        if pids:
            out[rec.instance_id] = pids
    return out


class FlakyStore:
    """A real store underneath; a seeded share of calls fail with StoreError (fault tests)."""

    WRITES = ("put_bytes", "put_if_absent", "put_file", "delete")
    READS = ("get_bytes", "get_file", "exists", "list")

    def __init__(self, inner: Any, *, write_fail: float, read_fail: float = 0.0,
                 seed: int = 0) -> None:
        import random
        self.inner = inner
        self.uri = inner.uri
        self.write_fail = write_fail
        self.read_fail = read_fail
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.failures = 0

    def _maybe_fail(self, name: str) -> None:
        from spotrun.errors import StoreError
        frac = self.write_fail if name in self.WRITES else self.read_fail
        with self.lock:
            if frac > 0 and self.rng.random() < frac:
                self.failures += 1
                raise StoreError(f"injected fault in {name}", field="store", value=self.uri)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in self.WRITES + self.READS:
            return attr

        def call(*args: Any, **kw: Any) -> Any:
            self._maybe_fail(name)
            return attr(*args, **kw)
        return call

    def sub(self, prefix: str) -> "FlakyStore":
        """A flaky view of a prefix (same fault stream)."""
        view = FlakyStore(self.inner.sub(prefix), write_fail=self.write_fail,
                          read_fail=self.read_fail)
        view.rng, view.lock = self.rng, self.lock
        return view


def log_events(log: Path, name: str) -> list[dict]:
    """The JSON log records of event `name` in a daemon's or server's log (other lines skipped)."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("event") == name:
            out.append(rec)
    return out

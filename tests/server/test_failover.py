"""Two `spotrun server --with-daemon` processes on one PostgreSQL (issue 42): both serve the
API, one daemon holds the lease; SIGKILL the leader and the other takes over within the
lease TTL, every job finishes exactly once, and the survivor's API answers throughout.

Everything is real: PostgreSQL started by the test, both servers, the local market and its
agent processes, the file store; jobs are submitted by the CLI through server A.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest

from spotrun.backends.remote import RemoteBackend
from spotrun.config import load_settings
from spotrun.daemon.lease import Lease, LeaseInfo
from spotrun.daemon.service import lease_poll_s
from spotrun.db import open_db
from spotrun.server import identity
from spotrun.states import EndReason, JobState

from conftest import kill_leftovers, write_trace
from daemon_helpers import (WORKLOAD, all_booked, jobs_and_attempts, live_instance_pids,
                            log_events, market_records, write_home)
from pg_helpers import pg_db, pg_url  # noqa: F401  (fixtures)
from polling import wait_for

pytestmark = pytest.mark.slow
JOBS = 4
LEASE_TTL_S = 3.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProc:
    """`python -m spotrun server --with-daemon` on 127.0.0.1, output appended to a log."""

    def __init__(self, home: Path, db_url: str, log_path: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, SPOTRUN_HOME=str(home), SPOTRUN_DB_URL=db_url)
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "spotrun", "server", "--with-daemon",
                 "--host", "127.0.0.1", "--port", str(self.port)],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)

    def answers(self) -> bool:
        """True when /api/v1/health answers 200."""
        try:
            return httpx.get(self.url + "/api/v1/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        """Send sig, then reap; the exit status."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        return self.proc.wait(timeout=timeout_s)


class ApiWatch:
    """Asks a server's API for the job list every 50 ms on a thread; keeps every failure."""

    def __init__(self, url: str, token: str) -> None:
        self.client = httpx.Client(base_url=url, timeout=5,
                                   headers={"Authorization": f"Bearer {token}"})
        self.calls = 0
        self.failures: list[str] = []
        self.max_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "ApiWatch":
        """Begin asking."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop asking."""
        self._stop.set()
        self._thread.join(timeout=10)
        self.client.close()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            t0 = time.monotonic()
            try:
                res = self.client.get("/api/v1/jobs")
                if res.status_code != 200 or not isinstance(res.json(), list):
                    self.failures.append(f"{res.status_code} {res.text[:200]}")
            except httpx.HTTPError as exc:
                self.failures.append(f"{type(exc).__name__}: {exc}")
            self.calls += 1
            self.max_s = max(self.max_s, time.monotonic() - t0)


def _cli(laptop: Path, *args: str) -> subprocess.CompletedProcess:
    """`spotrun ARGS` on a laptop: its own HOME and config, no SPOTRUN_* (so: the server)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPOTRUN_", "AWS_"))}
    env.update(HOME=str(laptop), XDG_CONFIG_HOME=str(laptop / ".config"))
    return subprocess.run([sys.executable, "-m", "spotrun", *args], env=env, cwd=laptop,
                          capture_output=True, text=True, timeout=120)


def _spec(laptop: Path, name: str, steps: int) -> Path:
    """A job spec on the laptop running the counting workload (daemon_helpers.WORKLOAD)."""
    folder = laptop / name
    (folder / "code").mkdir(parents=True)
    (folder / "code" / "train.py").write_text(WORKLOAD)
    spec = folder / "job.yaml"
    spec.write_text(f"name: {name}\ncommand: {sys.executable} train.py\nworkdir: code\n"
                    f"work: {{total_steps: {steps}}}\npolicy: {{market: spot}}\n"
                    "env: {WORKLOAD_STEP_S: '0.01', WORKLOAD_CKPT_EVERY: '100'}\n")
    return spec


def _holder(engine: Any) -> LeaseInfo | None:
    """The live lease holder as stored (None when there is none or it has expired)."""
    info = Lease(engine, ttl_s=LEASE_TTL_S).holder()
    if info is None or info.expired(datetime.now(timezone.utc)):
        return None
    return info


@pytest.fixture
def home(tmp_home: Path, tmp_path: Path, pg_db: str):  # noqa: F811  (pg_db: a fixture)
    """One spotrun home (settings, local market, file store) shared by both servers."""
    trace = write_trace(tmp_path / "trace.csv", {"za": [1] * 200}, tick_s=600.0)
    write_home(tmp_home, trace, scale=600.0, hb_timeout=30.0, lease_ttl=LEASE_TTL_S)
    yield tmp_home
    kill_leftovers(tmp_home / "market")


def test_killed_leader_is_replaced_within_the_lease_ttl_and_no_job_runs_twice(
        home: Path, pg_db: str, tmp_path: Path) -> None:  # noqa: F811
    t_start = time.monotonic()
    ttl_s = load_settings(str(home)).daemon.lease_ttl_s
    assert ttl_s == LEASE_TTL_S
    engine = open_db(pg_db)
    token = identity.add_user(engine, "alice", "member")
    servers: list[ServerProc] = []
    watch = None
    try:
        a = ServerProc(home, pg_db, tmp_path / "server-a.log")
        servers.append(a)
        wait_for(a.answers, 60, "server A to answer")
        # A leads (found from the lease, as `daemon --check` finds it); then B starts.
        wait_for(lambda: (h := _holder(engine)) is not None and h.pid == a.proc.pid, 30,
                 "server A's daemon to take the lease")
        b = ServerProc(home, pg_db, tmp_path / "server-b.log")
        servers.append(b)
        wait_for(b.answers, 60, "server B to answer")
        assert _holder(engine).pid == a.proc.pid   # B's daemon waits: both serve the API

        # Jobs go in through A's API, from a laptop with no home and no credentials: the
        # first by the CLI, the others by the same client in this process (a CLI start
        # costs seconds on a loaded box).
        laptop = tmp_path / "laptop"
        laptop.mkdir()
        res = _cli(laptop, "login", a.url, "--token", token)
        assert res.returncode == 0, res.stderr
        res = _cli(laptop, "submit", str(_spec(laptop, "job0", steps=300)))
        assert res.returncode == 0, res.stderr
        ids = [res.stdout.strip()]
        remote = RemoteBackend(a.url, token)
        for i in range(1, JOBS):
            sub = remote.submit(str(_spec(laptop, f"job{i}", steps=300 + 100 * i)), owner=None,
                                dry_run=False)
            ids.append(sub.job["id"])
        assert set(jobs_and_attempts(engine)[0]) == set(ids)
        assert {j.owner for j in jobs_and_attempts(engine)[0].values()} == {"alice"}
        holder = _holder(engine)
        leader, survivor = (a, b) if holder.pid == a.proc.pid else (b, a)
        assert leader is a

        # Kill the leader while its jobs run.
        def some_running():
            jobs, _ = jobs_and_attempts(engine)
            return any(j.state is JobState.RUNNING for j in jobs.values())
        wait_for(some_running, 60, "a job to run under the leader")
        watch = ApiWatch(survivor.url, token).start()
        wait_for(lambda: watch.calls >= 3, 10, "the survivor's API to be asked")
        t_kill = time.monotonic()
        leader.stop(signal.SIGKILL)

        def survivor_leads():
            h = _holder(engine)
            return h is not None and h.pid == survivor.proc.pid
        wait_for(survivor_leads, ttl_s + 5, "the survivor to take the lease")
        takeover_s = time.monotonic() - t_kill
        assert takeover_s <= ttl_s, f"takeover took {takeover_s:.2f} s, lease TTL {ttl_s} s"

        def settled():
            jobs, _ = jobs_and_attempts(engine)
            return all(jobs[j].state.is_terminal() for j in ids) and all_booked(engine)
        wait_for(settled, 120, "every job to finish and every attempt to be booked")
        watch.stop()
        assert survivor.proc.poll() is None

        # Every job finished, exactly once.
        jobs, atts = jobs_and_attempts(engine)
        for jid in ids:
            assert jobs[jid].state is JobState.SUCCEEDED, (jid, jobs[jid].reason)
            done = [x for x in atts if x.job_id == jid and x.end_reason is EndReason.COMPLETED]
            assert len(done) == 1, (jid, done)
        # Nothing launched twice: one instance per client token, each an attempt's own.
        wait_for(lambda: not live_instance_pids(home), 30, "every instance process to exit")
        recs = market_records(home)
        assert recs, "the market launched nothing"
        by_token = Counter(r.client_token for r in recs)
        assert all(n == 1 for n in by_token.values()), by_token
        tokens = {x.client_token: x for x in atts}
        for r in recs:
            assert r.client_token in tokens, f"instance {r.instance_id} has no attempt"
            assert tokens[r.client_token].instance_id == r.instance_id
            assert r.state.is_terminal()
        # The survivor's API answered every call, before, during and after the takeover.
        assert watch.calls >= 20 and not watch.failures, watch.failures[:5]

        # A clean stop releases the lease, so a restarted server leads at once. uvicorn
        # re-raises the SIGTERM it drained on, so the status is "ended by SIGTERM" (systemd
        # counts that as a clean stop).
        assert survivor.stop() in (0, -signal.SIGTERM)
        assert Lease(engine, ttl_s=ttl_s).holder() is None
        print(json.dumps({"takeover_s": round(takeover_s, 3), "lease_ttl_s": ttl_s,
                          "api_calls": watch.calls, "api_max_s": round(watch.max_s, 3),
                          "instances": len(recs), "attempts": len(atts),
                          "seconds": round(time.monotonic() - t_start, 1)}))
    finally:
        if watch is not None:
            watch.stop()
        for s in servers:
            if s.proc.poll() is None:
                s.stop(signal.SIGKILL)
        engine.dispose()



def test_frozen_leader_loses_the_lease_after_the_ttl_and_its_server_waits_again(
        home: Path, pg_db: str, tmp_path: Path) -> None:  # noqa: F811
    # The path two hosts take: the holder is not seen to die, its lease lapses. Woken, the
    # old leader must not act, and its server keeps serving (a standalone daemon exits 1).
    settings = load_settings(str(home))
    ttl_s, poll_s = settings.daemon.lease_ttl_s, lease_poll_s(settings)
    engine = open_db(pg_db)
    token = identity.add_user(engine, "alice", "member")
    servers: list[ServerProc] = []
    try:
        a = ServerProc(home, pg_db, tmp_path / "server-a.log")
        servers.append(a)
        wait_for(lambda: (h := _holder(engine)) is not None and h.pid == a.proc.pid, 60,
                 "server A's daemon to take the lease")
        b = ServerProc(home, pg_db, tmp_path / "server-b.log")
        servers.append(b)
        wait_for(lambda: log_events(tmp_path / "server-b.log", "lease_waiting"), 60,
                 "server B's daemon to wait for the lease")
        os.kill(a.proc.pid, signal.SIGSTOP)
        t_stop = time.monotonic()
        wait_for(lambda: (h := _holder(engine)) is not None and h.pid == b.proc.pid,
                 ttl_s + 10, "server B's daemon to take the lapsed lease")
        takeover_s = time.monotonic() - t_stop
        # A renewed at most one renewal interval before it froze; B polls every poll_s.
        assert ttl_s - settings.daemon.lease_renew_interval_s - 0.1 <= takeover_s, takeover_s
        assert takeover_s <= ttl_s + poll_s + 1.0, f"{takeover_s:.2f} s, TTL {ttl_s} s"

        os.kill(a.proc.pid, signal.SIGCONT)
        wait_for(lambda: log_events(tmp_path / "server-a.log", "daemon_standby"), 30,
                 "woken A to find its lease lost and wait again")
        assert a.proc.poll() is None and _holder(engine).pid == b.proc.pid
        res = httpx.get(a.url + "/api/v1/jobs", timeout=10,
                        headers={"Authorization": f"Bearer {token}"})
        assert res.status_code == 200, res.text

        # B stops cleanly: its lease is released and A's daemon leads again at once.
        t_term = time.monotonic()
        assert b.stop() in (0, -signal.SIGTERM)
        wait_for(lambda: (h := _holder(engine)) is not None and h.pid == a.proc.pid,
                 ttl_s, "server A's daemon to lead again")
        assert len(log_events(tmp_path / "server-a.log", "lease_acquired")) == 2
        print(json.dumps({"frozen_takeover_s": round(takeover_s, 3), "lease_ttl_s": ttl_s,
                          "release_takeover_s": round(time.monotonic() - t_term, 3)}))
    finally:
        for s in servers:
            if s.proc.poll() is None:
                os.kill(s.proc.pid, signal.SIGCONT)
                s.stop(signal.SIGKILL)
        engine.dispose()

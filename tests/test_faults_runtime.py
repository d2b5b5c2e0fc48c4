"""Runtime faults (issue 18): each test reproduces one fault with real processes, signals,
files and SQLite, and checks what spotrun does about it.

The daemon runs in-process (its loops on the runner's thread, or ticked directly) so the
test can read its database; market, instances, agents and workloads are real processes.
"""

from __future__ import annotations

import json
import os
import secrets as pysecrets
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from sqlmodel import select

import agent_helpers
from spotrun import layout
from spotrun.bundle import make_bundle
from spotrun.config import load_settings
from spotrun.daemon.reconcile import budget_stop_request
from spotrun.store import open_store
from spotrun.agent.fence import fenced_key
from spotrun.daemon.app import build_context, build_loops, build_runner
from spotrun.db import Event, Job, SpendEntry, attempts_of, open_db, session
from spotrun.providers.billing_rules import SpendKind
from spotrun.providers.facts import rules_for
from spotrun.providers.local.market import procs
from spotrun.providers.local.market.client import read_live_info
from spotrun.states import EndReason, JobState, Market, TerminationCause

from conftest import kill_leftovers, write_trace
from daemon_helpers import (WORKLOAD, DaemonProc, all_booked, market_records, submit_job,
                            write_home, write_job)
from polling import wait_for
from runtime_helpers import exit_report, hold_command, start_market

pytestmark = pytest.mark.slow


@pytest.fixture
def home(tmp_home: Path, tmp_path: Path):
    """A home on an always-available trace; its market and instances die at teardown."""
    trace = write_trace(tmp_path / "trace.csv", {"za": [1] * 300}, tick_s=600.0)
    write_home(tmp_home, trace, scale=60.0, hb_timeout=60.0)
    yield tmp_home
    kill_leftovers(tmp_home / "market")


@pytest.fixture
def daemon(home: Path):
    """Start in-process daemons on the home; all stopped at teardown."""
    runners = []

    def start(autostart: bool = True):
        ctx = build_context(load_settings(str(home)))
        runner = build_runner(ctx)
        runners.append(runner)
        if autostart:
            runner.start()
        return ctx, runner

    yield start
    for r in runners:
        r.stop(wait=True)


@pytest.fixture
def agents(tmp_path: Path):
    """Run real `spotrun agent` processes on a file:// store holding the workload bundle."""
    store_dir = tmp_path / "agent-store"
    work = tmp_path / "agent-work"
    work.mkdir()
    (work / "train.py").write_text(agent_helpers.WORKLOAD)
    make_bundle(work, tmp_path / "b.tar.gz")
    open_store(store_dir.as_uri()).put_file(layout.bundle_key("job-test"), tmp_path / "b.tar.gz")
    imds = agent_helpers.ImdsServer().start()
    procs = []

    def run(name: str, wait: bool = True, **overrides):
        cfg = agent_helpers.make_config(store_dir, imds.url, **overrides)
        proc, stderr = agent_helpers.start_agent(tmp_path, cfg, name=name)
        procs.append(proc)
        if wait:
            proc.wait(timeout=60)
        return proc, cfg

    run.store_dir = store_dir
    run.imds = imds
    yield run
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()
    imds.stop()


def _job(ctx, job_id: str) -> Job:
    with session(ctx.engine) as s:
        return s.get(Job, job_id)


def _attempts(ctx, job_id: str):
    with session(ctx.engine) as s:
        return attempts_of(s, job_id)


# ------------------------------------------------------------------ 1. reclaim after exit

def test_reclaim_after_the_exit_report_does_not_rerun_the_job(home, daemon, tmp_path):
    client = start_market(home, instance_command=hold_command(tmp_path))
    job_id = submit_job(home, write_job(tmp_path, "done", steps=30))
    ctx, runner = daemon()
    iid = wait_for(lambda: (a := _attempts(ctx, job_id)) and a[0].instance_id, 60, "the launch")
    # The daemon stops before it can see the exit report, so the reclaim surely lands before
    # the daemon terminates the instance: the next daemon finds both, as a slow one would.
    runner.stop(wait=True)
    wait_for(lambda: (exit_report(home, job_id, 1) or {}).get("reason") == "completed", 60,
             "the agent's exit report")
    assert any(r.instance_id == iid and not r.state.is_terminal() for r in market_records(home))
    client.interrupt(iid, 0.0)          # the reclaim lands before the instance is gone
    wait_for(lambda: any(r.instance_id == iid and r.state.is_terminal()
                         for r in market_records(home)), 60, "the reclaim")
    ctx, runner = daemon()
    job = wait_for(lambda: ((j := _job(ctx, job_id)).state.is_terminal()
                            or len(_attempts(ctx, job_id)) > 1) and j, 60, "the job to settle")
    wait_for(lambda: all_booked(ctx.engine), 30, "the attempt to be booked")
    runner.stop(wait=True)
    atts = _attempts(ctx, job_id)
    assert job.state is JobState.SUCCEEDED, (job.state, [a.detail for a in atts])
    assert [a.end_reason for a in atts] == [EndReason.COMPLETED]
    assert atts[0].instance_cause == TerminationCause.SPOT_RECLAIM.value
    # The ledger follows the cloud's cause: a reclaim is billed by the reclaim rule.
    rec = next(r for r in market_records(home) if r.instance_id == iid)
    assert rec.cause is TerminationCause.SPOT_RECLAIM
    rules = rules_for("local")
    span = rec.ended_at - rec.launched_at
    want = rules.billed_seconds(span, market=Market.SPOT, reclaimed_by_provider=True)
    with session(ctx.engine) as s:
        rows = list(s.exec(select(SpendEntry).where(SpendEntry.instance_id == iid)))
    billed = sum(r.billed_seconds for r in rows if r.kind in SpendKind.instance_kinds())
    assert billed == pytest.approx(want, abs=1e-3), (span, rows)
    assert span < rules.spot_reclaim_free_within_s and billed == pytest.approx(0.0, abs=1e-3)


# ------------------------------------------------------------------ 12. resume after a budget stop

def test_a_resumed_attempt_ignores_the_budget_stop_meant_for_the_one_before(agents):
    # The state `spotrun resume` leaves: the first attempt's budget stop request is still
    # in control.json. Attempt 2 starts with it there, every time: no timing involved.
    control = agents.store_dir / layout.control_key("job-test")
    control.parent.mkdir(parents=True, exist_ok=True)
    control.write_bytes(budget_stop_request([1]))
    env = {"WORKLOAD_STEP_S": "0.01"}
    # A grace shorter than the job: obeying the stale request would always stop it.
    agents("second", attempt=2, total_steps=150, env=env, stop_grace_s=0.3)
    second = json.loads((agents.store_dir / layout.exit_key("job-test", 2)).read_text())
    assert second["reason"] == "completed" and second["step"] == 150, second
    # The attempt the request names does obey it.
    agents("first", attempt=1, total_steps=3000, env=env, stop_grace_s=0.3)
    first = json.loads((agents.store_dir / layout.exit_key("job-test", 1)).read_text())
    assert first["reason"] == "budget", first


def test_a_job_that_fails_while_asked_to_save_for_the_budget_ended_for_the_budget(agents,
                                                                                tmp_path):
    # The agent asked the job to save and stop because the budget is spent; the job fails on
    # the way out (here: exits 3 on SIGUSR1). The attempt ended for the budget, not in an
    # error the daemon would retry and pay for.
    ready = tmp_path / "handler-installed"
    command = (f"{sys.executable} -c \"import signal, sys, time; "
               f"signal.signal(signal.SIGUSR1, lambda *a: sys.exit(3)); "
               f"open('{ready}', 'w').close(); time.sleep(120)\"")
    proc, _ = agents("first", wait=False, attempt=1, command=command, stop_grace_s=60.0)
    wait_for(ready.exists, timeout_s=60, what="the job's SIGUSR1 handler")
    control = agents.store_dir / layout.control_key("job-test")
    control.parent.mkdir(parents=True, exist_ok=True)
    control.write_bytes(budget_stop_request([1]))
    proc.wait(timeout=60)
    report = json.loads((agents.store_dir / layout.exit_key("job-test", 1)).read_text())
    assert report["exit_code"] == 3 and report["reason"] == "budget", report


# ------------------------------------------------------------------ 2. market restart

def test_instances_still_hear_notices_after_the_market_restarts_on_a_new_port(home, daemon,
                                                                              tmp_path):
    job_id = submit_job(home, write_job(tmp_path, "long", steps=100000,
                                        env={"WORKLOAD_STEP_S": "0.02"}))
    ctx, runner = daemon()
    att = wait_for(lambda: next((a for a in _attempts(ctx, job_id)
                                 if a.last_heartbeat_at is not None), None), 60, "a heartbeat")
    runner.stop(wait=True)
    old = read_live_info(home / "market")
    os.kill(int(old["pid"]), signal.SIGTERM)     # the market stops; its instances run on
    wait_for(lambda: read_live_info(home / "market") is None, 30, "the market to stop")
    client = start_market(home)
    assert read_live_info(home / "market")["port"] != old["port"]
    assert any(r.instance_id == att.instance_id and not r.state.is_terminal()
               for r in market_records(home)), "the instance should survive the restart"
    client.interrupt(att.instance_id, 60.0)      # notice now, reclaim one market minute later
    wait_for(lambda: any(r.instance_id == att.instance_id and r.state.is_terminal()
                         for r in market_records(home)), 60, "the reclaim")
    notice = home / "store" / layout.notice_key(job_id, 1)
    assert notice.exists(), "the agent never heard the interruption notice"
    assert json.loads(notice.read_text())["action"] == "terminate"


# ------------------------------------------------------------------ 6. a forgotten attempt

def test_two_instances_never_act_as_one_attempt_after_the_database_forgets_it(
        home, daemon, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    code = tmp_path / "code-twin"
    code.mkdir()
    (code / "train.py").write_text(WORKLOAD)
    spec = tmp_path / "twin.yaml"
    # Each run of the command leaves <attempt>-<instance> in marks/ before it trains.
    spec.write_text(
        "name: twin\n"
        f"command: touch {marks}/$SPOTRUN_ATTEMPT-$SPOTRUN_INSTANCE_ID && {sys.executable} "
        f"train.py\nworkdir: {code}\nwork: {{total_steps: 400}}\n"
        "env: {WORKLOAD_STEP_S: '0.02', WORKLOAD_CKPT_EVERY: '20'}\npolicy: {market: spot}\n")
    job_id = submit_job(home, spec)
    ctx, runner = daemon()
    first = wait_for(lambda: next((a for a in _attempts(ctx, job_id)
                                   if a.last_heartbeat_at is not None), None), 60, "attempt 1")
    runner.stop(wait=True)
    # The state a lost WAL leaves: the attempt row (and what followed it) is gone, the job
    # looks queued, while its instance runs on.
    db = sqlite3.connect(home / "spotrun.db")
    with db:
        for table in ("attempt", "spendentry", "ledgermark", "event"):
            db.execute(f"DELETE FROM {table} WHERE job_id = ?", (job_id,))
        db.execute("UPDATE job SET state = 'QUEUED', last_step = 0 WHERE id = ?", (job_id,))
    db.close()
    # The second daemon's loops are ticked by hand, so the worst order happens every time:
    # the twin is fenced out and its instance gone, then the first instance (now an orphan)
    # is reaped and leaves attempt 1's exit report, and only then is the twin's end read.
    ctx, runner = daemon(autostart=False)
    loops = {type(item.loop).__name__: item.loop for item in build_loops(ctx)}

    def tick(*names: str) -> None:
        for name in names:
            loops[name].tick(ctx.clock.now())

    def twin_attempt():
        tick("SchedulerLoop", "ReconcileLoop")
        return next((a for a in _attempts(ctx, job_id) if a.instance_id
                     and a.instance_id != first.instance_id), None)

    twin = wait_for(twin_attempt, 60, "the daemon to launch attempt 1 again")
    assert twin.number == 1
    store = open_store(load_settings(str(home)).store_url)
    wait_for(lambda: store.exists(fenced_key(job_id, 1, twin.instance_id)), 60,
             "the twin to be fenced out")
    wait_for(lambda: all(i.state.is_terminal() for i in ctx.provider.describe(
        instance_ids=[twin.instance_id])), 60, "the twin instance to shut down")
    wait_for(lambda: (tick("OrphanLoop"), store.exists(layout.exit_key(job_id, 1)))[1], 60,
             "the first instance to be reaped and leave attempt 1's exit report")
    tick("ReconcileLoop")
    ended_twin = next(a for a in _attempts(ctx, job_id) if a.id == twin.id)
    assert f"fenced out: attempt 1 already runs on {first.instance_id}" in ended_twin.detail
    runner.start()
    job = wait_for(lambda: (j := _job(ctx, job_id)).state.is_terminal() and j, 120,
                   "the job to finish")
    runs = sorted(p.name for p in marks.iterdir())
    ones = [r for r in runs if r.startswith("1-")]
    assert ones == [f"1-{first.instance_id}"], runs   # the second instance never ran it
    assert job.state is JobState.SUCCEEDED, job.reason
    fenced = list((home / "store" / layout.attempt_prefix(job_id, 1)).glob("fenced-*.json"))
    assert [json.loads(p.read_text())["holder"] for p in fenced] == [first.instance_id]


# ------------------------------------------------------------------ 9. failed checkpoint saves

TORCH_JOB = r'''
import time
import torch
from spotrun.errors import CheckpointError
from spotrun.torch import Checkpointer, SaveOptions

torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
ck = Checkpointer(model=model, optimizer=opt, every_steps=10,
                  save=SaveOptions(retries=1, retry_backoff_s=0.05))
start = ck.restore()
for step in range(start, ck.total_steps):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    time.sleep(0.02)
    try:
        ck.step(step + 1)
    except CheckpointError as exc:   # this job prefers progress to safety: it trains on
        print("checkpoint failed:", exc, flush=True)
try:
    ck.close()
except CheckpointError as exc:
    print("last checkpoint failed:", exc, flush=True)
'''


def _immutable(path: Path, on: bool) -> bool:
    """chattr +i/-i: a directory even root cannot write into (a read-only store)."""
    flag = "+i" if on else "-i"
    return subprocess.run(["chattr", flag, str(path)], capture_output=True).returncode == 0


def test_failed_checkpoint_saves_are_an_event_a_status_warning_and_an_audit_note(
        home, daemon, tmp_path):
    code = tmp_path / "code-ro"
    code.mkdir()
    (code / "train.py").write_text(TORCH_JOB)
    spec = tmp_path / "ro.yaml"
    spec.write_text(f"name: ro\ncommand: {sys.executable} train.py\nworkdir: {code}\n"
                    "work: {total_steps: 60}\npolicy: {market: spot}\n")
    job_id = submit_job(home, spec)
    ckpt = home / "store" / layout.default_checkpoint_prefix(job_id)
    ckpt.mkdir(parents=True)
    if not _immutable(ckpt, True):
        ckpt.rmdir()
        ckpt.write_text("not a directory")   # no chattr here: every write fails all the same
    try:
        ctx, runner = daemon()
        job = wait_for(lambda: (j := _job(ctx, job_id)).state.is_terminal() and j, 180,
                       "the job to finish")
        runner.stop(wait=True)
    finally:
        if ckpt.is_dir():
            _immutable(ckpt, False)
    assert job.state is JobState.SUCCEEDED, job.reason
    with session(ctx.engine) as s:
        events = [e for e in s.exec(select(Event).where(Event.job_id == job_id))
                  if e.kind == "checkpoint_save_failed"]
    assert len(events) >= 3, events             # saves at 10, 20, ... all failed
    att = _attempts(ctx, job_id)[0]
    assert att.checkpoint_failures == len(events) and "step" in att.checkpoint_error
    status = _spotrun(home, "status", job_id, "--json")
    assert status.returncode == 0, status.stderr
    warnings = json.loads(status.stdout)["warnings"]
    assert warnings and "checkpoint save(s) failed" in warnings[0]
    text = _spotrun(home, "status")
    assert "warning" in text.stdout and "checkpoint save" in text.stdout, text.stdout
    audit = _spotrun(home, "audit", job_id, "--json")
    assert audit.returncode == 0, audit.stderr
    assert "checkpoint save(s) failed" in audit.stdout


def _spotrun(home: Path, *args: str) -> subprocess.CompletedProcess:
    """Run the real CLI (`python -m spotrun`) on the home, wide enough for one-line rows."""
    env = dict(os.environ, SPOTRUN_HOME=str(home), COLUMNS="300")
    return subprocess.run([sys.executable, "-m", "spotrun", *args], env=env,
                          capture_output=True, text=True, timeout=60)


# ------------------------------------------------------------------ 10. secrets on the instance

def test_a_secret_the_job_prints_reaches_no_disk_and_not_the_market_environment(home, tmp_path):
    secret = "tok-" + pysecrets.token_hex(12)
    job_id = submit_job(home, write_job(tmp_path, "leaky", steps=150,
                                        env={"WORKLOAD_STEP_S": "0.02"},
                                        secrets={"API_TOKEN": "env:SPOTRUN_TEST_SECRET"}))
    d = DaemonProc(home, tmp_path / "daemon.log", env={"SPOTRUN_TEST_SECRET": secret})
    try:
        logs = home / "market" / "instances"
        # While the job runs, its local output already holds only the redacted value.
        live = wait_for(lambda: next((p for p in logs.glob("*/spotrun-agent/output.log")
                                      if b"secret=" in p.read_bytes()), None), 60,
                        "the job's output on the instance")
        assert b"secret=***" in live.read_bytes() and secret.encode() not in live.read_bytes()
        market_pid = int(read_live_info(home / "market")["pid"])
        environ = Path(f"/proc/{market_pid}/environ").read_bytes()
        assert secret.encode() not in environ, "the market process holds the secret"
        engine = open_db(f"sqlite:///{home / 'spotrun.db'}")
        job = wait_for(lambda: (j := _job_of(engine, job_id)).state.is_terminal() and j, 90,
                       "the job to finish")
        assert d.terminate() == 0
        engine.dispose()
    finally:
        if d.proc.poll() is None:
            d.kill()
    assert job.state is JobState.SUCCEEDED, job.reason
    shipped = b"".join(p.read_bytes() for p in sorted(
        (home / "store" / layout.log_prefix(job_id, 1)).glob("*.log")))
    assert b"secret=***" in shipped                # the job did print it
    assert not list(logs.glob("*/spotrun-agent/output.log")), "output.log left on the instance"
    leaks = [str(p) for p in home.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert leaks == [], leaks


def _job_of(engine, job_id: str) -> Job:
    with session(engine) as s:
        return s.get(Job, job_id)


# ------------------------------------------------------------------ 11. market down at a reclaim

def test_a_reclaim_the_market_was_down_for_is_booked_until_the_instance_really_stopped(
        home, daemon, tmp_path):
    job_id = submit_job(home, write_job(tmp_path, "unwatched", steps=100000,
                                        env={"WORKLOAD_STEP_S": "0.02"}))
    ctx, runner = daemon()
    att = wait_for(lambda: next((a for a in _attempts(ctx, job_id)
                                 if a.last_heartbeat_at is not None), None), 60, "a heartbeat")
    client = start_market(home)
    clock = client.time()

    def market_now() -> float:
        return clock["epoch_wall_s"] + (time.time() - clock["epoch_wall_s"]) * clock["time_scale"]

    reclaim_at = client.interrupt(att.instance_id, 120.0)["reclaim_at"]
    runner.stop(wait=True)
    os.kill(int(read_live_info(home / "market")["pid"]), signal.SIGKILL)   # market and daemon down
    due = datetime.fromisoformat(reclaim_at).timestamp()
    wait_for(lambda: market_now() > due + 240.0, 30, "the reclaim time to pass, and more")
    rec = next(r for r in market_records(home) if r.instance_id == att.instance_id)
    assert procs.instance_pids(rec.instance_id, rec.pid, rec.pid_start_ticks), \
        "nothing reclaims while the market is down: the instance runs on"
    ran_until = market_now()
    start_market(home)
    ended = wait_for(lambda: next((r for r in market_records(home) if r.instance_id ==
                                   att.instance_id and r.state.is_terminal()), None), 30,
                     "the late reclaim")
    assert ended.cause is TerminationCause.SPOT_RECLAIM
    assert ended.ended_at >= ran_until, (ended.ended_at - due, "backdated to the reclaim time")
    ctx, runner = daemon()
    wait_for(lambda: all_booked(ctx.engine), 60, "the attempt to be booked")
    runner.stop(wait=True)
    with session(ctx.engine) as s:
        rows = list(s.exec(select(SpendEntry).where(SpendEntry.instance_id == rec.instance_id)))
    span = ended.ended_at - ended.launched_at
    compute = sum(r.billed_seconds for r in rows if r.kind == SpendKind.COMPUTE.value) + sum(
        r.billed_seconds for r in rows if r.kind == SpendKind.CORRECTION.value
        and r.note.startswith("reverses row"))
    assert compute == pytest.approx(span, abs=1e-3), rows      # booked as the market reports
    want = rules_for("local").billed_seconds(span, market=Market.SPOT, reclaimed_by_provider=True)
    billed = sum(r.billed_seconds for r in rows if r.kind in SpendKind.instance_kinds())
    assert billed == pytest.approx(want, abs=1e-3)


def test_imds_client_follows_the_discovery_file_to_a_moved_endpoint(tmp_path):
    from spotrun.agent.imds import INSTANCE_ACTION, ImdsClient, discovery_from_env
    from spotrun.providers.local.market.imds import ImdsServer
    first = ImdsServer("i-0moved").start()
    discovery = tmp_path / "market.json"
    discovery.write_text(json.dumps({"imds_url": first.url + "/imds"}))
    client = ImdsClient(first.url + "/imds/i-0moved", discover=discovery_from_env(
        {"SPOTRUN_IMDS_DISCOVERY": str(discovery), "SPOTRUN_INSTANCE_ID": "i-0moved"}))
    assert client.get(INSTANCE_ACTION) is None
    first.stop()
    second = ImdsServer("i-0moved").start()
    try:
        second.arm_notice("terminate", "2030-01-01T00:02:00Z")
        discovery.write_text(json.dumps({"imds_url": second.url + "/imds"}))
        assert '"terminate"' in (client.get(INSTANCE_ACTION) or "")
        assert client.rediscoveries == 1 and client.base_url.startswith(second.url)
    finally:
        second.stop()


class _ReclaimDuringDescribe:
    """The real local provider; its next describe is preceded by a reclaim of `victim`,
    so the instance ends after the spend tick read the clock (as a slow call would see)."""

    def __init__(self, inner, victim: str) -> None:
        self.inner, self.victim = inner, victim

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def describe(self, **kw):
        if self.victim:
            self.inner.client.interrupt(self.victim, 0.0)
            self.victim = ""
        return self.inner.describe(**kw)


def test_an_end_reported_after_the_tick_read_the_clock_is_booked_to_the_end(home, daemon,
                                                                          tmp_path):
    from spotrun.daemon.spend import SpendLoop
    job_id = submit_job(home, write_job(tmp_path, "slowcall", steps=100000,
                                        env={"WORKLOAD_STEP_S": "0.02"}))
    ctx, runner = daemon()
    att = wait_for(lambda: next((a for a in _attempts(ctx, job_id)
                                 if a.last_heartbeat_at is not None), None), 60, "a heartbeat")
    runner.stop(wait=True)
    SpendLoop(ctx.engine, _ReclaimDuringDescribe(ctx.provider, att.instance_id)).tick()
    rec = next(r for r in market_records(home) if r.instance_id == att.instance_id)
    assert rec.state.is_terminal()
    with session(ctx.engine) as s:
        rows = list(s.exec(select(SpendEntry).where(SpendEntry.instance_id == rec.instance_id)))
    compute = sum(r.billed_seconds for r in rows if r.kind == SpendKind.COMPUTE.value)
    assert compute == pytest.approx(rec.ended_at - rec.launched_at, abs=1e-3), rows

"""Chaos: the real daemon process is SIGKILLed at 20 seeded moments while jobs launch, get
reclaimed, recover, checkpoint and are cancelled; each time it is restarted.

At the end: every job completed or was cancelled as asked, no instance process is
left, nothing was launched twice, and the ledger accounts for every instance-second.
Everything is real: daemon, market and agent processes, SQLite, the file store.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlmodel import select

from spotrun.db import Attempt, Job, SpendEntry, open_db, session
from spotrun.jobs import request_cancel
from spotrun.providers.billing_rules import SpendKind
from spotrun.providers.facts import rules_for
from spotrun.states import AttemptState, EndReason, JobState, Market, TerminationCause

from conftest import kill_leftovers, write_trace
from daemon_helpers import (WORKLOAD, all_booked, live_instance_pids, market_records, submit_job,
                            write_home, write_job)
from polling import wait_for
from zygote import Zygote, daemon_env

pytestmark = pytest.mark.slow
KILLS = 20
SEED = 8
PHASES = ("launch", "reclaim", "recovery", "checkpoint", "random")

# daemon_helpers.WORKLOAD, but a step ends the job (last checkpoint, exit 0) once the gate
# file exists: the test opens it after its last kill, so the jobs are busy at every kill
# however slow the box, and the run ends soon after the kills do.
_PACED = "for step in range(start + 1, total + 1):\n    time.sleep(step_s)\n"
assert _PACED in WORKLOAD
GATED_WORKLOAD = WORKLOAD.replace(_PACED, (
    "step = start\n"
    "while step < total:\n"
    "    time.sleep(step_s)\n"
    "    step = total if os.path.exists(os.environ['CHAOS_GATE']) else step + 1\n"))


@pytest.fixture(scope="module")
def zygote():
    """The daemons: 42 SIGKILLed or stopped processes, each forked from one that has
    spotrun imported (tests/zygote.py), not each paying ~1.5 CPU s to start."""
    z = Zygote()
    yield z
    z.close()


def _daemon(zygote: Zygote, home: Path, log: Path):
    """`python -m spotrun daemon` on home in its own session (as DaemonProc), log appended."""
    return zygote.spawn(["daemon"], daemon_env(home), log)


def _gated_job(tmp: Path, name: str, steps: int, gate: Path) -> Path:
    """A spot job running GATED_WORKLOAD (a step every 0.02 s, a checkpoint every 40)."""
    code = tmp / f"code-{name}"
    code.mkdir()
    (code / "train.py").write_text(GATED_WORKLOAD)
    spec = tmp / f"{name}.yaml"
    spec.write_text(f"name: {name}\ncommand: {sys.executable} train.py\nworkdir: {code}\n"
                    f"work: {{total_steps: {steps}}}\npolicy: {{market: spot}}\n"
                    f"env: {{WORKLOAD_STEP_S: '0.02', WORKLOAD_CKPT_EVERY: '40', "
                    f"CHAOS_GATE: '{gate}'}}\n")
    return spec


def _period(n: int, down: int, ticks: int = 400) -> list[int]:
    """Available except at tick % 8 == down (a reclaim every 8 wall seconds per zone)."""
    return [0 if i % 8 == down else 1 for i in range(ticks)]


@pytest.fixture
def home(tmp_home: Path, tmp_path: Path):
    """A home whose three zones each lose spot capacity one tick in eight, staggered."""
    trace = write_trace(tmp_path / "trace.csv",
                        {"za": _period(0, 3), "zb": _period(0, 5), "zc": _period(0, 7)},
                        tick_s=600.0)
    write_home(tmp_home, trace, scale=600.0, hb_timeout=30.0, lease_ttl=3.0)
    yield tmp_home
    kill_leftovers(tmp_home / "market")


class Watcher:
    """Reads the database (as any CLI would) to find the states worth a kill."""

    def __init__(self, engine, cancel_job: str) -> None:
        self.engine = engine
        self.cancel_job = cancel_job
        self.steps: dict[str, int] = {}
        self.ended: set[int] = set()

    def snapshot(self) -> None:
        """Remember each job's checkpointed step."""
        with session(self.engine) as s:
            self.steps = {j.id: j.last_step for j in s.exec(select(Job))}
            self.ended = {a.id for a in s.exec(select(Attempt)) if a.end_reason is not None}

    def hit(self, phase: str) -> bool:
        """True when the database shows the phase of interest now."""
        with session(self.engine) as s:
            jobs = list(s.exec(select(Job)))
            atts = list(s.exec(select(Attempt)))
        if phase == "launch":
            return any(a.state is AttemptState.LAUNCHING for a in atts)
        if phase == "reclaim":
            # A notice seen, or a reclaim just recorded (the recovery that follows is cut short).
            return any((a.state is AttemptState.RUNNING and a.notice_at is not None)
                       or (a.end_reason is EndReason.RECLAIMED and a.id not in self.ended)
                       for a in atts)
        if phase == "recovery":
            return any(j.state in (JobState.RECOVERING, JobState.STARTING)
                       and any(a.job_id == j.id and a.number > 1 for a in atts) for j in jobs)
        if phase == "checkpoint":
            return any(j.last_step > self.steps.get(j.id, 0) for j in jobs)
        if phase == "cancel":
            return any(j.id == self.cancel_job and j.state is JobState.CANCELLING for j in jobs)
        return False


def _lease_count(log: Path) -> int:
    try:
        return log.read_text(errors="replace").count('"lease_acquired"')
    except OSError:
        return 0


def test_sigkill_at_20_moments_loses_nothing(home: Path, tmp_path: Path, zygote: Zygote):
    t0 = time.monotonic()
    rng = random.Random(SEED)
    # why these sizes (~50 steps/s): alpha and bravo would run for 400 s and more, so they
    # are busy until the gate opens after the last kill, however slow the box; charlie
    # (~20 s of steps) may end by itself among the kills, as a job would; the victim is
    # cancelled.
    gate = tmp_path / "gate"
    specs = {"alpha": 20000, "bravo": 25000, "charlie": 1000, "victim": 50000}
    ids = {n: submit_job(home, _gated_job(tmp_path, n, steps, gate))
           for n, steps in specs.items()}
    engine = open_db(f"sqlite:///{home / 'spotrun.db'}")
    watcher = Watcher(engine, ids["victim"])
    log = tmp_path / "daemon.log"
    pause = threading.Event()
    hits: list[str] = []
    for k in range(KILLS):
        d = _daemon(zygote, home, log)
        before = k
        wait_for(lambda: _lease_count(log) > before, 30, f"daemon {k} to take the lease")
        watcher.snapshot()
        phase = "cancel" if k == 6 else PHASES[rng.randrange(len(PHASES))]
        if phase == "random":
            pause.wait(rng.uniform(0.1, 2.5))
            hits.append("random")
        else:
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline and not watcher.hit(phase):
                pause.wait(0.02)
            hits.append(phase if watcher.hit(phase) else f"missed:{phase}")
            pause.wait(rng.uniform(0.0, 0.3))
        d.kill()
        if k == 5:
            request_cancel(engine, ids["victim"])   # while the daemon is down
    # A last daemon runs to the end, then stops cleanly on SIGTERM.
    gate.touch()
    final = _daemon(zygote, home, log)
    wait_for(lambda: _lease_count(log) > KILLS, 30, "the last daemon to take the lease")

    def settled():
        jobs, _ = jobs_now(engine)
        return all(j.state.is_terminal() for j in jobs.values()) and all_booked(engine)
    wait_for(settled, 150, "every job to finish and every attempt to be booked")
    assert final.terminate() == 0
    print(f"kill phases: {hits}; total {time.monotonic() - t0:.1f} s")

    jobs, atts = jobs_now(engine)
    for name, jid in ids.items():
        want = JobState.CANCELLED if name == "victim" else JobState.SUCCEEDED
        assert jobs[jid].state is want, (name, jobs[jid].state, jobs[jid].reason)
    hit_phases = {h for h in hits if not h.startswith("missed")}
    assert len(hit_phases) >= 4, hits
    assert any(a.end_reason is EndReason.RECLAIMED for a in atts), "the trace reclaimed nothing"

    # No process of any instance is left.
    wait_for(lambda: not live_instance_pids(home), 30, "every instance process to exit")

    # Nothing launched twice: each attempt's client token maps to exactly one instance,
    # and every instance the market ever started belongs to an attempt.
    recs = market_records(home)
    by_token = Counter(r.client_token for r in recs)
    assert all(n == 1 for n in by_token.values()), by_token
    tokens = {a.client_token: a for a in atts}
    for r in recs:
        assert r.client_token in tokens, f"instance {r.instance_id} has no attempt"
        assert tokens[r.client_token].instance_id == r.instance_id
        assert r.state.is_terminal()
    for a in atts:
        if a.instance_id is None:
            assert a.end_reason in (EndReason.LAUNCH_FAILED, EndReason.CANCELLED), a

    # The ledger accounts for every instance-second (market clock, raw seconds).
    rules = rules_for("local")
    with session(engine) as s:
        rows = list(s.exec(select(SpendEntry)))
    assert not [r for r in rows if r.attempt_id is None and r.instance_id], "no orphan expected"
    for r in recs:
        mine = [x for x in rows if x.instance_id == r.instance_id]
        span = r.ended_at - r.launched_at
        reclaimed = r.cause is TerminationCause.SPOT_RECLAIM
        billed = rules.billed_seconds(span, market=Market(r.market.value),
                                      reclaimed_by_provider=reclaimed)
        total = sum(x.billed_seconds for x in mine if x.kind in SpendKind.instance_kinds())
        assert total == pytest.approx(billed, abs=1e-3), (r.instance_id, span, mine)
        compute = sum(x.billed_seconds for x in mine if x.kind == SpendKind.COMPUTE.value)
        past_end = sum(x.billed_seconds for x in mine if x.kind == SpendKind.CORRECTION.value
                       and x.note.startswith("reverses row"))
        assert compute + past_end == pytest.approx(span, abs=1e-3), (r.instance_id, mine)
    engine.dispose()
    print(json.dumps({"instances": len(recs), "attempts": len(atts),
                      "seconds": round(time.monotonic() - t0, 1)}))


def jobs_now(engine):
    """Jobs by id and all attempts."""
    from daemon_helpers import jobs_and_attempts
    return jobs_and_attempts(engine)


EXIT_KILLS = 20


def test_sigkill_between_exit_report_and_instance_end_never_reruns(tmp_home: Path,
                                                                   tmp_path: Path,
                                                                   zygote: Zygote):
    """20 SIGKILLs of the daemon, each placed while a finished job's instance still runs
    (its agent wrote exit.json); the instance is then reclaimed. No job may run twice."""
    from runtime_helpers import exit_report, hold_command, start_market
    trace = write_trace(tmp_path / "trace.csv", {"za": [1] * 300}, tick_s=600.0)
    write_home(tmp_home, trace, scale=60.0, hb_timeout=60.0, lease_ttl=3.0)
    rng = random.Random(SEED)
    try:
        client = start_market(tmp_home, instance_command=hold_command(tmp_path))
        ids = [submit_job(tmp_home, write_job(tmp_path, f"j{i}", steps=20))
               for i in range(EXIT_KILLS // 2)]
        engine = open_db(f"sqlite:///{tmp_home / 'spotrun.db'}")
        log = tmp_path / "daemon.log"
        pending = list(ids)
        kills = 0
        while kills < EXIT_KILLS:
            d = _daemon(zygote, tmp_home, log)
            before = kills
            wait_for(lambda: _lease_count(log) > before, 30, f"daemon {kills} to take the lease")
            if kills % 2 == 0:
                # Kill while a finished job's instance is up, then reclaim it while down.
                job = wait_for(lambda: next((j for j in pending if (exit_report(
                    tmp_home, j, 1) or {}).get("reason") == "completed"), None), 60,
                    "a job's exit report")
                d.kill()
                iid = _instance_of(tmp_home, job)
                client.interrupt(iid, 0.0)
            else:
                # Kill a moment after the reclaim, before or while reconcile ends the attempt.
                threading.Event().wait(rng.uniform(0.0, 0.4))
                d.kill()
                pending.remove(job)
            kills += 1
        final = _daemon(zygote, tmp_home, log)
        wait_for(lambda: _lease_count(log) > kills, 30, "the last daemon to take the lease")
        wait_for(lambda: all(j.state.is_terminal() for j in jobs_now(engine)[0].values())
                 or any(a.number > 1 for a in jobs_now(engine)[1]), 90, "every job to settle")
        assert final.terminate() == 0
        jobs, atts = jobs_now(engine)
        reran = sorted({a.job_id for a in atts if a.number > 1})
        assert reran == [], f"{len(reran)} job(s) ran twice"
        assert all(jobs[j].state is JobState.SUCCEEDED for j in ids), \
            [(j.state, j.reason) for j in jobs.values()]
        assert all(a.end_reason is EndReason.COMPLETED for a in atts)
        by_job = Counter(r.tags.get("spotrun:job") for r in market_records(tmp_home))
        assert all(by_job[j] == 1 for j in ids), by_job
        print(json.dumps({"kills": kills, "jobs": len(ids), "reruns": len(reran)}))
        engine.dispose()
    finally:
        kill_leftovers(tmp_home / "market")


def _instance_of(home: Path, job_id: str) -> str:
    # The market's record, not the attempt row: a daemon killed between the launch and its
    # record of the instance id (a loaded box widens that window) leaves the row without it.
    found = [r.instance_id for r in market_records(home) if r.tags.get("spotrun:job") == job_id]
    assert len(found) == 1, (job_id, found)
    return found[0]

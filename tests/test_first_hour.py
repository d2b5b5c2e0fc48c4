"""The first hour in the CLI (issue 22, point 4): what `submit`, `status` and `cancel` say and do
while no daemon runs, and an immediate cancel that cannot race a launch into a resurrection.

Real CLI (CliRunner), real SQLite, the real lease row a daemon writes, the real local market.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from spotrun.cli import cli
from spotrun.config import load_settings
from spotrun.daemon.lease import Lease
from spotrun.db import Attempt, Event, Job, open_db, session
from spotrun.states import AttemptState, JobState, Market
from sqlmodel import select

from conftest import kill_leftovers, write_trace


def _spec(tmp_path: Path, name: str = "fh") -> Path:
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(f"name: {name}\ncommand: python train.py\npolicy: {{market: spot}}\n")
    return spec


def _cli(home: Path, *args: str, columns: int = 80):
    return CliRunner().invoke(cli, list(args), env={"SPOTRUN_HOME": str(home),
                                                    "COLUMNS": str(columns)})


def _submit(home: Path, spec: Path):
    res = _cli(home, "submit", str(spec))
    assert res.exit_code == 0, res.output
    return res, res.stdout.strip()


def test_submit_without_a_daemon_records_the_job_and_says_how_to_start_one(tmp_home, tmp_path):
    res, job_id = _submit(tmp_home, _spec(tmp_path))
    said = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(said) == 1, res.stderr
    assert f"SPOTRUN_HOME={tmp_home}" in said[0] and "`spotrun daemon`" in said[0] \
        and "systemd/spotrun-daemon.service" in said[0]
    assert (Path(__file__).parent.parent / "systemd" / "spotrun-daemon.service").is_file()
    engine = open_db(load_settings(str(tmp_home)).database_url)
    with session(engine) as s:
        assert s.get(Job, job_id).state is JobState.QUEUED   # recorded all the same
    engine.dispose()

    st = _cli(tmp_home, "status", "--json")
    assert st.exit_code == 0, st.output
    (row,) = json.loads(st.stdout)
    assert row["state"] == "queued" and row["reason"] == said[0].removeprefix("queued; ")
    table = _cli(tmp_home, "status")
    assert table.exit_code == 0, table.output
    assert "queued (no daemon)" in table.stdout and f"SPOTRUN_HOME={tmp_home}" in table.stdout
    assert max(len(line) for line in table.stdout.splitlines()) <= 80 \
        or "spotrun daemon" in table.stdout.splitlines()[-1]   # the note line soft-wraps
    one = _cli(tmp_home, "status", job_id, "--json")
    assert json.loads(one.stdout)["reason"] == row["reason"]


def test_with_a_daemon_holding_the_lease_submit_and_status_say_nothing_of_it(tmp_home,
                                                                            tmp_path):
    engine = open_db(load_settings(str(tmp_home)).database_url)
    lease = Lease(engine, ttl_s=60.0)
    assert lease.try_acquire()   # as `spotrun daemon` does, from this live process
    try:
        res, job_id = _submit(tmp_home, _spec(tmp_path))
        assert "daemon" not in res.stderr
        (row,) = json.loads(_cli(tmp_home, "status", "--json").stdout)
        assert row["reason"] is None
        assert "no daemon" not in _cli(tmp_home, "status").stdout
    finally:
        lease.release()
    # Released (a clean stop): the job waits for a daemon again, and status says so.
    (row,) = json.loads(_cli(tmp_home, "status", "--json").stdout)
    assert row["reason"].startswith("no daemon is running")
    engine.dispose()


def test_an_expired_lease_is_no_daemon(tmp_home, tmp_path):
    engine = open_db(load_settings(str(tmp_home)).database_url)
    lease = Lease(engine, ttl_s=0.0)          # written, but expired as soon as it is
    assert lease.try_acquire()
    res, _ = _submit(tmp_home, _spec(tmp_path))
    assert "no daemon is running" in res.stderr
    engine.dispose()


def test_cancel_of_a_job_that_never_launched_is_immediate(tmp_home, tmp_path):
    _, job_id = _submit(tmp_home, _spec(tmp_path))
    res = _cli(tmp_home, "cancel", job_id)
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == f"{job_id} cancelled"
    again = _cli(tmp_home, "cancel", job_id, "--json")
    assert json.loads(again.stdout) == {"id": job_id, "state": "cancelled",
                                        "cancel_requested": True}
    assert _cli(tmp_home, "cancel", job_id).stdout.strip() == f"{job_id} already cancelled"
    engine = open_db(load_settings(str(tmp_home)).database_url)
    with session(engine) as s:
        kinds = [e.kind for e in s.exec(select(Event).where(Event.job_id == job_id))]
    assert kinds == ["submitted", "cancelled"]
    engine.dispose()


def test_cancel_of_a_job_with_an_attempt_is_left_to_the_daemon(tmp_home, tmp_path):
    _, job_id = _submit(tmp_home, _spec(tmp_path))
    engine = open_db(load_settings(str(tmp_home)).database_url)
    with session(engine) as s:
        # The daemon wrote its launch intent but the job row still reads queued: the
        # instance may be starting, so only the daemon can end it.
        s.add(Attempt(job_id=job_id, number=1, state=AttemptState.LAUNCHING,
                      market=Market.SPOT, instance_type="p3.2xlarge", zone="us-east-1a",
                      price_usd_per_hour=1.0, client_token="t-1"))
        s.commit()
    res = _cli(tmp_home, "cancel", job_id)
    assert res.exit_code == 0 and res.stdout.strip() == f"{job_id} cancel requested"
    with session(engine) as s:
        job = s.get(Job, job_id)
        assert (job.state, job.cancel_requested) == (JobState.QUEUED, True)
    engine.dispose()


@pytest.fixture
def scheduler_home(tmp_home: Path, tmp_path: Path):
    trace = write_trace(tmp_path / "trace.csv", {"za": [1] * 50}, tick_s=600.0)
    (tmp_home / "spotrun.toml").write_text(f'[local]\ntrace = "{trace}"\ntime_scale = 60.0\n')
    yield tmp_home
    kill_leftovers(tmp_home / "market")


def test_a_cancel_landing_while_the_scheduler_decides_wins_and_nothing_launches(
        scheduler_home, tmp_path, monkeypatch):
    """The user cancels between the scheduler's read of the queued job and its intent write:
    the job ends cancelled, no attempt row is written, no instance starts, nothing raises."""
    from spotrun.daemon import scheduler as sched
    from spotrun.daemon.app import build_context
    home = scheduler_home
    _, job_id = _submit(home, _spec(tmp_path))
    ctx = build_context(load_settings(str(home)))
    real = sched.placement_for
    said = []

    def decide_then_user_cancels(*args, **kw):
        placed = real(*args, **kw)   # the daemon has decided where to launch ...
        said.append(_cli(home, "cancel", job_id).stdout.strip())   # ... and the user cancels
        return placed

    monkeypatch.setattr(sched, "placement_for", decide_then_user_cancels)
    loop = sched.SchedulerLoop(ctx)
    loop.tick(ctx.clock.now())
    loop.tick(ctx.clock.now())
    assert said == [f"{job_id} cancelled"]
    with session(ctx.engine) as s:
        job = s.get(Job, job_id)
        attempts = list(s.exec(select(Attempt).where(Attempt.job_id == job_id)))
    assert job.state is JobState.CANCELLED and attempts == []
    assert ctx.provider.describe(job_id=job_id) == []
    ctx.engine.dispose()

"""`spotrun interrupt` on an instance that already has a notice keeps the reclaim its job was
told, and says so; each line says the reclaim as the provider really set it."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from click.testing import CliRunner
from conftest import write_trace

from spotrun.cli import cli
from spotrun.interrupts import said
from spotrun.config import load_settings
from spotrun.db import Attempt, open_db, session
from spotrun.jobs import submit, validate_submission
from spotrun.providers import LaunchRequest, Pool
from spotrun.providers.base import Interruption
from spotrun.providers.local.provider import LocalProvider
from spotrun.states import AttemptState, JobState, Market


def _cli(home: Path, *args: str):
    return CliRunner().invoke(cli, list(args), env={"SPOTRUN_HOME": str(home)})


def _running_job(home: Path, tmp_path: Path, provider: LocalProvider) -> tuple[str, str]:
    """A submitted job whose live attempt runs on a real market instance: (job, instance)."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('hi')\n")
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: rehearse\ncommand: python train.py\nworkdir: {code}\n"
                    "policy: {market: spot}\n")
    settings = load_settings(str(home))
    engine = open_db(settings.database_url)
    job = submit(validate_submission(spec, settings), engine)
    pool = Pool("p3.2xlarge", "us-east-1a", Market.SPOT)
    token = uuid.uuid4().hex
    info = provider.launch(provider.plan_launch(LaunchRequest(
        job_id=job.id, attempt_number=1, client_token=token, candidates=(pool,),
        user_data="{}", tags={})))
    with session(engine) as s:
        s.add(Attempt(job_id=job.id, number=1, state=AttemptState.RUNNING, market=Market.SPOT,
                      instance_type=pool.instance_type, zone=pool.zone, price_usd_per_hour=0.9,
                      client_token=token, instance_id=info.instance_id))
        s.get(type(job), job.id).state = JobState.RUNNING
        s.commit()
    engine.dispose()
    return job.id, info.instance_id


def test_a_second_interrupt_keeps_the_notice_and_says_so(tmp_home: Path, tmp_path: Path,
                                                         market_factory) -> None:
    trace = write_trace(tmp_path / "trace.csv", {"us-east-1a": [1] * 50}, tick_s=600.0)
    (tmp_home / "spotrun.toml").write_text(f'[local]\ntrace = "{trace}"\ntime_scale = 10.0\n')
    client = market_factory(state_dir=tmp_home / "market", trace=trace, time_scale=10.0)
    job_id, iid = _running_job(tmp_home, tmp_path, LocalProvider(client))

    first = _cli(tmp_home, "interrupt", job_id, "--notice-s", "100")   # inside 120 s: notice now
    assert first.exit_code == 0, first.output
    assert first.output.strip() == f"{job_id} node 0: interruption sent to {iid} (reclaim " \
                                   f"in 100 s)"
    told = client.instances(ids=[iid])[0]
    assert told["notice_at"] is not None

    again = _cli(tmp_home, "interrupt", job_id)        # the provider's 120 s, later than 100
    assert again.exit_code == 0, again.output
    line = again.output.strip()
    assert line.startswith(f"{job_id} node 0: {iid} already has a notice; reclaim stays at "), line
    assert "(market clock, in " in line and len(again.output.strip().splitlines()) == 1
    left_s = float(line.rsplit("in ", 1)[1].split(" s)")[0])
    assert 0 < left_s <= 100
    now = client.instances(ids=[iid])[0]
    assert (now["reclaim_at"], now["notice_at"]) == (told["reclaim_at"], told["notice_at"])

    as_json = _cli(tmp_home, "interrupt", job_id, "--notice-s", "500", "--json")
    assert as_json.exit_code == 0, as_json.output
    [inst] = json.loads(as_json.output)["instances"]
    assert inst["instance_id"] == iid and inst["already_noticed"] is True
    assert inst["reclaim_at"] is not None and 0 < inst["reclaim_in_s"] <= 100
    assert client.instances(ids=[iid])[0]["reclaim_at"] == told["reclaim_at"]


def test_each_line_says_the_providers_own_window() -> None:
    aws = Interruption("i-1", reclaim_in_s=120.0, at_most=True,
                       note="FIS gives 120-900 s of notice")
    assert said("i-1", aws, 30.0, "wall") == \
        "interruption sent to i-1 (reclaim within 120 s; FIS gives 120-900 s of notice)"
    gcp = Interruption("vm-1", reclaim_in_s=30.0, at_most=True)
    assert said("vm-1", gcp, 30.0, "wall") == "interruption sent to vm-1 (reclaim within 30 s)"
    now = Interruption("i-2", reclaim_in_s=0.0)
    assert said("i-2", now, 0.0, "market") == "i-2 reclaimed at once, without a notice"
    due = Interruption("i-3", reclaim_in_s=40.0)
    want = "interruption sent to i-3 (reclaim in 40 s: one was already due sooner than the " \
           "120 s asked)"
    assert said("i-3", due, 120.0, "market") == want

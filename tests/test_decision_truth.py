"""One decision, one truth: `submit --dry-run` names the pool the daemon then launches first.

A frozen local market (constant availability and prices, one zone without capacity) is
started first; for each spec the dry-run's first candidate is read, then the job is submitted
and a real `python -m spotrun daemon` process launches it. Every first launch must equal its
dry-run's first candidate: type, zone, market and GPUs used.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from spotrun.cli import cli
from spotrun.planning.plans import dry_run_request
from spotrun.planning.market_view import decide_on_market
from spotrun.config import load_settings
from spotrun.daemon.app import build_context
from spotrun.daemon.scheduler import SchedulerLoop
from spotrun.db import attempts_of, open_db, session
from spotrun.jobs import submit, validate_submission
from spotrun.providers.facts import catalog_for
from daemon_helpers import DaemonProc, jobs_and_attempts, submit_job
from conftest import write_prices, write_trace
from polling import wait_for

pytestmark = pytest.mark.slow

TOML = """
[local]
trace = "{trace}"
prices = "{prices}"
time_scale = 600.0
[daemon]
schedule_interval_s = 0.2
reconcile_interval_s = 0.2
heartbeat_interval_s = 0.3
spend_interval_s = 0.5
liveness_interval_s = 1.0
heartbeat_timeout_s = 300.0
orphan_interval_s = 5.0
"""

SPECS = {
    # Cheapest progress on one GPU: a 1-GPU type in the cheapest zone with capacity.
    "one-gpu": "work: {total_steps: 1000}\npolicy: {market: spot}\n",
    # Eight GPUs used per node: only 8-GPU nodes qualify.
    "eight-gpu": "resources: {gpus: 8, instance_types: [p3.16xlarge, g5.48xlarge, p4d.24xlarge]}\n"
                 "policy: {market: spot}\n",
    # A range: each type picks its count; the plan picks the pool.
    "gpu-range": 'resources: {gpus: "1-4", instance_types: [g5.xlarge, g5.12xlarge, '
                 'p3.8xlarge]}\npolicy: {market: spot}\n',
    # On-demand only.
    "on-demand": "resources: {instance_types: [g6.xlarge, p3.2xlarge]}\n"
                 "policy: {market: on-demand}\n",
    # A deadline job: the shared deadline policy picks market and zone for the ranked type.
    # (In za and zb: with zc, at 0.40 and one row of history that cannot rule it coming up,
    # `spotrun`'s plan waits for it; DEADLINE_WAITS below.)
    "deadline": "work: {reference_hours: 10, reference_instance: p3.2xlarge}\n"
                "resources: {instance_types: [p3.2xlarge, g5.xlarge], zones: [za, zb]}\n"
                "policy: {market: auto, deadline_hours: 200}\n",
    # A model that needs sharding across the node's GPUs.
    "fsdp-7b": "model: {params_billion: 7, sharding: fsdp}\nresources: {gpus: 8}\n"
               "policy: {market: spot}\n",
}

# The same deadline job free to use zc: the dry-run says the deadline policy waits this
# interval (and launches nothing), which is what the daemon's placer then does.
DEADLINE_WAITS = ("work: {reference_hours: 10, reference_instance: p3.2xlarge}\n"
                  "resources: {instance_types: [p3.2xlarge, g5.xlarge]}\n"
                  "policy: {market: auto, deadline_hours: 200}\n")


@pytest.fixture
def frozen_home(tmp_home: Path, tmp_path: Path, market_factory):
    """A home whose market never changes: za and zb always up, zc never; flat prices."""
    trace = write_trace(tmp_path / "trace.csv", {"za": [1] * 200, "zb": [1] * 200,
                                                 "zc": [0] * 200}, tick_s=600.0)
    prices = write_prices(tmp_path / "prices.csv",
                          [("za", 0, 1.10), ("zb", 0, 0.92), ("zc", 0, 0.40)])
    (tmp_home / "spotrun.toml").write_text(TOML.format(trace=trace, prices=prices))
    market_factory(state_dir=tmp_home / "market", trace=trace, prices=str(prices),
                   time_scale=600.0)
    return tmp_home


def _write_spec(tmp: Path, name: str, body: str) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(f"name: {name}\ncommand: python -c 'import time; time.sleep(600)'\n{body}")
    return path


def test_first_launch_equals_the_dry_runs_first_candidate(frozen_home: Path,
                                                          tmp_path: Path) -> None:
    expected: dict[str, dict] = {}
    for name, body in SPECS.items():
        spec = _write_spec(tmp_path, name, body)
        res = CliRunner().invoke(cli, ["submit", "--dry-run", "--json", str(spec)],
                                 env={"SPOTRUN_HOME": str(frozen_home)})
        assert res.exit_code == 0, res.output
        plan = json.loads(res.output)
        assert plan["prices"]["source"].startswith("live"), plan["prices"]
        first = plan["candidates"][0]
        assert first["launch"] and first["zone"] != "zc", first   # zc has no capacity
        expected[submit_job(frozen_home, spec)] = first
    res = CliRunner().invoke(cli, ["submit", "--dry-run", "--json",
                                   str(_write_spec(tmp_path, "deadline-waits", DEADLINE_WAITS))],
                             env={"SPOTRUN_HOME": str(frozen_home)})
    assert res.exit_code == 0, res.output
    waits = json.loads(res.output)
    assert not any(c["launch"] for c in waits["candidates"]), waits["candidates"]
    assert "the deadline policy spotrun waits" in waits["wait_reason"], waits
    assert not (frozen_home / "daemon.log").exists()

    daemon = DaemonProc(frozen_home, tmp_path / "daemon.log")
    engine = open_db(load_settings(str(frozen_home)).database_url)
    try:
        def launched():
            _, attempts = jobs_and_attempts(engine)
            firsts = {a.job_id: a for a in attempts if a.number == 1 and a.instance_id}
            return firsts if set(firsts) == set(expected) else None
        firsts = wait_for(launched, timeout_s=90, what="a first launch for every job")
    finally:
        daemon.terminate()
        engine.dispose()
    for job_id, first in expected.items():
        a = firsts[job_id]
        got = (a.instance_type, a.zone, a.market.value, a.gpus)
        want = (first["instance_type"], first["zone"], first["market"], first["gpus_used"])
        assert got == want, (job_id, got, want)
    # The GPU units reached the instance: one GPU used on the 1-GPU job, eight on the 8-GPU one.
    by_name = {first_id.rsplit("-", 1)[0]: firsts[first_id] for first_id in firsts}
    assert by_name["one-gpu"].gpus == 1 and by_name["eight-gpu"].gpus == 8


def test_the_dry_run_asks_for_the_launch_the_scheduler_makes(frozen_home: Path,
                                                             tmp_path: Path) -> None:
    # One builder (spotrun.agent.contract): the dry-run's request is what a real scheduling
    # pass sends for the same job: pool, price cap, the agent's config, and every tag, the
    # budget's project and owner included (the cloud's bill groups by them).
    settings = load_settings(str(frozen_home))
    sub = validate_submission(_write_spec(tmp_path, "tagged", "project: vision\n"
                                          "policy: {market: spot}\n"), settings)
    _, placed = decide_on_market(sub.spec, settings, catalog_for(settings), None)
    dry = dry_run_request(sub, settings, placed.first, placed.candidates)
    ctx = build_context(settings)
    try:
        submit(sub, ctx.engine)
        SchedulerLoop(ctx).tick(datetime.now(timezone.utc))
        with session(ctx.engine) as s:
            attempt = attempts_of(s, sub.job_id)[0]
        [launched] = ctx.provider.describe(instance_ids=[attempt.instance_id])
    finally:
        ctx.engine.dispose()
    sent = ctx.provider.plan_launch(replace(dry, client_token=attempt.client_token))
    body = sent.calls[0]["body"]
    assert launched.tags == body["tags"]
    assert body["tags"]["spotrun:project"] == "vision"
    assert body["tags"]["spotrun:owner"] == sub.job_owner() != ""
    assert (launched.instance_type, launched.zone, launched.market.value) == (
        body["candidates"][0]["instance_type"], body["candidates"][0]["zone"], "spot")
    user_data = frozen_home / "market" / "instances" / launched.instance_id / "user-data.json"
    assert json.loads(user_data.read_text()) == json.loads(dry.user_data)

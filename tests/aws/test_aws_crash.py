"""The riskiest moment of the aws launch path, against moto: the daemon process is SIGKILLed
after EC2 accepted the launch and before the attempt row learnt its instance id. A fresh
daemon re-issues the same client token and adopts that instance: exactly one exists."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any


from spotrun.daemon.app import build_context
from spotrun.daemon.reconcile import ReconcileLoop
from spotrun.daemon.scheduler import SchedulerLoop
from spotrun.db import attempts_of, session
from spotrun.jobs import submit, validate_submission
from spotrun.states import AttemptState

from .moto_fixtures import MotoServer, moto_settings

TYPE = "g5.xlarge"
CRASHING_DAEMON = r'''
import json, os, signal, sys
from spotrun.config import load_settings
from spotrun.daemon.app import build_context
from spotrun.daemon.scheduler import SchedulerLoop

ctx = build_context(load_settings(sys.argv[1]))
real_launch = ctx.provider.launch

def launch_then_die(plan):
    info = real_launch(plan)          # EC2 has started the instance ...
    print(json.dumps({"instance_id": info.instance_id}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)   # ... and the daemon dies before recording it

ctx.provider.launch = launch_then_die
SchedulerLoop(ctx).tick(ctx.clock.now())
'''


def _toml(settings: Any) -> str:
    a = settings.aws
    subnets = ", ".join(f'"{s}"' for s in a.subnets)
    sgs = ", ".join(f'"{s}"' for s in a.security_group_ids)
    return (f'provider = "aws"\n[aws]\nendpoint_url = "{a.endpoint_url}"\nami_id = "{a.ami_id}"\n'
            f"subnets = [{subnets}]\nsecurity_group_ids = [{sgs}]\n"
            f'spotrun_install = "{a.spotrun_install}"\nretry_base_s = 0.001\n'
            "retry_max_s = 0.01\nretry_attempts = 4\nspot_advisor_url = \"\"\n")


def _spotrun_instances(ec2: Any, job_id: str) -> list[dict]:
    res = ec2.describe_instances(Filters=[{"Name": "tag:spotrun:job", "Values": [job_id]}])
    return [i for r in res["Reservations"] for i in r["Instances"]
            if i["State"]["Name"] not in ("terminated", "shutting-down")]


def test_sigkill_between_launch_and_db_write_leaves_one_instance(moto: MotoServer, ec2: Any,
                                                                tmp_home: Path, tmp_path: Path):
    now = datetime.now(timezone.utc)
    moto.layer.set_prices([(TYPE, z, now - timedelta(hours=1), p) for z, p in
                           (("us-east-1a", 0.43), ("us-east-1b", 0.44), ("us-east-1c", 0.45))])
    settings = moto_settings(moto, ec2, str(tmp_home))
    (tmp_home / "spotrun.toml").write_text(_toml(settings))
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: crash\ncommand: python train.py\n"
                    f"resources: {{instance_types: [{TYPE}]}}\npolicy: {{market: spot}}\n")
    ctx = build_context(settings)
    job = submit(validate_submission(spec, settings), ctx.engine)

    script = tmp_path / "crashing_daemon.py"
    script.write_text(CRASHING_DAEMON)
    out = subprocess.run([sys.executable, str(script), str(tmp_home)], capture_output=True,
                         text=True, timeout=120, env=dict(os.environ))
    assert out.returncode == -9, out.stderr[-2000:]
    started = json.loads(out.stdout.strip().splitlines()[-1])["instance_id"]
    with session(ctx.engine) as s:
        [att] = attempts_of(s, job.id)
    assert att.state is AttemptState.LAUNCHING and att.instance_id is None   # the crash window
    assert [i["InstanceId"] for i in _spotrun_instances(ec2, job.id)] == [started]

    # A fresh daemon finishes the launch with the same client token: it adopts, not relaunches.
    fresh = build_context(settings)
    SchedulerLoop(fresh).tick(fresh.clock.now())
    ReconcileLoop(fresh).tick(fresh.clock.now())
    SchedulerLoop(fresh).tick(fresh.clock.now())   # nothing more to launch for this job
    with session(fresh.engine) as s:
        atts = attempts_of(s, job.id)
    assert len(atts) == 1 and atts[0].instance_id == started
    assert atts[0].state in (AttemptState.LAUNCHING, AttemptState.RUNNING)
    assert [i["InstanceId"] for i in _spotrun_instances(ec2, job.id)] == [started]
    fresh.engine.dispose()
    ctx.engine.dispose()

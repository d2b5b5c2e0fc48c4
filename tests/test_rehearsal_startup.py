"""A user's job with a long start-up, on the default local settings, reaches its first step
before its first reclaim (issue 22): the paced market runs start-up in real time.

Written from docs/quickstart.md and docs/checkpointing.md: the job sleeps 20 s (imports,
data loading) before the three-line Checkpointer loop. The market starts at trace row 24,
where its only pool goes away 9.75 market minutes later: on a clock that ran start-up at
x60, those 20 s were 20 market minutes and the instance was reclaimed before step 1.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import kill_leftovers
from polling import wait_for
from sqlmodel import select

from spotrun.config import load_settings
from spotrun.daemon.app import build_context, build_runner
from spotrun.db import Attempt, session

pytestmark = pytest.mark.slow

JOB = '''
import time
time.sleep(20)                      # imports, data loading, a warm-up: 20 s before step 1
import torch
from spotrun.torch import Checkpointer

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
ckpt = Checkpointer(model=model, optimizer=opt)
start = ckpt.restore()
for step in range(start, 100000):
    loss = model(torch.ones(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    ckpt.step(step + 1)
    time.sleep(0.05)
ckpt.finish(100000)
'''


def test_twenty_seconds_of_start_up_reach_step_one_before_the_first_reclaim(
        tmp_home: Path, tmp_path: Path, cpu_load) -> None:
    (tmp_home / "spotrun.toml").write_text("[local]\nstart_tick = 24\n")   # all else default
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(JOB)
    spec = code / "job.yaml"
    spec.write_text("name: slow-start\ncommand: python train.py\nworkdir: .\n"
                    "resources: {instance_types: [p3.2xlarge]}\npolicy: {market: spot}\n")
    submitted = subprocess.run([sys.executable, "-m", "spotrun", "submit", str(spec)],
                               env={**os.environ, "SPOTRUN_HOME": str(tmp_home)},
                               capture_output=True, text=True)
    assert submitted.returncode == 0, submitted.stderr
    ctx = build_context(load_settings(str(tmp_home)))
    runner = build_runner(ctx)
    runner.start()
    try:
        def first_attempt_settled() -> Attempt | None:
            with session(ctx.engine) as s:
                att = s.exec(select(Attempt).where(Attempt.number == 1)).first()
                return att if att is not None and (att.last_step >= 1
                                                   or att.state.is_terminal()) else None
        att = wait_for(first_attempt_settled, 240, "attempt 1 to reach step 1 or end")
        assert att.last_step >= 1, f"attempt 1 ended {att.end_reason} at step {att.last_step}"
    finally:
        runner.stop(wait=True)
        kill_leftovers(tmp_home / "market")

"""`spotrun demo` as a user runs it (`make demo` calls it), on a loaded machine.

The demo must prove its promises on any machine: at least two reclaims, each landing after
the attempt trained past its resume step, each later attempt resuming from a checkpoint its
predecessor wrote, the job succeeded, the audit adds up. The market's paced clock is why it
cannot lose a race with the machine: the same demo with its job made 5x slower runs beside
it, under the same load, and keeps the same promises.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
SPOTRUN = [sys.executable, "-m", "spotrun"]


def _start_demo(home: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "SPOTRUN_HOME": str(home), "COLUMNS": "80"}
    return subprocess.Popen(SPOTRUN + ["demo", "--stall-s", "150", *extra], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _status(home: Path) -> dict:
    env = {**os.environ, "SPOTRUN_HOME": str(home)}
    out = subprocess.run(SPOTRUN + ["status", "--json"], env=env, capture_output=True,
                         text=True, check=True).stdout
    [job] = json.loads(out)
    env_job = subprocess.run(SPOTRUN + ["status", job["id"], "--json"], env=env,
                             capture_output=True, text=True, check=True).stdout
    return json.loads(env_job)


def _assert_promises(home: Path, output: str) -> None:
    assert "proved:" in output and "not proved" not in output, output[-3000:]
    job = _status(home)
    assert job["state"] == "succeeded"
    atts = job["attempts"]
    reclaimed = [a for a in atts if a["end_reason"] == "reclaimed"]
    assert len(reclaimed) >= 2, output[-3000:]
    for prev, att in zip(atts, atts[1:]):
        # Resumed from a step > 0 that the previous attempt reached and saved ...
        assert 0 < att["resumed_from"] <= prev["ran_to"], (prev, att)
        assert att["resumed_from"] > (prev["resumed_from"] or 0), (prev, att)
    for att in atts:
        # ... and each attempt trained past the step it resumed from before it ended.
        assert att["ran_to"] > (att["resumed_from"] or 0), att


@pytest.mark.timeout(900)   # two demos on a loaded machine: minutes, by design
def test_demo_keeps_its_promises_under_load_even_with_a_5x_slower_job(
        tmp_path: Path, cpu_load) -> None:
    slow_spec = tmp_path / "slow" / "job.yaml"
    slow_spec.parent.mkdir()
    (slow_spec.parent / "train.py").write_text((REPO / "configs/demo/train.py").read_text())
    spec = (REPO / "configs/demo/job.yaml").read_text()
    assert "--min-step-s 0.05" in spec
    # Five times the wall time per step, so each step costs the market five times as much
    # time; a fifth of the steps keeps the test's own time in bounds.
    slow_spec.write_text(spec.replace("--min-step-s 0.05", "--min-step-s 0.25")
                         .replace("total_steps: 1500", "total_steps: 300"))
    assert "total_steps: 300\n" in slow_spec.read_text()
    demo = _start_demo(tmp_path / "demo")
    slow = _start_demo(tmp_path / "slow-home", "--spec", str(slow_spec))
    out_demo, _ = demo.communicate(timeout=600)
    out_slow, _ = slow.communicate(timeout=600)
    assert demo.returncode == 0, out_demo[-3000:]
    assert slow.returncode == 0, out_slow[-3000:]
    _assert_promises(tmp_path / "demo", out_demo)
    _assert_promises(tmp_path / "slow-home", out_slow)

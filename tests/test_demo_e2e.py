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
        # ... and each attempt trained past the step it resumed from before it ended (one
        # that resumed after the last step only exits).
        if (att["resumed_from"] or 0) < job["total_steps"]:
            assert att["ran_to"] > (att["resumed_from"] or 0), att


@pytest.mark.timeout(900)   # two demos on a loaded machine: minutes, by design
def test_demo_keeps_its_promises_under_load_even_with_a_5x_slower_job(
        tmp_path: Path, cpu_load) -> None:
    # The demo's own job and spec, with a narrower model (--hidden 128): its 50 ms step floor,
    # not the CPU, then sets its pace on a loaded test machine. `make demo` itself is
    # measured by bench/demo.py (docs/benchmarks.md).
    spec = (REPO / "configs/demo/job.yaml").read_text()
    assert "--min-step-s 0.05" in spec and "total_steps: 1500" in spec
    demo_spec = _copy_demo(tmp_path / "demo-job", spec.replace(
        "--min-step-s 0.05", "--min-step-s 0.05 --hidden 128"))
    # Five times the wall time per step, so each step costs the market five times as much
    # time; a fifth of the steps keeps the test's own time in bounds.
    slow_spec = _copy_demo(tmp_path / "slow-job", spec.replace(
        "--min-step-s 0.05", "--min-step-s 0.25 --hidden 128").replace(
        "total_steps: 1500", "total_steps: 300"))
    demo = _start_demo(tmp_path / "demo", "--spec", str(demo_spec))
    slow = _start_demo(tmp_path / "slow-home", "--spec", str(slow_spec))
    out_demo, _ = demo.communicate(timeout=800)
    out_slow, _ = slow.communicate(timeout=800)
    assert demo.returncode == 0, out_demo[-3000:]
    assert slow.returncode == 0, out_slow[-3000:]
    _assert_promises(tmp_path / "demo", out_demo)
    _assert_promises(tmp_path / "slow-home", out_slow)


def _copy_demo(folder: Path, spec_text: str) -> Path:
    """The demo's train.py beside a spec written from the demo's own."""
    folder.mkdir()
    (folder / "train.py").write_text((REPO / "configs/demo/train.py").read_text())
    (folder / "job.yaml").write_text(spec_text)
    return folder / "job.yaml"

"""A Hugging Face Trainer job through two reclaims: its whole state, its outputs, `spotrun pull`.

Daemon + local market + agents + real transformers, one job for the module's tests (each
reclaim costs a relaunch and a framework start-up; the tests read different things of the
same run). The job is a Trainer script written from the transformers docs
(tests/workloads/hf_best_plain.py) with spotrun added (hf_best_train.py): evaluation and a
checkpoint every 10 steps, `load_best_model_at_end` on `eval_loss`, `save_total_limit=2`,
cosine warm-up, gradient accumulation 2. The first notice lands during the evaluation after
step 10, the second between steps 27 and 28. Against the plain script run uninterrupted:

- issue 23: the same final weights (those of the best checkpoint, step 20, which must exist
  after the second resume), the same best metric and step, and the same `log_history`
  (every logged step once; only wall-clock fields may differ);
- outputs: they come back with `spotrun pull` (a reclaimed attempt's too), and the exported
  final checkpoint (step 40) loads with plain `torch.load` in a process that never imports
  spotrun, bitwise the plain run's step 40.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from spotrun.cli import cli
from spotrun.db import attempts_of, session
from spotrun.jobs import submit, validate_submission
from spotrun.states import EndReason, JobState

from integration_helpers import (
    clean_env, finished, local_rig, running_attempt, shared_run,
    reap_workloads)  # noqa: F401 (autouse fixture)
from test_e2e_local import job_log

# Not importorskip: this process needs nothing of transformers (the workloads import it).
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not importlib.util.find_spec("transformers"),
                                                   reason="transformers is not installed")]

SPEC = ("name: hf-best\ncommand: python hf_best_train.py\nworkdir: code\n"
        "work: {total_steps: 40}\npolicy: {market: spot}\n"
        "env: {WORKLOAD_GATE_STEP: '1:10', WORKLOAD_TRAIN_GATE_STEP: '2:27'}\n"
        "outputs: [outputs, 'out/*/trainer_state.json']\n")

# Reads the exported file with torch alone and the plain run's own checkpoint of the same step
# (what Trainer loads into the model) with safetensors: the same tensors, bitwise.
LOAD = r'''
import sys, torch
from safetensors.torch import load_file
exported = torch.load(sys.argv[1], weights_only=True)
trainer_saved = load_file(sys.argv[2])
assert sorted(exported) == sorted(trainer_saved), (sorted(exported), sorted(trainer_saved))
differ = [k for k in exported if not torch.equal(exported[k], trainer_saved[k])]
assert not differ, differ
assert not [m for m in sys.modules if m.split(".")[0] in ("spotrun", "transformers")]
'''


@dataclass
class Run:
    ctx: object
    job: object   # the finished Job row
    log: str      # every attempt's output
    ref: Path     # the plain script's folder
    ref_text: str


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    """The job through its two reclaims (a daemon on a market that always has capacity), and
    the plain script's uninterrupted run beside it; the rig stays up for `spotrun pull`."""
    mp = pytest.MonkeyPatch()
    root = tmp_path_factory.mktemp("hf-e2e")
    home = root / "home"
    home.mkdir()
    mp.setenv("SPOTRUN_HOME", str(home))
    mp.delenv("SPOTRUN_DB_URL", raising=False)
    try:
        with local_rig(home, root, "hf_best_train.py", SPEC) as (ctx, runner, spec), \
                shared_run("hf_best_plain.py", root / "ref", clean_env()) as ref_text:
            job = submit(validate_submission(spec, ctx.settings), ctx.engine)
            runner.start()
            # Each gate holds its attempt (in evaluation after step 10, then after step 27)
            # until the notice has come. 30 market s of notice: 5 wall s at the paced market's
            # notice rate (x6), time for the emergency save and the outputs' upload under load.
            for number, step in ((1, 10), (2, 27 - 10)):
                att = running_attempt(ctx, job.id, number, min_progress=step)
                ctx.provider.client.interrupt(att.instance_id, in_s=30.0, notice=True)
            done = finished(ctx, job.id)
            runner.stop(wait=True)
            yield Run(ctx, done, job_log(ctx, done), root / "ref", ref_text())
    finally:
        mp.undo()


def result(text: str) -> dict:
    """The workload's last `result {json}` line."""
    lines = [ln for ln in text.splitlines() if ln.startswith("result ")]
    assert lines, text[-3000:]
    return json.loads(lines[-1][len("result "):])


def without_wall_clock(history: list[dict]) -> list[dict]:
    """log_history less the fields that measure wall time (runtimes and rates)."""
    return [{k: v for k, v in entry.items()
             if not (k.endswith("_runtime") or k.endswith("_per_second"))} for entry in history]


def test_trainer_best_model_and_log_history_survive_two_reclaims(run: Run):
    assert run.job.state is JobState.SUCCEEDED, run.job.reason
    with session(run.ctx.engine) as s:
        atts = attempts_of(s, run.job.id)
    assert [a.end_reason for a in atts] == [EndReason.RECLAIMED] * 2 + [EndReason.COMPLETED]
    # Each attempt resumed from the checkpoint its predecessor's notice made.
    assert [a.start_step for a in atts] == [0, 10, 28]
    assert "emergency checkpoint at step 10 during evaluation" in run.log
    assert "evaluating step 10 again" in run.log
    assert "emergency checkpoint at step 28 during train" in run.log
    assert "does not exist anymore" not in run.log   # the best checkpoint came back each time

    got, ref = result(run.log), result(run.ref_text)
    assert ref["best_global_step"] == 20 and ref["best_model_checkpoint"] == "out/checkpoint-20"
    for key in ("best_metric", "best_global_step", "best_model_checkpoint", "global_step"):
        assert got[key] == ref[key], key
    assert without_wall_clock(got["log_history"]) == without_wall_clock(ref["log_history"])
    assert got["sha256"] == ref["sha256"]   # the best model, loaded at the end


def test_outputs_and_the_exported_checkpoint_come_back_with_pull(run: Run, tmp_path: Path):
    assert run.job.state is JobState.SUCCEEDED, run.job.reason
    dest = tmp_path / "pulled"
    out = CliRunner().invoke(cli, ["pull", run.job.id, "--to", str(dest), "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    paths = {o["path"] for o in report["outputs"]}
    assert {"outputs/metrics.json", "outputs/final/model.safetensors",
            "outputs/final/config.json"} <= paths
    # Attempt 2 was reclaimed (no clean exit): what it had at its notice came back anyway.
    by_attempt = {o["path"]: o["attempt"] for o in report["outputs"]}
    assert by_attempt["out/checkpoint-10/trainer_state.json"] == 2, by_attempt
    assert by_attempt["outputs/metrics.json"] == 3, by_attempt
    ref = result(run.ref_text)
    metrics = json.loads((dest / "outputs" / "metrics.json").read_text())
    assert metrics == {"step": 40, "sha256": ref["sha256"]}
    assert report["checkpoint"]["step"] == 40 and report["checkpoint"]["kind"] == "hf-trainer/1"
    assert sorted(report["checkpoint"]["files"]) == ["checkpoint/model.pt",
                                                     "checkpoint/model.safetensors"]
    # A process that never imports spotrun (no repo on its path) loads the exported weights:
    # the job's step 40, bitwise the plain run's last checkpoint (not its best, step 20).
    loaded = subprocess.run([sys.executable, "-I", "-c", LOAD,
                             str(dest / "checkpoint" / "model.pt"),
                             str(run.ref / "out" / "checkpoint-40" / "model.safetensors")],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert loaded.returncode == 0, loaded.stderr[-2000:]

"""Outputs and `spotrun pull` end to end, with a Hugging Face Trainer job through two reclaims.

Daemon + local market + agents + real transformers: the first notice lands during an
evaluation, the second between steps; the job's final weights are bitwise those of an
uninterrupted run, its outputs come back with `spotrun pull`, and the exported
checkpoint loads with plain `torch.load` in a process that never imports spotrun.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402,F401

from spotrun.cli import cli  # noqa: E402
from spotrun.db import attempts_of, session  # noqa: E402
from spotrun.jobs import submit, validate_submission  # noqa: E402
from spotrun.states import EndReason, JobState  # noqa: E402

from integration_helpers import (  # noqa: E402
    clean_env, final_sha, finish, local_rig, start, reap_workloads)  # noqa: F401 (autouse fixture)
from test_e2e_local import finished, job_log, running_attempt  # noqa: E402

pytestmark = pytest.mark.slow

# Builds the model from its config and loads the exported file with torch alone.
LOAD = r'''
import hashlib, sys, torch
from transformers import GPT2Config, GPT2LMHeadModel
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2))
state = torch.load(sys.argv[1], weights_only=True)
missing, unexpected = model.load_state_dict(state, strict=False)
assert set(missing) <= {"lm_head.weight"} and not unexpected, (missing, unexpected)
model.tie_weights()
h = hashlib.sha256()
for k, v in sorted(model.state_dict().items()):
    h.update(k.encode())
    h.update(v.detach().contiguous().numpy().tobytes())
assert not [m for m in sys.modules if m.split(".")[0] == "spotrun"]
print(h.hexdigest())
'''


@pytest.fixture
def e2e(tmp_home: Path, tmp_path: Path):
    """A daemon on a market that always has capacity; the HF workload as the job."""
    with local_rig(tmp_home, tmp_path, "hf_train.py",
                   "name: hf\ncommand: python hf_train.py --steps 40\nworkdir: code\n"
                   "work: {total_steps: 40}\npolicy: {market: spot}\n"
                   "env: {WORKLOAD_GATE_STEP: '1:10', WORKLOAD_TRAIN_GATE_STEP: '2:17'}\n"
                   "outputs: [outputs, 'out/*/trainer_state.json']\n") as rig:
        yield rig


def test_hf_job_through_reclaims_and_pull_round_trip(e2e, tmp_path: Path):
    ctx, runner, spec = e2e
    job = submit(validate_submission(spec, ctx.settings), ctx.engine)
    # The uninterrupted reference runs meanwhile, outside spotrun.
    ref_proc = start("hf_train.py", tmp_path / "ref", clean_env(), "--steps", "40")
    runner.start()
    client = ctx.provider.client
    # Each gate holds the job (in evaluation after step 10, then after step 17) until a notice.
    for number, step in ((1, 10), (2, 17 - 10)):
        att = running_attempt(ctx, job.id, number, min_progress=step)
        client.interrupt(att.instance_id, in_s=120.0, notice=True)   # 2 wall s of notice
    done = finished(ctx, job.id)
    runner.stop(wait=True)
    assert done.state is JobState.SUCCEEDED, done.reason
    with session(ctx.engine) as s:
        atts = attempts_of(s, job.id)
    assert [a.end_reason for a in atts] == [EndReason.RECLAIMED] * 2 + [EndReason.COMPLETED]
    # Each attempt resumed from the checkpoint its predecessor's notice made.
    assert [a.start_step for a in atts] == [0, 10, 18]
    log = job_log(ctx, done)
    assert "emergency checkpoint at step 10 during evaluation" in log
    assert "emergency checkpoint at step 18 during train" in log
    ref = finish(ref_proc, tmp_path / "ref")
    assert final_sha(log) == final_sha(ref)

    dest = tmp_path / "pulled"
    out = CliRunner().invoke(cli, ["pull", job.id, "--to", str(dest), "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    paths = {o["path"] for o in report["outputs"]}
    assert {"outputs/metrics.json", "outputs/final/model.safetensors",
            "outputs/final/config.json"} <= paths
    # Attempt 2 was reclaimed (no clean exit): what it had at its notice came back anyway.
    by_attempt = {o["path"]: o["attempt"] for o in report["outputs"]}
    assert by_attempt["out/checkpoint-10/trainer_state.json"] == 2
    assert by_attempt["outputs/metrics.json"] == 3
    metrics = json.loads((dest / "outputs" / "metrics.json").read_text())
    assert metrics == {"step": 40, "sha256": final_sha(ref)}
    assert report["checkpoint"]["step"] == 40 and report["checkpoint"]["kind"] == "hf-trainer/1"
    assert sorted(report["checkpoint"]["files"]) == ["checkpoint/model.pt",
                                                     "checkpoint/model.safetensors"]
    # A process that never imports spotrun (no repo on its path) loads the exported weights.
    loaded = subprocess.run([sys.executable, "-I", "-c", LOAD, str(dest / "checkpoint" / "model.pt")],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.strip() == final_sha(ref)

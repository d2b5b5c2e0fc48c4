"""Issue 23, Hugging Face half: a Trainer job keeps all of its state through reclaims.

Daemon + local market + agents + real transformers. The job is a Trainer script written
from the transformers docs (tests/workloads/hf_best_plain.py) with spotrun added
(hf_best_train.py): evaluation and a checkpoint every 10 steps, `load_best_model_at_end` on
`eval_loss`, `save_total_limit=2`, cosine warm-up, gradient accumulation 2. The first notice
lands during the evaluation after step 10, the second between steps 27 and 28. Against the
plain script run uninterrupted: the same final weights (those of the best checkpoint, step
20, which must exist after the second resume), the same best metric and step, and the same
`log_history` (every logged step once; only wall-clock fields may differ).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from spotrun.db import attempts_of, session  # noqa: E402
from spotrun.jobs import submit, validate_submission  # noqa: E402
from spotrun.states import EndReason, JobState  # noqa: E402

from integration_helpers import (  # noqa: E402
    clean_env, finish, local_rig, start, reap_workloads)  # noqa: F401 (autouse fixture)
from test_e2e_local import finished, job_log, running_attempt  # noqa: E402

pytestmark = pytest.mark.slow

SPEC = ("name: hf-best\ncommand: python hf_best_train.py\nworkdir: code\n"
        "work: {total_steps: 40}\npolicy: {market: spot}\n"
        "env: {WORKLOAD_GATE_STEP: '1:10', WORKLOAD_TRAIN_GATE_STEP: '2:27'}\n")


def result(text: str) -> dict:
    """The workload's last `result {json}` line."""
    lines = [ln for ln in text.splitlines() if ln.startswith("result ")]
    assert lines, text[-3000:]
    return json.loads(lines[-1][len("result "):])


def without_wall_clock(history: list[dict]) -> list[dict]:
    """log_history less the fields that measure wall time (runtimes and rates)."""
    return [{k: v for k, v in entry.items()
             if not (k.endswith("_runtime") or k.endswith("_per_second"))} for entry in history]


def test_trainer_best_model_and_log_history_survive_two_reclaims(tmp_home: Path,
                                                                 tmp_path: Path):
    with local_rig(tmp_home, tmp_path, "hf_best_train.py", SPEC) as (ctx, runner, spec):
        job = submit(validate_submission(spec, ctx.settings), ctx.engine)
        ref_proc = start("hf_best_plain.py", tmp_path / "ref", clean_env())
        runner.start()
        # Each gate holds the job (in evaluation after step 10, then after step 27) until a notice.
        for number, step in ((1, 10), (2, 27 - 10)):
            att = running_attempt(ctx, job.id, number, min_progress=step)
            ctx.provider.client.interrupt(att.instance_id, in_s=120.0, notice=True)
        done = finished(ctx, job.id)
    assert done.state is JobState.SUCCEEDED, done.reason
    with session(ctx.engine) as s:
        atts = attempts_of(s, job.id)
    assert [a.end_reason for a in atts] == [EndReason.RECLAIMED] * 2 + [EndReason.COMPLETED]
    assert [a.start_step for a in atts] == [0, 10, 28]
    log = job_log(ctx, done)
    assert "emergency checkpoint at step 10 during evaluation" in log
    assert "evaluating step 10 again" in log
    assert "emergency checkpoint at step 28 during train" in log
    assert "does not exist anymore" not in log   # the best checkpoint came back each time

    got, ref = result(log), result(finish(ref_proc, tmp_path / "ref"))
    assert ref["best_global_step"] == 20 and ref["best_model_checkpoint"] == "out/checkpoint-20"
    for key in ("best_metric", "best_global_step", "best_model_checkpoint", "global_step"):
        assert got[key] == ref[key], key
    assert without_wall_clock(got["log_history"]) == without_wall_clock(ref["log_history"])
    assert got["sha256"] == ref["sha256"]   # the best model, loaded at the end

"""A Lightning job's whole state survives two reclaims (issue 23): weights, best model, logs.

The script is written from Lightning's docs (ModelCheckpoint(monitor="val_loss",
save_top_k=2), CSVLogger, LearningRateMonitor, a shuffled train loader with num_workers=2,
seed_everything(0, workers=True), validation every 6 batches and so at each epoch end), with
spotrun added as docs/integrations.md says. Daemon + local market + agents: the first notice
lands in the validation that ends epoch 0 (after step 12), the second between steps 21 and
22 (where LearningRateMonitor, listed before the callback, logs). Compared with the same
script without spotrun, run once without interruption: the final weights (bitwise),
ModelCheckpoint's best score, best model file and its weights, its top 2, and metrics.csv
(every logged row once, byte for byte) in the job directory, in the job's pulled outputs,
and among the final checkpoint's persisted files (the spec persists nothing itself:
`persist: []`, so the callback's own registrations are what carry them).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("lightning")

from click.testing import CliRunner  # noqa: E402

from integration_helpers import (  # noqa: E402
    clean_env, final_sha, finish, local_rig, start, reap_workloads)  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.slow

METRICS = "lightning_logs/version_0/metrics.csv"
RESULTS = ("best-model-score", "best-model-name", "best-model-sha256", "top-k")


def results(text: str) -> dict[str, str]:
    """The workload's result lines (the last of each: the attempt that finished)."""
    found = {}
    for key in RESULTS:
        lines = re.findall(rf"^{key}: (.*)$", text, re.M)
        assert lines, f"no {key} line in:\n{text[-3000:]}"
        found[key] = lines[-1].strip()
    found["final"] = final_sha(text)
    return found


def test_lightning_job_state_through_reclaims_on_the_local_provider(tmp_home: Path,
                                                                      tmp_path: Path):
    from spotrun import jobfiles
    from spotrun.checkpoints import latest_verified
    from spotrun.cli import cli
    from spotrun.db import attempts_of, session
    from spotrun.jobs import submit, validate_submission
    from spotrun.states import EndReason, JobState
    from test_e2e_local import finished, job_log, running_attempt

    spec_body = ("name: lit-state\ncommand: python lightning_best_train.py --steps 36\n"
                 "workdir: code\nwork: {total_steps: 36}\npolicy: {market: spot}\n"
                 "outputs: [lightning_logs]\npersist: []\n"
                 "env: {WORKLOAD_GATE_STEP: '1:12', WORKLOAD_TRAIN_GATE_STEP: '2:21'}\n")
    with local_rig(tmp_home, tmp_path, "lightning_best_train.py", spec_body) as (ctx, runner,
                                                                                 spec):
        job = submit(validate_submission(spec, ctx.settings), ctx.engine)
        plain = start("lightning_best_plain.py", tmp_path / "plain", clean_env(),
                      "--steps", "36")
        runner.start()
        # Each gate holds its attempt (in the validation after step 12, then after step 21)
        # until the notice has come; the reclaim follows 2 wall seconds later.
        for number, step in ((1, 12), (2, 21 - 12)):
            att = running_attempt(ctx, job.id, number, min_progress=step)
            ctx.provider.client.interrupt(att.instance_id, in_s=120.0, notice=True)
        done = finished(ctx, job.id)
        runner.stop(wait=True)
        assert done.state is JobState.SUCCEEDED, done.reason
        with session(ctx.engine) as s:
            atts = attempts_of(s, job.id)
        assert [a.end_reason for a in atts] == [EndReason.RECLAIMED] * 2 + [EndReason.COMPLETED]
        assert [a.start_step for a in atts] == [0, 12, 21]
        log = job_log(ctx, done)
        assert "emergency checkpoint at step 12 during evaluation" in log
        assert "emergency checkpoint at step 21 during train" in log
        assert "dirpath has changed" not in log   # ModelCheckpoint kept its folder

        ref_text = finish(plain, tmp_path / "plain")
        ref_csv = (tmp_path / "plain" / METRICS).read_bytes()
        assert results(log) == results(ref_text)

        # The last attempt's job directory: one version folder, every row once.
        job_dir = tmp_home / "market" / "jobs" / job.id / "node-0"
        assert sorted(p.name for p in (job_dir / "lightning_logs").iterdir()) == ["version_0"]
        assert (job_dir / METRICS).read_bytes() == ref_csv
        kept = "lightning_logs/version_0/checkpoints"   # ModelCheckpoint's top 2
        top_k = sorted(f"{kept}/{p.name}" for p in (tmp_path / "plain" / kept).iterdir())
        assert sorted(f"{kept}/{p.name}" for p in (job_dir / kept).iterdir()) == top_k

        # The final checkpoint holds the same files (what a resume or an export would get).
        store = ctx.store_for(done.checkpoint_uri)
        final = latest_verified(store)
        assert final is not None and final.step == 36
        assert jobfiles.file_bytes(store, final.name, METRICS) == ref_csv
        # `persist: []`: the callback registered the log and ModelCheckpoint folders itself,
        # and not its own checkpoint folder.
        listed = set(jobfiles.read_index(store, final.name)["files"])
        assert set(top_k) <= listed
        assert not [p for p in listed if p.startswith("spotrun-checkpoints")]

        # And `spotrun pull` brings the outputs back.
        dest = tmp_path / "pulled"
        out = CliRunner().invoke(cli, ["pull", job.id, "--to", str(dest), "--json"])
        assert out.exit_code == 0, out.output
        assert METRICS in {o["path"] for o in json.loads(out.output)["outputs"]}
        assert (dest / METRICS).read_bytes() == ref_csv


def test_lightning_notice_in_the_last_validation_is_rerun_by_the_resume(tmp_path: Path):
    """The notice comes in the validation after the last step (max_steps=12), where a resumed
    Lightning fit would stop before that validation: the resume in a fresh job directory (the
    persisted files restored from the store) runs it, so its row and ModelCheckpoint's save
    of step 12 exist once, as in the plain script's run. Direct processes: the first exits
    right after its emergency save."""
    plain = start("lightning_best_plain.py", tmp_path / "plain", clean_env(), "--steps", "12")
    uri = (tmp_path / "store").as_uri()
    a1, a2 = tmp_path / "a1", tmp_path / "a2"
    text1 = finish(start("lightning_best_train.py", a1,
                         clean_env(SPOTRUN_CHECKPOINT_URI=uri, WORKLOAD_NOTICE_AT="val:12:2"),
                         "--steps", "12"), a1)
    assert "emergency checkpoint at step 12 during evaluation" in text1
    assert "best-model-score" not in text1
    text2 = finish(start("lightning_best_train.py", a2, clean_env(SPOTRUN_CHECKPOINT_URI=uri),
                         "--steps", "12"), a2)
    assert "resume-ckpt-000000000012" in text2
    assert results(text2) == results(finish(plain, tmp_path / "plain"))
    assert (a2 / METRICS).read_bytes() == (tmp_path / "plain" / METRICS).read_bytes()

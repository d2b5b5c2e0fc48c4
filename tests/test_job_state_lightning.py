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

import importlib.util
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from integration_helpers import (
    clean_env, final_sha, finish, finished, local_rig, running_attempt, shared_run, start,
    reap_workloads)  # noqa: F401 (autouse fixture)

# Not importorskip: importing lightning here would cost this process seconds for nothing (the
# workloads import it).
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not importlib.util.find_spec("lightning"),
                                                   reason="lightning is not installed")]
# Three epochs of 12 batches: the daemon job's notices (steps 12 and 21) leave a full epoch
# to its last attempt, and the last validation, where the direct test's notice comes, ends
# an epoch too. One length for both: they share the plain run.
STEPS = 36

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


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory):
    """The script without spotrun, run once without interruption: both tests' reference."""
    folder = tmp_path_factory.mktemp("plain")
    with shared_run("lightning_best_plain.py", folder, clean_env(), "--steps", str(STEPS)) as text:
        yield folder, text


def test_lightning_job_state_through_reclaims_on_the_local_provider(tmp_home: Path,
                                                                      tmp_path: Path, plain):
    from spotrun import jobfiles
    from spotrun.checkpoints import latest_verified
    from spotrun.cli import cli
    from spotrun.db import attempts_of, session
    from spotrun.jobs import submit, validate_submission
    from spotrun.states import EndReason, JobState
    from test_e2e_local import job_log

    spec_body = (f"name: lit-state\ncommand: python lightning_best_train.py --steps {STEPS}\n"
                 f"workdir: code\nwork: {{total_steps: {STEPS}}}\npolicy: {{market: spot}}\n"
                 "outputs: [lightning_logs]\npersist: []\n"
                 "env: {WORKLOAD_GATE_STEP: '1:12', WORKLOAD_TRAIN_GATE_STEP: '2:21'}\n")
    with local_rig(tmp_home, tmp_path, "lightning_best_train.py", spec_body) as (ctx, runner,
                                                                                 spec):
        job = submit(validate_submission(spec, ctx.settings), ctx.engine)
        runner.start()
        # Each gate holds its attempt (in the validation after step 12, then after step 21)
        # until the notice has come. 30 market s of notice: 5 wall s at the paced market's
        # notice rate (x6), time for the emergency save and the outputs' upload under load.
        for number, step in ((1, 12), (2, 21 - 12)):
            att = running_attempt(ctx, job.id, number, min_progress=step)
            ctx.provider.client.interrupt(att.instance_id, in_s=30.0, notice=True)
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

        plain_dir, plain_text = plain
        ref_text = plain_text()
        ref_csv = (plain_dir / METRICS).read_bytes()
        assert results(log) == results(ref_text)

        # The last attempt's job directory: one version folder, every row once.
        job_dir = tmp_home / "market" / "jobs" / job.id / "node-0"
        assert sorted(p.name for p in (job_dir / "lightning_logs").iterdir()) == ["version_0"]
        assert (job_dir / METRICS).read_bytes() == ref_csv
        kept = "lightning_logs/version_0/checkpoints"   # ModelCheckpoint's top 2
        top_k = sorted(f"{kept}/{p.name}" for p in (plain_dir / kept).iterdir())
        assert sorted(f"{kept}/{p.name}" for p in (job_dir / kept).iterdir()) == top_k

        # The final checkpoint holds the same files (what a resume or an export would get).
        store = ctx.store_for(done.checkpoint_uri)
        final = latest_verified(store)
        assert final is not None and final.step == STEPS
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


def test_a_gated_attempt_noticed_before_its_gate_waits_for_the_reclaim(tmp_path: Path):
    """The daemon test interrupts attempt 1 once it reports step 12; under load the notice can
    land before the gate holds the validation after it. The job must still stop after its
    emergency save until the reclaim: trained on, it reached max_steps inside the notice window,
    its final checkpoint was the resume point, and attempt 2 had nothing left to train.
    Direct process; the notice file is written before it starts (a notice before the gate)."""
    from polling import wait_for
    from spotrun.checkpoints import list_complete, read_manifest
    from spotrun.store import open_store
    uri = (tmp_path / "store").as_uri()
    run = tmp_path / "a1"
    run.mkdir()
    (run / "notice.json").write_text('{"action": "terminate"}')
    proc = start("lightning_best_train.py", run,
                 clean_env(SPOTRUN_CHECKPOINT_URI=uri, SPOTRUN_ATTEMPT="1",
                           SPOTRUN_NOTICE_FILE=str(run / "notice.json"),
                           WORKLOAD_GATE_STEP="1:12"), "--steps", str(STEPS))
    waiting = run / "waiting-for-reclaim"
    wait_for(lambda: waiting.exists() or proc.poll() is not None, 120, "the job to wait or end")
    assert waiting.exists(), (run / "output.log").read_text()[-3000:]
    store = open_store(uri)
    assert [read_manifest(store, n).step for n in list_complete(store)] == [
        int(waiting.read_text())]   # the emergency save, and nothing trained past it


def test_lightning_notice_in_the_last_validation_is_rerun_by_the_resume(tmp_path: Path, plain):
    """The notice comes in the validation after the last step (max_steps=36, an epoch's end),
    where a resumed Lightning fit would stop before that validation: the resume in a fresh job
    directory (the persisted files restored from the store) runs it, so its row and
    ModelCheckpoint's save of step 36 exist once, as in the plain script's run. Direct
    processes: the first exits right after its emergency save."""
    uri = (tmp_path / "store").as_uri()
    a1, a2 = tmp_path / "a1", tmp_path / "a2"
    text1 = finish(start("lightning_best_train.py", a1,
                         clean_env(SPOTRUN_CHECKPOINT_URI=uri, WORKLOAD_NOTICE_AT=f"val:{STEPS}:2"),
                         "--steps", str(STEPS)), a1)
    assert f"emergency checkpoint at step {STEPS} during evaluation" in text1
    assert "best-model-score" not in text1
    text2 = finish(start("lightning_best_train.py", a2, clean_env(SPOTRUN_CHECKPOINT_URI=uri),
                         "--steps", str(STEPS)), a2)
    assert f"resume-ckpt-{STEPS:012d}" in text2
    plain_dir, plain_text = plain
    assert results(text2) == results(plain_text())
    assert (a2 / METRICS).read_bytes() == (plain_dir / METRICS).read_bytes()

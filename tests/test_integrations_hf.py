"""Hugging Face Trainer through reclaims: real processes, SIGUSR1, SIGKILL, a fresh process resumes.

One notice lands during an evaluation, one between training steps; the final weights
must be bitwise those of an uninterrupted run. (tests/test_outputs_e2e.py runs a Trainer job
through the same two kinds of notice with the daemon, where the agent restores the job's files.)
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from integration_helpers import (
    clean_env, final_sha, finish, notice_and_kill, start, steps_in_store, reap_workloads)  # noqa: F401 (autouse fixture)

# Not importorskip: this process needs nothing of transformers (the workloads import it).
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not importlib.util.find_spec("transformers"),
                                                   reason="transformers is not installed")]
KIND = "hf-trainer/1"


def test_trainer_resumes_bitwise_after_notice_in_evaluation_and_in_training(tmp_path: Path):
    ref = finish(start("hf_train.py", tmp_path / "ref", clean_env()), tmp_path / "ref")
    uri = (tmp_path / "store").as_uri()

    def env(attempt: int, **gates: str) -> dict[str, str]:
        return clean_env(SPOTRUN_CHECKPOINT_URI=uri, SPOTRUN_ATTEMPT=str(attempt),
                         SPOTRUN_PROGRESS_FILE=str(tmp_path / f"progress-{attempt}.json"), **gates)

    # Attempt 1: the notice arrives while the evaluation after step 10 runs.
    a1 = tmp_path / "a1"
    step1 = notice_and_kill(start("hf_train.py", a1, env(1, WORKLOAD_GATE_STEP="10")), a1,
                            "gate-eval", uri, KIND, tmp_path / "progress-1.json")
    assert step1 == 10     # the last finished step, saved without waiting for the evaluation
    assert "emergency checkpoint at step 10 during evaluation" in (a1 / "output.log").read_text()
    # Attempt 2 (a new machine: empty output_dir): the notice arrives between steps.
    a2 = tmp_path / "a2"
    step2 = notice_and_kill(start("hf_train.py", a2, env(2, WORKLOAD_TRAIN_GATE_STEP="17")), a2,
                            "gate-train", uri, KIND, tmp_path / "progress-2.json")
    assert step2 == 18     # saved at the next step end
    text2 = (a2 / "output.log").read_text()
    assert "start out/checkpoint-10" in text2 and "during train" in text2
    # Attempt 3 resumes from the emergency checkpoint and finishes.
    a3 = tmp_path / "a3"
    text3 = finish(start("hf_train.py", a3, env(3)), a3)
    assert "start out/checkpoint-18" in text3
    assert final_sha(text3) == final_sha(ref)
    assert 40 in steps_in_store(uri, KIND)   # training ends with its final state in the store

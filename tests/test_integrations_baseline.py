"""Adding spotrun to a Lightning or HF script changes nothing: bitwise equal to the plain script.

Each script runs in its own process and folder (no store, no reclaim) as its framework's docs
write it; the spotrun version only swaps in ResumableDataLoader (same arguments) and adds
the callback. Every tensor of the final state_dict is compared bitwise. The resume tests run
the spotrun version through reclaims (real processes, SIGUSR1, SIGKILL, a fresh process and
folder resumes) and compare with the plain script's uninterrupted run: for Lightning, that
the loader's replay of the global-RNG order stays exact through four reclaims; for Trainer,
a notice during an evaluation and one between steps.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from integration_helpers import (  # noqa: E402
    clean_env, finish, notice_and_kill, shared_run, start, steps_in_store,
    reap_workloads)  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.slow
# Not importorskip: importing lightning or transformers here would cost this process seconds
# for nothing (the workloads import them).
needs_lightning = pytest.mark.skipif(not importlib.util.find_spec("lightning"),
                                     reason="lightning is not installed")
needs_transformers = pytest.mark.skipif(not importlib.util.find_spec("transformers"),
                                        reason="transformers is not installed")
RESUMED = "lightning_baseline_train.py"
# 12 batches an epoch, a validation every 10 steps: the notices (steps 10 to 20) fall in
# epochs 0 and 1, and the last resume goes on past epoch 1's end (step 24).
STEPS = ("--steps", "30")


def _state(folder: Path) -> dict:
    return torch.load(folder / "final.pt", weights_only=True)


def _assert_bitwise_equal(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"{len(differ)}/{len(a)} tensors differ: {differ}"


def _run_both(script: str, tmp_path: Path, *args: str) -> tuple[dict, dict]:
    plain = start(script, tmp_path / "plain", clean_env(), "--mode", "plain", *args)
    spot = start(script, tmp_path / "spotrun", clean_env(), "--mode", "spotrun", *args)
    finish(plain, tmp_path / "plain")
    assert "start fresh" in finish(spot, tmp_path / "spotrun")
    return _state(tmp_path / "plain"), _state(tmp_path / "spotrun")


@needs_lightning
def test_lightning_script_with_spotrun_is_bitwise_the_plain_script(tmp_path: Path):
    """shuffle=True, num_workers=2, seed_everything(42, workers=True), noise drawn in workers."""
    plain, spot = _run_both("lightning_baseline_train.py", tmp_path, "--augment")
    _assert_bitwise_equal(plain, spot)


@pytest.fixture(scope="module")
def trainer_plain(tmp_path_factory: pytest.TempPathFactory):
    """The plain Trainer script's final state, run once: both Trainer tests' reference."""
    folder = tmp_path_factory.mktemp("trainer-plain")
    with shared_run("hf_train.py", folder, clean_env(), "--mode", "plain") as text:
        def state() -> dict:
            text()   # waits for its clean exit (once)
            return _state(folder)
        yield state


@needs_transformers
def test_trainer_with_spotrun_is_bitwise_the_plain_trainer(tmp_path: Path, trainer_plain):
    """TrainingArguments(seed=0, data_seed=1): the callback draws nothing, and its saves (with
    Trainer's at step 25, its own at the end) change nothing."""
    spot = tmp_path / "spotrun"
    assert "start fresh" in finish(start("hf_train.py", spot, clean_env(), "--mode", "spotrun"),
                                   spot)
    _assert_bitwise_equal(trainer_plain(), _state(spot))


@needs_transformers
def test_trainer_resumed_twice_is_bitwise_the_plain_trainer(tmp_path: Path, trainer_plain):
    """A notice during the evaluation after step 10 (not a Trainer save step), one between
    steps 17 and 18; each attempt a new machine (an empty output_dir: the integration fetches
    the checkpoint itself)."""
    uri = (tmp_path / "store").as_uri()
    kind = "hf-trainer/1"

    def run(attempt: int, **gates: str):
        env = clean_env(SPOTRUN_CHECKPOINT_URI=uri, SPOTRUN_ATTEMPT=str(attempt),
                        SPOTRUN_PROGRESS_FILE=str(tmp_path / f"progress-{attempt}.json"), **gates)
        return start("hf_train.py", tmp_path / f"a{attempt}", env, "--mode", "spotrun")

    a1, a2, a3 = tmp_path / "a1", tmp_path / "a2", tmp_path / "a3"
    step1 = notice_and_kill(run(1, WORKLOAD_GATE_STEP="10"), a1, "gate-eval", uri, kind,
                            tmp_path / "progress-1.json")
    assert step1 == 10     # the last finished step, saved without waiting for the evaluation
    assert "emergency checkpoint at step 10 during evaluation" in (a1 / "output.log").read_text()
    step2 = notice_and_kill(run(2, WORKLOAD_TRAIN_GATE_STEP="17"), a2, "gate-train", uri, kind,
                            tmp_path / "progress-2.json")
    assert step2 == 18     # saved at the next step end
    text2 = (a2 / "output.log").read_text()
    assert "start out/checkpoint-10" in text2 and "during train" in text2
    # Attempt 3 resumes from the emergency checkpoint and finishes.
    assert "start out/checkpoint-18" in finish(run(3), a3)
    _assert_bitwise_equal(trainer_plain(), _state(a3))
    assert 40 in steps_in_store(uri, kind)   # training ends with its final state in the store


def _resumed(tmp_path: Path, *gates: tuple[str, int, str]) -> Path:
    """The spotrun script through one notice per gate (variable, step, marker), each attempt
    resumed from its predecessor's emergency checkpoint, and a last attempt that finishes:
    that attempt's folder."""
    uri = (tmp_path / "store").as_uri()
    for attempt, gate in enumerate([*gates, None], 1):
        folder, progress = tmp_path / f"a{attempt}", tmp_path / f"progress-{attempt}.json"
        env = clean_env(SPOTRUN_CHECKPOINT_URI=uri, SPOTRUN_ATTEMPT=str(attempt),
                        SPOTRUN_PROGRESS_FILE=str(progress),
                        **({gate[0]: str(gate[1])} if gate else {}))
        proc = start(RESUMED, folder, env, "--mode", "spotrun", *STEPS)
        if gate:
            assert notice_and_kill(proc, folder, gate[2], uri, "lightning/1", progress) == gate[1]
        else:
            finish(proc, folder)
        if attempt > 1:   # not a fresh start, which would end on the plain weights too
            saved = gates[attempt - 2][1]
            assert f"resume-ckpt-{saved:012d}" in (folder / "output.log").read_text()
    return folder


@needs_lightning
def test_lightning_resumed_four_times_is_bitwise_the_plain_script(tmp_path: Path):
    """Global-RNG order (no seed=), each resume from another kind of save, then past the epoch
    end: still the plain script's weights. One run for the four kinds (each reclaim costs a
    framework start-up): a notice at step 10's end (saved in the validation that follows,
    which the resume runs again), at step 12's end (the last batch of epoch 0, saved as the
    next epoch's first batch starts), after step 17 (mid-epoch), and during the validation
    after step 20."""
    plain = start(RESUMED, tmp_path / "plain", clean_env(), "--mode", "plain", *STEPS)
    last = _resumed(tmp_path, ("WORKLOAD_TRAIN_GATE_STEP", 10, "gate-train"),
                    ("WORKLOAD_TRAIN_GATE_STEP", 12, "gate-train"),
                    ("WORKLOAD_TRAIN_GATE_STEP", 17, "gate-train"),
                    ("WORKLOAD_GATE_STEP", 20, "gate-eval"))
    for attempt, step in ((1, 10), (4, 20)):
        assert f"emergency checkpoint at step {step} during evaluation" in (
            tmp_path / f"a{attempt}" / "output.log").read_text()
    finish(plain, tmp_path / "plain")
    _assert_bitwise_equal(_state(tmp_path / "plain"), _state(last))

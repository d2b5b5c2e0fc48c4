"""Adding spotrun to a Lightning or HF script changes nothing: bitwise equal to the plain script.

Each script runs in its own process and folder (no store, no reclaim) as its framework's docs
write it; the spotrun version only swaps in ResumableDataLoader (same arguments) and adds
the callback. Every tensor of the final state_dict is compared bitwise. The resume test
checks that the loader's replay of the global-RNG order stays exact through two reclaims.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from integration_helpers import (  # noqa: E402
    clean_env, finish, notice_and_kill, shared_run, start,
    reap_workloads)  # noqa: F401 (autouse fixture)

# Not importorskip: importing lightning (or transformers) here would cost this process seconds
# for nothing (the workloads import them).
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not importlib.util.find_spec("lightning"),
                                                   reason="lightning is not installed")]
RESUMED = "lightning_baseline_train.py"
# 12 batches an epoch: the notices (steps 10, 12, 17) fall in epochs 0 and 1, and the last
# resume goes on past epoch 1's end (step 24).
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


def test_lightning_script_with_spotrun_is_bitwise_the_plain_script(tmp_path: Path):
    """shuffle=True, num_workers=2, seed_everything(42, workers=True), noise drawn in workers."""
    plain, spot = _run_both("lightning_baseline_train.py", tmp_path, "--augment")
    _assert_bitwise_equal(plain, spot)


@pytest.mark.skipif(not importlib.util.find_spec("transformers"),
                    reason="transformers is not installed")
def test_trainer_with_spotrun_is_bitwise_the_plain_trainer(tmp_path: Path):
    """TrainingArguments(seed=0, data_seed=1): the callback draws nothing, saves nothing extra."""
    plain, spot = _run_both("hf_baseline_train.py", tmp_path)
    _assert_bitwise_equal(plain, spot)


@pytest.fixture(scope="module")
def plain_state(tmp_path_factory: pytest.TempPathFactory):
    """The plain script's final state without interruption: both resume tests' reference."""
    folder = tmp_path_factory.mktemp("plain")
    with shared_run(RESUMED, folder, clean_env(), "--mode", "plain", *STEPS) as text:
        def state() -> dict:
            text()   # waits for its clean exit (once)
            return _state(folder)
        yield state


def _resumed(tmp_path: Path, *gates: tuple[str, str, str]) -> Path:
    """The spotrun script through one notice per gate (name, step, marker) and a last attempt
    that finishes: that attempt's folder."""
    uri = (tmp_path / "store").as_uri()
    for attempt, (name, step, marker) in enumerate(gates, 1):
        folder, progress = tmp_path / f"a{attempt}", tmp_path / f"progress-{attempt}.json"
        env = clean_env(SPOTRUN_CHECKPOINT_URI=uri, SPOTRUN_ATTEMPT=str(attempt),
                        SPOTRUN_PROGRESS_FILE=str(progress), **{name: step})
        assert notice_and_kill(start(RESUMED, folder, env, "--mode", "spotrun", *STEPS), folder,
                               marker, uri, "lightning/1", progress) == int(step)
    n = len(gates) + 1
    last = tmp_path / f"a{n}"
    env = clean_env(SPOTRUN_CHECKPOINT_URI=uri, SPOTRUN_ATTEMPT=str(n),
                    SPOTRUN_PROGRESS_FILE=str(tmp_path / f"progress-{n}.json"))
    text = finish(start(RESUMED, last, env, "--mode", "spotrun", *STEPS), last)
    assert f"resume-ckpt-{int(gates[-1][1]):012d}" in text
    return last


def test_lightning_resumed_twice_is_bitwise_the_plain_script(tmp_path: Path, plain_state):
    """Global-RNG order (no seed=): a notice during the validation after step 10, one after
    step 17 (mid-epoch, 12 batches an epoch), then past the epoch end: the plain script's
    weights."""
    last = _resumed(tmp_path, ("WORKLOAD_GATE_STEP", "10", "gate-eval"),
                    ("WORKLOAD_TRAIN_GATE_STEP", "17", "gate-train"))
    _assert_bitwise_equal(plain_state(), _state(last))


def test_lightning_resumed_at_a_validation_step_and_at_an_epoch_end_is_the_plain_script(
        tmp_path: Path, plain_state):
    """A notice at step 10's end (saved in the validation that follows, which the resume runs
    again), then one at step 12's end (the last batch of epoch 0, saved as the next epoch's
    first batch starts): still the plain script's weights."""
    last = _resumed(tmp_path, ("WORKLOAD_TRAIN_GATE_STEP", "10", "gate-train"),
                    ("WORKLOAD_TRAIN_GATE_STEP", "12", "gate-train"))
    assert "emergency checkpoint at step 10 during evaluation" in (
        tmp_path / "a1" / "output.log").read_text()
    _assert_bitwise_equal(plain_state(), _state(last))

"""Adding spotrun to a Lightning or HF script changes nothing: bitwise equal to the plain script.

Each script runs in its own process and folder (no store, no reclaim) as its framework's docs
write it; the spotrun version only swaps in ResumableDataLoader (same arguments) and adds
the callback. Every tensor of the final state_dict is compared bitwise. The resume test
checks that the loader's replay of the global-RNG order stays exact through two reclaims.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("lightning")
torch = pytest.importorskip("torch")

from integration_helpers import (  # noqa: E402
    clean_env, finish, notice_and_kill, start, reap_workloads)  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.slow


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


def test_trainer_with_spotrun_is_bitwise_the_plain_trainer(tmp_path: Path):
    """TrainingArguments(seed=0, data_seed=1): the callback draws nothing, saves nothing extra."""
    pytest.importorskip("transformers")
    plain, spot = _run_both("hf_baseline_train.py", tmp_path)
    _assert_bitwise_equal(plain, spot)


def test_lightning_resumed_twice_is_bitwise_the_plain_script(tmp_path: Path):
    """Global-RNG order (no seed=): a notice during the validation after step 10, one after
    step 17 (mid-epoch, 12 batches an epoch), then past the epoch end: the plain script's
    weights."""
    script, steps = "lightning_baseline_train.py", ("--steps", "30")
    ref = start(script, tmp_path / "plain", clean_env(), "--mode", "plain", *steps)
    uri = (tmp_path / "store").as_uri()
    kind = "lightning/1"

    def env(attempt: int, **gates: str) -> dict[str, str]:
        return clean_env(SPOTRUN_CHECKPOINT_URI=uri, SPOTRUN_ATTEMPT=str(attempt),
                         SPOTRUN_PROGRESS_FILE=str(tmp_path / f"progress-{attempt}.json"), **gates)

    a1, a2, a3 = tmp_path / "a1", tmp_path / "a2", tmp_path / "a3"
    assert notice_and_kill(start(script, a1, env(1, WORKLOAD_GATE_STEP="10"), "--mode", "spotrun",
                                 *steps), a1, "gate-eval", uri, kind,
                           tmp_path / "progress-1.json") == 10
    assert notice_and_kill(start(script, a2, env(2, WORKLOAD_TRAIN_GATE_STEP="17"), "--mode",
                                 "spotrun", *steps), a2, "gate-train", uri, kind,
                           tmp_path / "progress-2.json") == 17
    assert "resume-ckpt-000000000017" in finish(start(script, a3, env(3), "--mode", "spotrun",
                                                      *steps), a3)
    finish(ref, tmp_path / "plain")
    _assert_bitwise_equal(_state(tmp_path / "plain"), _state(a3))


def test_lightning_resumed_at_a_validation_step_and_at_an_epoch_end_is_the_plain_script(
        tmp_path: Path):
    """A notice at step 10's end (saved in the validation that follows, which the resume runs
    again), then one at step 12's end (the last batch of epoch 0, saved as the next epoch's
    first batch starts): still the plain script's weights."""
    script, steps = "lightning_baseline_train.py", ("--steps", "30")
    ref = start(script, tmp_path / "plain", clean_env(), "--mode", "plain", *steps)
    uri = (tmp_path / "store").as_uri()
    kind = "lightning/1"

    def env(attempt: int, **gates: str) -> dict[str, str]:
        return clean_env(SPOTRUN_CHECKPOINT_URI=uri, SPOTRUN_ATTEMPT=str(attempt),
                         SPOTRUN_PROGRESS_FILE=str(tmp_path / f"progress-{attempt}.json"), **gates)

    a1, a2, a3 = tmp_path / "a1", tmp_path / "a2", tmp_path / "a3"
    assert notice_and_kill(start(script, a1, env(1, WORKLOAD_TRAIN_GATE_STEP="10"), "--mode",
                                 "spotrun", *steps), a1, "gate-train", uri, kind,
                           tmp_path / "progress-1.json") == 10
    assert "emergency checkpoint at step 10 during evaluation" in (a1 / "output.log").read_text()
    assert notice_and_kill(start(script, a2, env(2, WORKLOAD_TRAIN_GATE_STEP="12"), "--mode",
                                 "spotrun", *steps), a2, "gate-train", uri, kind,
                           tmp_path / "progress-2.json") == 12
    assert "resume-ckpt-000000000012" in finish(start(script, a3, env(3), "--mode", "spotrun",
                                                      *steps), a3)
    finish(ref, tmp_path / "plain")
    _assert_bitwise_equal(_state(tmp_path / "plain"), _state(a3))

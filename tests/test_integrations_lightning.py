"""PyTorch Lightning through reclaims: real processes, SIGUSR1, SIGKILL, a fresh process resumes.

One notice lands during a validation, one between training steps (mid-epoch); the final
weights must be bitwise those of an uninterrupted run. Direct processes, not the daemon:
tests/test_job_state_lightning.py runs a Lightning job through the daemon and local reclaims.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from integration_helpers import (
    clean_env, final_sha, finish, notice_and_kill, start, steps_in_store,
    reap_workloads)  # noqa: F401 (autouse fixture)

# Not importorskip: importing lightning here would cost this process seconds for nothing (the
# workloads import it).
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not importlib.util.find_spec("lightning"),
                                                   reason="lightning is not installed")]
KIND = "lightning/1"
SHA_OF_STATE_DICT = r'''
import hashlib, sys, torch
h = hashlib.sha256()
for k, v in sorted(torch.load(sys.argv[1], weights_only=True).items()):
    h.update(k.encode()); h.update(v.contiguous().numpy().tobytes())
assert not [m for m in sys.modules if m.split(".")[0] in ("spotrun", "lightning")]
print(h.hexdigest())
'''


def test_lightning_resumes_bitwise_after_notice_in_validation_and_in_training(tmp_path: Path):
    ref_proc = start("lightning_train.py", tmp_path / "ref", clean_env())
    uri = (tmp_path / "store").as_uri()

    def env(attempt: int, **gates: str) -> dict[str, str]:
        return clean_env(SPOTRUN_CHECKPOINT_URI=uri, SPOTRUN_ATTEMPT=str(attempt),
                         SPOTRUN_PROGRESS_FILE=str(tmp_path / f"progress-{attempt}.json"), **gates)

    a1 = tmp_path / "a1"
    step1 = notice_and_kill(start("lightning_train.py", a1, env(1, WORKLOAD_GATE_STEP="10")), a1,
                            "gate-eval", uri, KIND, tmp_path / "progress-1.json")
    assert step1 == 10
    assert "emergency checkpoint at step 10 during evaluation" in (a1 / "output.log").read_text()
    a2 = tmp_path / "a2"
    step2 = notice_and_kill(start("lightning_train.py", a2, env(2, WORKLOAD_TRAIN_GATE_STEP="17")),
                            a2, "gate-train", uri, KIND, tmp_path / "progress-2.json")
    assert step2 == 17      # at the next batch start; 17 is mid-epoch (12 batches per epoch)
    assert "resume-ckpt-000000000010" in (a2 / "output.log").read_text()
    a3 = tmp_path / "a3"
    text3 = finish(start("lightning_train.py", a3, env(3)), a3)
    assert "resume-ckpt-000000000017" in text3
    assert final_sha(text3) == final_sha(finish(ref_proc, tmp_path / "ref"))
    assert 40 in steps_in_store(uri, KIND)   # training ends with its final state in the store
    # The final checkpoint exports (`spotrun pull`'s export) to a state_dict torch alone reads.
    from spotrun.checkpoints import latest_verified
    from spotrun.integrations.export import export
    from spotrun.store import open_store
    store = open_store(uri)
    assert export(store, latest_verified(store), tmp_path / "export")[0] == "model.pt"
    read = subprocess.run([sys.executable, "-I", "-c", SHA_OF_STATE_DICT,
                           str(tmp_path / "export" / "model.pt")],
                          capture_output=True, text=True, timeout=120)
    assert read.returncode == 0, read.stderr[-2000:]
    assert read.stdout.strip() == final_sha(text3)

"""Users' loop shapes, interrupted where hypothesis says, resume bitwise (issue 40, part 3).

Each script in tests/loops/ is a training program written from the guide the way an
outsider writes one (a CIFAR ResNet with workers, augmentation, accumulation, EMA and a
best model; a word language model with hand-written updates; a DCGAN with two
optimizers). tests/loops/harness.py runs it as the agent runs a job, interrupts it at
the chosen points (notice: emergency checkpoint, then SIGKILL; or SIGKILL alone), resumes
it to the end in the same job directory, and compares every part of the final state and
every file in the job directory with an uninterrupted run, byte for byte. This is the
CI-sized subset; `bench/loops_conformance.py` sweeps every script x point x mode.
"""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path

import pytest

pytest.importorskip("torch")

from hypothesis import HealthCheck, Phase, example, given, settings  # noqa: E402

from loops.harness import Interruption, compare, reference, run_case  # noqa: E402
from loops.search import interruptions  # noqa: E402

pytestmark = pytest.mark.slow


# No shrinking: a case costs seconds of real processes, and its failure names the point.
CI = dict(derandomize=True, deadline=None, database=None, print_blob=True,
          phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
_cases = itertools.count()


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """Where the references and the cases live (one folder for the module)."""
    return tmp_path_factory.mktemp("loops")


def _check(script: str, interruptions: list[Interruption], scratch: Path) -> None:
    result = run_case(script, interruptions, scratch / f"case-{next(_cases)}", scratch)
    assert not result.problems, f"{script} {[str(i) for i in interruptions]}:\n" + \
        "\n".join(result.problems)


# The acceptance: workers + augmentation through reclaims mid-epoch and in a validation
# (explicit only: each drawn case costs a reference's worth of real processes).
@settings(max_examples=1, **dict(CI, phases=[Phase.explicit]))
@given(interruptions=interruptions("data"))
@example(interruptions=[Interruption("train", 0.5, "notice"),
                        Interruption("validation", 0.4, "notice"),
                        Interruption("save", 0.5, "kill")])
def test_cifar_resnet_resumes_bitwise(scratch, interruptions):
    _check("cifar_resnet.py", interruptions, scratch)


@settings(max_examples=1, **CI)
@given(interruptions=interruptions("validation"))
def test_lm_manual_updates_resume_bitwise(scratch, interruptions):
    _check("lm_manual.py", interruptions, scratch)


@settings(max_examples=1, **CI)
@given(interruptions=interruptions("best"))
def test_gan_two_optimizers_resume_bitwise(scratch, interruptions):
    _check("gan.py", interruptions, scratch)


@pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("accelerate", "transformers")),
                    reason="the hf extra (accelerate, transformers) is not installed")
# An accelerate no_trainer loop (docs/integrations.md): drawn as the others; the simplest
# draw is a notice mid-epoch between its accumulation steps.
@settings(max_examples=1, **CI)
@given(interruptions=interruptions("train"))
def test_accelerate_no_trainer_resumes_bitwise(scratch, interruptions):
    _check("hf_no_trainer.py", interruptions, scratch)


def test_a_notice_while_best_pt_is_written_keeps_each_log_row_once(scratch):
    # The notice's save from the watchdog takes the job's files as of the step it saves:
    # the validation's row written after it is not in that checkpoint, so the resume's
    # validation writes it once (it used to be there twice).
    _check("cifar_resnet.py", [Interruption("best", 0.5, "notice")], scratch)


@pytest.mark.skipif(not importlib.util.find_spec("lightning"), reason="lightning is not installed")
def test_lightning_notice_in_validation_keeps_loop_counters(scratch):
    # The save in a validation counts its first batch as started (so Lightning reruns the
    # validation); the rerun counted it again, and ModelCheckpoint's later file
    # (epoch=1-step=24.ckpt) held the validation loop's totals one too high (issue 40). A
    # second notice in the rerun validation: the resumed loader must still know its epoch's
    # length, or that save loses the epoch's end and the weights differ.
    _check("lightning_loop.py", [Interruption("validation", 0.3, "notice"),
                                 Interruption("validation", 0.0, "notice")], scratch)


def test_the_comparison_names_a_lost_row_and_a_changed_part(scratch):
    # The harness's own negative control: a lost log row or a changed tensor cannot pass.
    ref = reference("lm_manual.py", scratch)
    rows = ref.files["log.csv"].splitlines(keepends=True)
    lost = type(ref)(dict(ref.digests), {**ref.files, "log.csv": b"".join(rows[:2] + rows[3:])})
    assert [p for p in compare(ref, lost) if p.startswith("file log.csv: row 3 differs")]
    changed = type(ref)({**ref.digests, "model": "0" * 64}, dict(ref.files))
    assert compare(ref, changed) == ["final model differs"]

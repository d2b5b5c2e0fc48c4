"""Hugging Face `transformers.Trainer` on spot instances: one callback, one resume helper.

    cb = SpotrunCallback()
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[cb])
    trainer.train(resume_from_checkpoint=resume_from_checkpoint(trainer))

Checkpoints are Trainer's own `checkpoint-N/` folders (weights, optimizer, scheduler,
RNG, trainer_state.json); after Trainer writes one, the callback uploads it to the
job's checkpoint store as `ckpt-<N>/`, and `resume_from_checkpoint` downloads the newest
into `output_dir`, so Trainer resumes with its own data skipping and RNG restore.
The interruption notice (SIGUSR1) turns into `control.should_save = True` at the next
step end; during an evaluation the checkpoint of the last finished step is written at
the next evaluation batch, without waiting for the evaluation to end.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from spotrun.integrations._common import (Notice, Progress, download, env_interval_s,
                                          env_keep, folder_files, job_store, newest_of_kind,
                                          note_save, upload_files)

log = logging.getLogger("spotrun.integrations.hf")

KIND = "hf-trainer/1"
PREFIX = "checkpoint"   # transformers.trainer_utils.PREFIX_CHECKPOINT_DIR


class SpotrunCallback(TrainerCallback):
    """Upload each Trainer checkpoint to the job's store; save at once on the notice."""

    def __init__(self, trainer: Any = None, *, uri: str | None = None, keep: int | None = None,
                 interval_s: float | None = None, install_signal: bool = True) -> None:
        self.trainer = trainer
        self.store = job_store(uri)
        self.keep = keep or env_keep()
        # Wall seconds between saves the callback asks for; None leaves it to save_steps.
        self.interval_s = interval_s if interval_s is not None else env_interval_s()
        self.notice = Notice(install_signal)
        self.progress = Progress()
        self.uploaded_step: int | None = None
        self.emergency_steps: list[tuple[int, str]] = []   # (step, "train" | "evaluation")
        self._training = False
        self._last_save_t = time.monotonic()
        self._save_t0: float | None = None   # when the step that Trainer is about to save ended

    def bind(self, trainer: Any) -> "SpotrunCallback":
        """Give the callback its Trainer (needed to save during an evaluation and at the end)."""
        self.trainer = trainer
        return self

    # -- Trainer events ---------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
        """Start of training: report the step resumed from."""
        if self.trainer is None:
            log.warning("SpotrunCallback has no trainer (call resume_from_checkpoint(trainer) or "
                        "cb.bind(trainer)): no save during evaluation or at the end")
        self._training = True
        self._last_save_t = time.monotonic()
        self.progress.step(state.global_step, force=True)
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
        """After each optimizer step: the notice (or the spotrun interval) asks Trainer to save."""
        self.progress.step(state.global_step)
        if self.notice.pending:
            control.should_save = True
        elif self.interval_s and time.monotonic() - self._last_save_t >= self.interval_s:
            control.should_save = True
        # The save stall reported is Trainer's write plus the upload (not an evaluation first).
        self._save_t0 = (time.monotonic() if control.should_save and not control.should_evaluate
                         else None)
        return control

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
        """During an evaluation in training: on a notice, checkpoint the last finished step now."""
        if (self.notice.pending and self._training and self.trainer is not None
                and state.global_step > 0 and self.uploaded_step != state.global_step):
            # Model, optimizer and scheduler are those after step global_step; the evaluation
            # only reads them, so this is the state Trainer would save after it.
            self._save_t0 = time.monotonic()
            self.trainer._save_checkpoint(self.trainer.model, trial=None)
            self._after_save(args, state, where="evaluation")
            control.should_save = False   # this step is saved; Trainer need not save it again
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
        """Trainer wrote checkpoint-N: upload it."""
        self._after_save(args, state, where="train")
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
        """End of training: the store gets a checkpoint of the final state."""
        self._training = False
        if self.trainer is not None and self.uploaded_step != state.global_step:
            self._save_t0 = time.monotonic()
            self.trainer._save_checkpoint(self.trainer.model, trial=None)
            self._after_save(args, state, where="end")
        self.progress.step(state.global_step, force=True)
        return control

    # -- upload -----------------------------------------------------------------

    def _after_save(self, args: Any, state: Any, *, where: str) -> None:
        step = int(state.global_step)
        t0 = self._save_t0 if self._save_t0 is not None else time.monotonic()
        self._save_t0 = None
        folder = Path(args.output_dir) / f"{PREFIX}-{step}"
        if self.store is not None and state.is_world_process_zero and folder.is_dir():
            upload_files(self.store, step, folder_files(folder), KIND,
                         {"folder": folder.name}, keep=self.keep)
        note_save(self, step, where, t0)


def resume_from_checkpoint(trainer: Any, *, uri: str | None = None) -> str | None:
    """Path to pass to `trainer.train(resume_from_checkpoint=...)`, or None for a fresh start.

    Downloads the job's newest Trainer checkpoint (SPOTRUN_RESUME_CHECKPOINT first) into
    `output_dir/checkpoint-N`; outside spotrun, the newest local checkpoint folder.
    Also binds every SpotrunCallback of the trainer to it.
    """
    callbacks = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, SpotrunCallback)]
    for cb in callbacks:
        cb.bind(trainer)
    out = Path(trainer.args.output_dir)
    store = callbacks[0].store if callbacks and uri is None else job_store(uri)
    if store is None:
        from transformers.trainer_utils import get_last_checkpoint
        return get_last_checkpoint(str(out)) if out.is_dir() else None

    def fetch(name: str) -> Path:
        step = int(name.split("-")[1])
        dest = out / f"{PREFIX}-{step}"
        download(store, name, dest)
        return dest

    found = newest_of_kind(store, KIND, os.environ.get("SPOTRUN_RESUME_CHECKPOINT") or None,
                           fetch)
    if found is None:
        return None
    log.info("spotrun: resuming from %s", found[0])
    return str(found[1])


__all__ = ["KIND", "SpotrunCallback", "resume_from_checkpoint"]

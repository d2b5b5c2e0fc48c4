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

What Trainer's folder lacks for a resume to continue the run as if uninterrupted goes into
`spotrun_state.json` beside it: the loss accumulators (so the first logged loss and the final
`train_loss` are the uninterrupted run's), and, for a checkpoint written during an
evaluation, that this evaluation is still due. The resumed run then evaluates again, updates
the best metric and saves the checkpoint as Trainer would have, before training goes on.
`output_dir` is one of the job's persisted paths (spotrun/jobfiles.py): older checkpoint
folders, the best one among them, come back on the next instance.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from spotrun import jobfiles
from spotrun.checkpoints import read_manifest
from spotrun.integrations._common import (SEP, CallbackBase, download, folder_files,
                                          job_store, newest_of_kind, note_save,
                                          restore_job_files, upload_files)
from spotrun.store.localfile import file_sha256
from spotrun.torch.rng import get_rng_state, set_rng_state

log = logging.getLogger("spotrun.integrations.hf")

KIND = "hf-trainer/1"
PREFIX = "checkpoint"   # transformers.trainer_utils.PREFIX_CHECKPOINT_DIR
STATE_FILE = "spotrun_state.json"
STATE_FORMAT = 1


class SpotrunCallback(CallbackBase, TrainerCallback):
    """Upload each Trainer checkpoint to the job's store; save at once on the notice."""

    def __init__(self, trainer: Any = None, *, uri: str | None = None, keep: int | None = None,
                 interval_s: float | None = None, install_signal: bool = True) -> None:
        self.trainer = trainer
        self._start(uri, keep, interval_s, install_signal)
        self._training = False
        self._save_t0: float | None = None   # when the step that Trainer is about to save ended
        self._persisted = False
        self._resumed_from: Path | None = None   # the folder resume_from_checkpoint handed out
        self._resumed_from_store = False
        self._trainer_saves = False   # Trainer's own save decision at the last step end
        self._due_evaluation: dict[str, Any] | None = None   # interrupted evaluation to redo
        self._attempt_start: int | None = None   # global step this train() call started at

    def bind(self, trainer: Any) -> "SpotrunCallback":
        """Give the callback its Trainer (needed to save during an evaluation and at the end)."""
        self.trainer = trainer
        self._persist(trainer.args)
        return self

    # -- Trainer events ---------------------------------------------------------

    def on_init_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
        """Trainer built: its output_dir becomes one of the job's persisted paths."""
        self._persist(args)
        return control

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
        """Start of training: report the step resumed from; a resume gets its loss sums back."""
        if self.trainer is None:
            log.warning("SpotrunCallback has no trainer (call resume_from_checkpoint(trainer) or "
                        "cb.bind(trainer)): no save during evaluation or at the end")
        self._persist(args)
        self._training = True
        self._last_save_t = time.monotonic()
        self._attempt_start = int(state.global_step)
        if state.global_step > 0:    # a fresh TrainerState starts at 0: this is a resume
            self._resume_state(args, state)
            if self._due_evaluation is not None and state.global_step >= state.max_steps:
                # Training is over: no epoch need begin (Trainer may run one past max_steps).
                control = self._redo_evaluation(args, state, control)
        self.progress.step(state.global_step, force=True)
        return control

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
        """First epoch of a resume: the evaluation the reclaim interrupted runs now.

        Here rather than at train begin so every callback has seen `on_train_begin`;
        Trainer restores the checkpoint's random state only after this.
        """
        if self._due_evaluation is not None:
            control = self._redo_evaluation(args, state, control)
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
        """After each optimizer step: the notice (or the spotrun interval) asks Trainer to save."""
        self.progress.step(state.global_step)
        self._trainer_saves = bool(control.should_save)
        if self.notice.pending:
            control.should_save = True
        elif self.interval_s and time.monotonic() - self._last_save_t >= self.interval_s:
            control.should_save = True
        # The save stall reported is Trainer's write plus the upload (not an evaluation first).
        self._save_t0 = (time.monotonic() if control.should_save and not control.should_evaluate
                         else None)
        return control

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
        """Epoch end: Trainer's own save decision, for an evaluation that follows it."""
        self._trainer_saves = bool(control.should_save)
        return control

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
        """During an evaluation in training: on a notice, checkpoint the last finished step now."""
        if (self.notice.pending and self._training and self.trainer is not None
                and state.global_step > 0 and self.uploaded_step != state.global_step):
            # Model, optimizer and scheduler are those after step global_step; the evaluation
            # only reads them, so this is the state Trainer would save after it. The
            # evaluation itself is recorded as due: the resumed run does it (and what follows).
            self._save_t0 = time.monotonic()
            self.trainer._save_checkpoint(self.trainer.model, trial=None)
            self._after_save(args, state, where="evaluation",
                             due={"evaluate": True, "save": self._trainer_saves})
            control.should_save = False   # this step is saved; Trainer need not save it again
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
        """Trainer wrote checkpoint-N: upload it."""
        self._after_save(args, state, where="train")
        return control

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> Any:
        """The final train metrics of a resume: rates over this attempt's steps, not the job's."""
        # train_loss covers the job (the loss sums came back), train_runtime this attempt.
        job_start = getattr(self.trainer, "_initial_global_step", None)
        if (not isinstance(logs, dict) or "train_loss" not in logs or job_start is None
                or self._attempt_start is None):
            return control
        job_steps = state.global_step - job_start
        here = state.global_step - self._attempt_start
        if job_steps > 0 and here != job_steps:
            last = state.log_history[-1] if state.log_history else {}
            for key in ("train_samples_per_second", "train_steps_per_second"):
                if key in logs:
                    logs[key] = round(logs[key] * here / job_steps, 3)
                    if key in last:
                        last[key] = logs[key]
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

    # -- resume -----------------------------------------------------------------

    def _persist(self, args: Any) -> None:
        """Register output_dir (older checkpoints, the best one) with the job's persisted files."""
        if self._persisted or args is None or not getattr(args, "output_dir", None):
            return
        self._persisted = True
        out = Path(args.output_dir).resolve()
        # output_dir = the job directory itself: its checkpoint folders, not the code too.
        jobfiles.persist(out / f"{PREFIX}-*" if out == jobfiles.default().root else out)

    def _resume_state(self, args: Any, state: Any) -> None:
        """Read spotrun_state.json of the checkpoint resumed from; put the loss sums back."""
        step = int(state.global_step)
        folders = [self._resumed_from] if self._resumed_from is not None else []
        folders.append(Path(args.output_dir) / f"{PREFIX}-{step}")
        saved = next((s for s in map(read_state, folders) if s and s.get("step") == step), None)
        if self._resumed_from_store:
            self.uploaded_step = step   # that checkpoint is in the store already
        if saved is None:
            return
        loss = saved.get("loss") or {}
        trainer = self.trainer
        if trainer is not None and loss and hasattr(trainer, "_tr_loss"):
            if loss.get("tr_loss") is not None and getattr(args, "world_size", 1) == 1:
                trainer._tr_loss.fill_(float(loss["tr_loss"]))   # float32 value, exact
            trainer._total_loss_scalar = float(loss["total_loss_scalar"])
            trainer._globalstep_last_logged = int(loss["globalstep_last_logged"])
            trainer._initial_global_step = int(loss["initial_global_step"])
        due = saved.get("due")
        if due and due.get("evaluate"):
            if trainer is None:
                log.warning("spotrun: the evaluation of step %d was interrupted and cannot be "
                            "done again without the trainer (cb.bind(trainer))", step)
            else:
                self._due_evaluation = dict(due)

    def _redo_evaluation(self, args: Any, state: Any, control: Any) -> Any:
        """Evaluate, update the best metric and save, as Trainer would have at that step.

        The random state is left as it was (and the re-saved folder keeps the RNG files
        Trainer will restore), so training goes on exactly as after the original evaluation.
        """
        due, self._due_evaluation = self._due_evaluation or {}, None
        trainer = self.trainer
        step = int(state.global_step)
        print(f"spotrun: evaluating step {step} again (the reclaim interrupted it)", flush=True)
        folder = Path(args.output_dir) / f"{PREFIX}-{step}"
        rng_files = {p: p.read_bytes() for p in folder.glob("rng_state*.pth")}
        rng = get_rng_state()
        try:
            metrics = trainer._evaluate(None, None)
            is_best = trainer._determine_best_metric(metrics=metrics, trial=None)
            save = bool(due.get("save"))
            if str(getattr(args.save_strategy, "value", args.save_strategy)) == "best":
                save = is_best
            if save:
                trainer.control.should_save = True
                trainer._save_checkpoint(trainer.model, trial=None)
                for path, data in rng_files.items():
                    path.write_bytes(data)
                trainer.control = trainer.callback_handler.on_save(args, state, trainer.control)
        finally:
            set_rng_state(rng)
        return trainer.control

    # -- upload -----------------------------------------------------------------

    def _after_save(self, args: Any, state: Any, *, where: str,
                    due: dict[str, Any] | None = None) -> None:
        step = int(state.global_step)
        t0 = self._save_t0 if self._save_t0 is not None else time.monotonic()
        self._save_t0 = None
        folder = Path(args.output_dir) / f"{PREFIX}-{step}"
        if state.is_world_process_zero and folder.is_dir():
            write_state(folder, self._state_body(step, due))
            if self.store is not None:
                upload_files(self.store, step, folder_files(folder), KIND,
                             {"folder": folder.name}, keep=self.keep)
        note_save(self, step, where, t0)

    def _state_body(self, step: int, due: dict[str, Any] | None) -> dict[str, Any]:
        body: dict[str, Any] = {"format": STATE_FORMAT, "step": step, "due": due}
        trainer = self.trainer
        if trainer is not None and hasattr(trainer, "_tr_loss"):
            body["loss"] = {
                # The partial sum since the last logged step: a float32 tensor, per process.
                "tr_loss": float(trainer._tr_loss.item()),
                "total_loss_scalar": float(trainer._total_loss_scalar),
                "globalstep_last_logged": int(trainer._globalstep_last_logged),
                "initial_global_step": int(getattr(trainer, "_initial_global_step", 0)),
            }
        return body


def read_state(folder: Path | None) -> dict[str, Any] | None:
    """A checkpoint folder's spotrun_state.json, or None (none, or unreadable)."""
    if folder is None:
        return None
    try:
        body = json.loads((Path(folder) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) and body.get("format") == STATE_FORMAT else None


def write_state(folder: Path, body: dict[str, Any]) -> None:
    """Write spotrun_state.json into a checkpoint folder (temp file + rename)."""
    tmp = folder / f".{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(body, sort_keys=True))
    os.replace(tmp, folder / STATE_FILE)


def _has_files(dest: Path, manifest: Any) -> bool:
    """Every file of the checkpoint is already in dest, byte for byte (restored with the job's)."""
    for flat, meta in manifest.files.items():
        if flat == jobfiles.INDEX:
            continue
        path = dest / flat.replace(SEP, "/")
        if not path.is_file() or path.stat().st_size != int(meta["size"]):
            return False
        if file_sha256(path) != meta["sha256"]:
            return False
    return True


def _restamp_folders(out: Path) -> None:
    """Give each checkpoint folder the mtime of its newest file.

    Trainer rotates checkpoints by folder mtime; a restore writes folders anew (files keep
    their recorded mtime, folders get the restore's), which would reorder them.
    """
    for folder in out.glob(f"{PREFIX}-*"):
        if not folder.is_dir():
            continue
        newest = max((p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()), default=None)
        if newest is not None and folder.stat().st_mtime_ns != newest:
            os.utime(folder, ns=(newest, newest))


def resume_from_checkpoint(trainer: Any, *, uri: str | None = None) -> str | None:
    """Path to pass to `trainer.train(resume_from_checkpoint=...)`, or None for a fresh start.

    Puts the job's persisted files of its newest Trainer checkpoint (SPOTRUN_RESUME_CHECKPOINT
    first) back into the job directory, `output_dir` among them, and makes sure that
    checkpoint is whole in `output_dir/checkpoint-N`; outside spotrun, the newest local
    checkpoint folder. Also binds every SpotrunCallback of the trainer to it.
    """
    callbacks = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, SpotrunCallback)]
    for cb in callbacks:
        cb.bind(trainer)
    out = Path(trainer.args.output_dir)
    store = callbacks[0].store if callbacks and uri is None else job_store(uri)
    if store is None:
        from transformers.trainer_utils import get_last_checkpoint
        last = get_last_checkpoint(str(out)) if out.is_dir() else None
        for cb in callbacks:
            cb._resumed_from = Path(last) if last else None
        return last

    def fetch(name: str) -> Path:
        restore_job_files(store, name)
        manifest = read_manifest(store, name)
        dest = out / f"{PREFIX}-{manifest.step}"
        if not _has_files(dest, manifest):
            download(store, name, dest)
        _restamp_folders(out)
        return dest

    found = newest_of_kind(store, KIND, os.environ.get("SPOTRUN_RESUME_CHECKPOINT") or None,
                           fetch)
    if found is None:
        return None
    log.info("spotrun: resuming from %s", found[0])
    for cb in callbacks:
        cb._resumed_from, cb._resumed_from_store = found[1], True
    return str(found[1])


__all__ = ["KIND", "STATE_FILE", "SpotrunCallback", "read_state", "resume_from_checkpoint",
           "write_state"]

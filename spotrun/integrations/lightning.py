"""PyTorch Lightning on spot instances: a callback, a resumable data loader, a resume helper.

    spot = SpotrunCallback()
    train = ResumableDataLoader(dataset, batch_size=32, shuffle=True)   # DataLoader's arguments
    trainer = L.Trainer(max_steps=..., callbacks=[spot])
    trainer.fit(model, train, val, ckpt_path=ckpt_path())

Checkpoints are Lightning's own `.ckpt` files (`trainer.save_checkpoint`: weights,
optimizers, schedulers, loop progress, callback and data-loader state); the callback
uploads each to the job's store as `ckpt-<global step>/` and `ckpt_path()` downloads the
newest, so `fit(ckpt_path=...)` resumes through Lightning's fault tolerance. An exact
mid-epoch resume needs a stateful train loader (Lightning saves its `state_dict`):
`ResumableDataLoader` is one.

When a checkpoint is taken: between two steps, at the start of the next batch (after the
previous step's logging, validation and every callback's reaction to it, so a
ModelCheckpoint save or a logged row belongs to the step it follows); during a validation
on the notice, at its next batch, saved as the state before that validation, which the
resume then runs whole (its rows and its ModelCheckpoint save exist once); and at the end.

The job's files go with each checkpoint (spotrun/jobfiles.py): the loggers' version folders
and every ModelCheckpoint folder are registered, buffered logger rows are flushed first. On
a resume the loggers keep the first attempt's versions (Lightning would pick the next free
`version_N` and ModelCheckpoint would lose its best model), and CSVLogger keeps the restored
rows instead of starting a new metrics.csv.

Exact resume also needs the random state: the callback stores it in the checkpoint and
puts it back at the start of a resumed fit. Neither the callback nor the loader moves the
random state of an uninterrupted run, so the script gives bitwise the results of the same
script with a stock DataLoader and no callback.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

try:
    import lightning.pytorch as pl
except ImportError:   # the standalone package of the same code
    import pytorch_lightning as pl  # type: ignore[no-redef]

from spotrun import jobfiles
from spotrun.integrations.lightning_data import (EpochSampler, ResumableDataLoader,
                                                  _train_loaders)
from spotrun.integrations._common import (CallbackBase, download, job_store, newest_of_kind,
                                          note_save, restore_job_files, upload_files)
from spotrun.torch.rng import get_rng_state, set_rng_state

log = logging.getLogger("spotrun.integrations.lightning")

KIND = "lightning/1"
FILE = "last.ckpt"
DEFAULT_DIR = "spotrun-checkpoints"
METRICS = "metrics.csv"
# Loggers that write into a `version_N` folder of their own and pick N when first asked.
VERSIONED = (pl.loggers.CSVLogger, pl.loggers.TensorBoardLogger)

# What ckpt_path() found for the fit it feeds: the loggers of the checkpoint and the rows of
# their metrics.csv, read before Lightning's CSV writer deletes the file.
_RESUME: dict[str, Any] = {}


def _rng_save(s: dict[str, Any] | None = None) -> dict[str, Any]:
    # Tensors and plain values only: Lightning may load checkpoints with weights_only=True.
    s = get_rng_state() if s is None else s
    kind, keys, pos, has_gauss, gauss = s["numpy"]
    out = {"python": s["python"], "torch": s["torch"],
           "numpy": [kind, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss),
                     float(gauss)]}
    if "cuda" in s:
        out["cuda"] = list(s["cuda"])
    return out


def _rng_load(saved: dict[str, Any]) -> None:
    import numpy as np
    kind, keys, pos, has_gauss, gauss = saved["numpy"]
    py = saved["python"]
    set_rng_state({"python": (py[0], tuple(py[1]), py[2]), "torch": saved["torch"],
                   "numpy": (kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss),
                   **({"cuda": saved["cuda"]} if "cuda" in saved else {})})


def _as_between_steps(loops: dict[str, Any]) -> None:
    """A save at a batch start (the next batch fetched, not started) as the state after the
    previous batch: Lightning resumes it as a save after that batch (and its validation)."""
    progress = loops["fit_loop"]["epoch_loop.batch_progress"]
    for counters in (progress["total"], progress["current"]):
        counters["ready"] = counters["started"] = counters["processed"] = counters["completed"]
    progress["is_last_batch"] = False


def _as_before_validation(loops: dict[str, Any]) -> None:
    """A save during a validation as one in its first step: the resume runs it whole.

    The first batch counts as ready and started (how Lightning tells a restart mid-validation),
    and Lightning keeps totals on a restart: `_drop_phantom_batch` uncounts it when it reruns.
    """
    progress = loops["fit_loop"]["epoch_loop.val_loop.batch_progress"]
    before = progress["total"]["completed"] - progress["current"]["completed"]
    progress["total"].update(ready=before + 1, started=before + 1, processed=before,
                             completed=before)
    progress["current"].update(ready=1, started=1, processed=0, completed=0)
    progress["is_last_batch"] = False


def _drop_phantom_batch(trainer: Any) -> None:
    """At the rerun validation's start: totals back to the batches finished before it."""
    total = trainer.fit_loop.epoch_loop.val_loop.batch_progress.total
    total.ready = total.started = total.processed = total.completed


def _saved_step_count(loops: dict[str, Any], automatic: bool) -> dict[str, int]:
    """The optimizer-step counter a checkpoint's global_step comes from."""
    fit = loops["fit_loop"]
    if automatic:
        return fit["epoch_loop.automatic_optimization.optim_progress"]["optimizer"]["step"][
            "total"]
    return fit["epoch_loop.manual_optimization.optim_step_progress"]["total"]


def _live_step_count(trainer: Any, automatic: bool) -> Any:
    """The optimizer-step counter trainer.global_step reads."""
    loop = trainer.fit_loop.epoch_loop
    if automatic:
        return loop.automatic_optimization.optim_progress.optimizer.step.total
    return loop.manual_optimization.optim_step_progress.total


def _at_optimizer_step(trainer: Any) -> bool:
    """No gradient accumulation in progress (its partial gradients are not checkpointed)."""
    every = int(getattr(trainer, "accumulate_grad_batches", 1) or 1)
    return every <= 1 or trainer.fit_loop.epoch_loop.batch_progress.current.completed % every == 0


# -- loggers ------------------------------------------------------------------------------

def _logger_records(trainer: Any) -> list[dict[str, Any]]:
    """The versioned loggers of this fit: position, type, version, folder (for a resume)."""
    return [{"index": i, "type": type(lg).__name__, "version": lg.version, "log_dir": lg.log_dir}
            for i, lg in enumerate(trainer.loggers) if isinstance(lg, VERSIONED)]


def _read_rows(records: list[dict[str, Any]]) -> dict[str, tuple[bytes, int]]:
    """Each CSVLogger's restored metrics.csv (bytes, mtime), by absolute path."""
    rows: dict[str, tuple[bytes, int]] = {}
    for rec in records:
        if rec.get("type") != "CSVLogger" or not rec.get("log_dir"):
            continue
        path = Path(rec["log_dir"]) / METRICS
        try:
            rows[os.path.abspath(path)] = (path.read_bytes(), path.stat().st_mtime_ns)
        except OSError:
            continue
    return rows


def _remember_resume(records: Any) -> None:
    records = [r for r in records if isinstance(r, dict)] if isinstance(records, list) else []
    _RESUME.clear()
    _RESUME.update(loggers=records, rows=_read_rows(records))


def _pin_loggers(trainer: Any, resume: dict[str, Any], since_s: float) -> None:
    """On a resume: the first attempt's logger versions, and CSVLogger's restored rows."""
    for rec in resume.get("loggers") or []:
        index = rec.get("index")
        if not isinstance(index, int) or not 0 <= index < len(trainer.loggers):
            continue
        lg = trainer.loggers[index]
        if not isinstance(lg, VERSIONED) or type(lg).__name__ != rec.get("type"):
            continue
        if lg.version != rec.get("version"):
            unused = Path(lg.log_dir)
            experiment, lg._experiment = lg._experiment, None
            if hasattr(experiment, "close"):
                experiment.close()      # a TensorBoard writer made for the wrong version
            lg._version = rec["version"]
            if trainer.is_global_zero:
                _remove_made_since(unused, since_s)
            log.info("spotrun: logger %s resumes in %s", type(lg).__name__, lg.log_dir)
        if isinstance(lg, pl.loggers.CSVLogger) and trainer.is_global_zero:
            saved = (resume.get("rows") or {}).get(os.path.abspath(Path(lg.log_dir) / METRICS))
            if saved is not None:
                _put_back_rows(lg, *saved)


def _remove_made_since(folder: Path, since_s: float) -> None:
    """Remove a logger folder this process made for nothing (its files only, if any)."""
    if not folder.is_dir():
        return
    for f in folder.iterdir():
        if f.is_file() and f.stat().st_mtime >= since_s:
            f.unlink()
    try:
        folder.rmdir()
    except OSError:
        pass    # something else lives there: leave it


def _put_back_rows(lg: Any, body: bytes, mtime_ns: int) -> None:
    # The writer (made now, or when Lightning set up the loggers) deleted the restored file;
    # with it back and the writer told its columns, new rows append after the restored ones.
    writer = lg.experiment
    path = Path(writer.metrics_file_path)
    path.write_bytes(body)
    os.utime(path, ns=(mtime_ns, mtime_ns))
    header = next(csv.reader(io.StringIO(body.decode("utf-8", "replace"))), [])
    writer.metrics_keys = list(header)


def _flush_loggers(trainer: Any) -> None:
    """Buffered rows to disk, so the files saved with a checkpoint hold its step's rows."""
    for lg in trainer.loggers:
        try:
            lg.save()
        except Exception as exc:   # a logger's failure must not cost the checkpoint
            log.warning("spotrun: could not flush logger %s: %s", type(lg).__name__, exc)


class SpotrunCallback(CallbackBase, pl.Callback):
    """Upload Lightning checkpoints to the job's store; save at once on the notice."""

    def __init__(self, dirpath: str | os.PathLike[str] = DEFAULT_DIR, *, uri: str | None = None,
                 keep: int | None = None, interval_s: float | None = None,
                 install_signal: bool = True) -> None:
        self.dirpath = Path(dirpath)
        self._start(uri, keep, interval_s, install_signal)
        self._created_s = time.time()
        self._saving: str | None = None                      # where, while save() runs
        self._last_saved: tuple[int, str] | None = None      # (step, where) of the last save
        self._rng_to_restore: dict[str, Any] | None = None   # from the checkpoint resumed
        self._stepped_to_restore: int | None = None          # its logging step, likewise
        self._rng_before_val: tuple[int, dict[str, Any]] | None = None   # (step, state)
        self._steps_held_back = 0   # steps a resume hides until its validation reruns
        self._val_rerun = False     # resumed from a save in a validation, not yet rerun

    # -- set-up: callback order, logger versions, persisted folders ----------------------

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """First among the callbacks; on a resume, the first attempt's logger versions."""
        if stage != "fit":
            return
        if trainer.callbacks and trainer.callbacks[0] is not self:
            # A new list (Lightning is iterating the old one): from now on this callback's
            # hooks come first, so a batch-start save precedes what others log there.
            trainer.callbacks = [self, *(c for c in trainer.callbacks if c is not self)]
        resume = dict(_RESUME)
        _RESUME.clear()
        if resume:
            # Before ModelCheckpoint.setup, which derives its folder from the version.
            _pin_loggers(trainer, resume, self._created_s - 1.0)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """Register the folders to persist; on a resume, the saved random state."""
        mine = self.dirpath.resolve()
        folders = [lg.log_dir for lg in trainer.loggers if isinstance(lg, VERSIONED)]
        folders += [cb.dirpath for cb in trainer.checkpoint_callbacks
                    if getattr(cb, "dirpath", None)]
        jobfiles.persist(*(os.path.abspath(f) for f in folders if Path(f).resolve() != mine))
        self._restore_saved_rng()

    # -- random state -------------------------------------------------------------------
    # The callback never moves the random state of an uninterrupted run (so the script
    # matches the same script without spotrun, bitwise); it only puts the saved state back
    # on a resume. A save during a validation holds the state from before it, which the
    # resume's rerun of that validation then draws from as the first run did.

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        """Add the random state (and, for this callback's saves, mend the loop progress)."""
        state, where = None, self._saving
        extra: dict[str, Any] = {}
        if where == "evaluation":
            if self._rng_before_val is not None and self._rng_before_val[0] == trainer.global_step:
                state = self._rng_before_val[1]
            else:
                log.warning("spotrun: no random state from before this validation: the resume "
                            "reruns it from the state now")
            _as_before_validation(checkpoint["loops"])
        elif where == "train":
            _as_between_steps(checkpoint["loops"])
            extra["batches_that_stepped"] = int(trainer.fit_loop.epoch_loop._batches_that_stepped)
        checkpoint["spotrun"] = {"rng": _rng_save(state), "where": where or "", **extra}

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        """Keep the saved random state and logging step for the start of fit."""
        saved = checkpoint.get("spotrun") or {}
        self._rng_to_restore = saved.get("rng")
        self._stepped_to_restore = saved.get("batches_that_stepped")
        step = int(checkpoint.get("global_step", -1))
        if saved.get("where"):
            self._last_saved = (step, str(saved["where"]))
        self._val_rerun = saved.get("where") == "evaluation"
        if saved.get("where") == "evaluation" and 0 <= trainer.max_steps <= step:
            # Lightning ends a fit that reached max_steps before the validation it was in:
            # one step fewer until that validation starts again, so it runs (and counts).
            totals = _saved_step_count(checkpoint["loops"], pl_module.automatic_optimization)
            totals["ready"] -= 1
            totals["completed"] -= 1
            self._steps_held_back = 1

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Report the step training starts from."""
        self._restore_saved_rng()    # strategies that restore the checkpoint after on_fit_start
        # A resumed validation (one saved while running) starts from this state.
        self._rng_before_val = (trainer.global_step, get_rng_state())
        self._last_save_t = time.monotonic()
        self.progress.step(trainer.global_step, force=True)

    def _restore_saved_rng(self) -> None:
        if self._rng_to_restore is not None:
            _rng_load(self._rng_to_restore)
            self._rng_to_restore = None

    # -- saving -------------------------------------------------------------------------

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None:
        """Between two steps: a save on the notice or the interval."""
        if self._stepped_to_restore is not None:
            # Lightning's restart from a save after a validation counts that step once more.
            trainer.fit_loop.epoch_loop._batches_that_stepped = int(self._stepped_to_restore)
            self._stepped_to_restore = None
        due = self.interval_s and time.monotonic() - self._last_save_t >= self.interval_s
        step = int(trainer.global_step)
        if ((self.notice.pending or due) and step > 0 and self._last_saved != (step, "train")
                and _at_optimizer_step(trainer)):
            self.save(trainer, "train")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """After each batch: data position, progress, the random state a validation starts from."""
        for loader in _train_loaders(trainer):
            loader.batches_done = batch_idx + 1
        self._rng_before_val = (trainer.global_step, get_rng_state())
        self.progress.step(trainer.global_step)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        """A finished epoch: the next starts from its first batch."""
        for loader in _train_loaders(trainer):
            loader.batches_done = 0

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        """A rerun validation: its counters as before it, and a held-back step count back."""
        if trainer.sanity_checking:
            return
        if self._val_rerun:
            _drop_phantom_batch(trainer)
            self._val_rerun = False
        if self._steps_held_back:
            totals = _live_step_count(trainer, pl_module.automatic_optimization)
            totals.ready += self._steps_held_back
            totals.completed += self._steps_held_back
            self._steps_held_back = 0

    def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        """During a validation in fit: on a notice, save now (the resume reruns the validation)."""
        if (self.notice.pending and not trainer.sanity_checking and trainer.state.fn == "fit"
                and trainer.global_step > 0):
            self.save(trainer, "evaluation")

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """End of training: the store gets a checkpoint of the final state."""
        if self._last_saved != (int(trainer.global_step), "end"):
            self.save(trainer, "end")
        self.progress.step(trainer.global_step, force=True)

    def save(self, trainer: Any, where: str = "train") -> Path:
        """Write a Lightning checkpoint now and upload it with the job's files; the local file.

        `where` is what the checkpoint's progress means to the resume: "train" (at a batch
        start: after the previous step), "evaluation" (during a validation: before it),
        "end" (the final state).
        """
        t0 = time.monotonic()
        step = int(trainer.global_step)
        path = self.dirpath / f"step={step}.ckpt"
        loaders = _train_loaders(trainer)
        self._saving = where
        for loader in loaders:
            loader.tail_on_resume = where == "evaluation"
        try:
            trainer.save_checkpoint(path)
        finally:
            self._saving = None
            for loader in loaders:
                loader.tail_on_resume = False
        records = _logger_records(trainer)
        _flush_loggers(trainer)
        sidecar = path.with_suffix(".json")
        if trainer.is_global_zero:
            sidecar.write_text(json.dumps({"loggers": records}))   # a local resume's loggers
            if self.store is not None:
                upload_files(self.store, step, {FILE: path}, KIND,
                             {"file": FILE, "where": where, "loggers": records}, keep=self.keep)
        for old in self.dirpath.glob("step=*"):   # the store keeps the history
            if old not in (path, sidecar):
                old.unlink(missing_ok=True)
        self._last_saved = (step, where)
        note_save(self, step, where, t0)
        return path


def ckpt_path(dirpath: str | os.PathLike[str] = DEFAULT_DIR, *, uri: str | None = None) -> str | None:
    """The `ckpt_path` for `trainer.fit`: the job's newest Lightning checkpoint, downloaded.

    SPOTRUN_RESUME_CHECKPOINT first; its persisted files are put back into the job directory
    first (unless the agent did). Outside spotrun (no store), the newest local one in
    dirpath; None for a fresh start.
    """
    folder = Path(dirpath)
    store = job_store(uri)
    _RESUME.clear()
    if store is None:
        local = sorted(folder.glob("step=*.ckpt"), key=lambda p: int(p.stem.split("=")[1]))
        if not local:
            return None
        try:
            _remember_resume(json.loads(local[-1].with_suffix(".json").read_text())["loggers"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return str(local[-1])

    def fetch(name: str) -> tuple[Path, Any]:
        restore_job_files(store, name)
        dest = folder / f"resume-{name}"
        manifest = download(store, name, dest)
        return dest / FILE, manifest.extra.get("loggers")

    found = newest_of_kind(store, KIND, os.environ.get("SPOTRUN_RESUME_CHECKPOINT") or None, fetch)
    if not found:
        return None
    path, records = found[1]
    _remember_resume(records)
    return str(path)


__all__ = ["KIND", "EpochSampler", "ResumableDataLoader", "SpotrunCallback", "ckpt_path"]

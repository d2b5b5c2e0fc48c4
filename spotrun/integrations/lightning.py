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
`ResumableDataLoader` is one. The interruption notice (SIGUSR1) saves at the next
training batch end, or at the next validation batch during a validation.

Exact resume also needs the random state: the callback stores it in the checkpoint and
puts it back at the start of a resumed fit. Neither the callback nor the loader moves the
random state of an uninterrupted run, so the script gives bitwise the results of the same
script with a stock DataLoader and no callback.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader, Sampler

try:
    import lightning.pytorch as pl
except ImportError:   # the standalone package of the same code
    import pytorch_lightning as pl  # type: ignore[no-redef]

from spotrun.integrations._common import (Notice, Progress, download, env_interval_s, env_keep,
                                          job_store, newest_of_kind, note_save, upload_files)
from spotrun.torch.rng import get_rng_state, set_rng_state

log = logging.getLogger("spotrun.integrations.lightning")

KIND = "lightning/1"
FILE = "last.ckpt"
DEFAULT_DIR = "spotrun-checkpoints"


def _rng_save() -> dict[str, Any]:
    # Tensors and plain values only: Lightning may load checkpoints with weights_only=True.
    s = get_rng_state()
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


class EpochSampler(Sampler[int]):
    """Stock `RandomSampler` order, each epoch's draw recorded so a resume replays it.

    Without a generator it draws the epoch's seed from torch's global generator when the
    epoch's iteration starts, exactly as `RandomSampler(generator=None)` does; with one it
    shuffles with that generator (its state at the epoch start is recorded). It can start
    an epoch past its first `skip` indices.
    """

    def __init__(self, length: int, *, shuffle: bool = True,
                 generator: torch.Generator | None = None) -> None:
        self.length, self.shuffle, self.generator = length, shuffle, generator
        self.epoch = 0
        self.skip = 0
        self.seed: int | None = None                        # drawn for the current epoch
        self.generator_state: torch.Tensor | None = None    # generator's state at its start
        self.replay: dict[str, Any] | None = None           # the next iteration reuses these

    def set_epoch(self, epoch: int) -> None:
        """Lightning calls this at each epoch start (the order does not depend on it)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[int]:
        # A generator function like RandomSampler.__iter__: the seed is drawn at the first
        # next(), not at iter(), so the global random stream sees the same draw order.
        if self.shuffle:
            replay, self.replay = self.replay, None
            if self.generator is None:
                if replay and replay.get("seed") is not None:
                    seed = int(replay["seed"])
                else:
                    seed = int(torch.empty((), dtype=torch.int64).random_().item())
                self.seed = seed
                g = torch.Generator()
                g.manual_seed(seed)
            else:
                if replay and replay.get("generator_state") is not None:
                    self.generator.set_state(replay["generator_state"])
                self.generator_state = self.generator.get_state()
                g = self.generator
            order = torch.randperm(self.length, generator=g).tolist()
        else:
            order = list(range(self.length))
        skip, self.skip = self.skip, 0
        yield from order[skip:]


class ResumableDataLoader(DataLoader):
    """A DataLoader whose position Lightning saves and restores (its state_dict).

    Same arguments and same batches as `DataLoader`: with `shuffle=True` and no generator
    the order and the workers' base seed come from torch's global generator, drawn at the
    same moments as the stock loader draws them, so swapping it in changes nothing. What
    each epoch drew is recorded (the sampler's seed, the generator state the base seed
    came from), and a resume mid-epoch replays it without drawing again. `seed=N` is
    short for `generator=torch.Generator().manual_seed(N)`. The callback tells it how
    many batches of the epoch are done (a prefetching loop has handed out more).
    """

    def __init__(self, dataset: Any, batch_size: int | None = 1, *, shuffle: bool = False,
                 seed: int | None = None, generator: torch.Generator | None = None,
                 **kwargs: Any) -> None:
        if seed is not None:
            if generator is not None:
                raise ValueError("ResumableDataLoader: give seed or generator, not both")
            generator = torch.Generator().manual_seed(seed)
        super().__init__(dataset, batch_size=batch_size,
                         sampler=EpochSampler(len(dataset), shuffle=shuffle, generator=generator),
                         generator=generator, **kwargs)
        self.batches_done = 0
        self.base_rng: torch.Tensor | None = None   # the state this epoch's base seed came from
        self._replay_base: torch.Tensor | None = None

    def _get_iterator(self) -> Any:
        source = self.generator
        replay, self._replay_base = self._replay_base, None
        if replay is not None and source is not None:
            source.set_state(replay)    # the user's generator redraws what it drew then
        elif replay is not None:
            # Global mode: the base seed comes from a copy of the recorded state, so the
            # global generator (restored by the callback) is not advanced a second time.
            self.base_rng = replay
            self.generator = torch.Generator()
            self.generator.set_state(replay)
            try:
                return super()._get_iterator()
            finally:
                self.generator = source
        self.base_rng = torch.get_rng_state() if source is None else source.get_state()
        return super()._get_iterator()

    def state_dict(self) -> dict[str, Any]:
        """Epoch, finished batches in it, and what the epoch drew (to replay its order)."""
        return {"epoch": self.sampler.epoch, "batches_done": self.batches_done,
                "seed": self.sampler.seed, "generator_state": self.sampler.generator_state,
                "base_rng": self.base_rng}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The next iteration replays the saved epoch after its finished batches."""
        self.sampler.epoch = int(state["epoch"])
        self.batches_done = int(state["batches_done"])
        if self.batches_done >= len(self):
            self.batches_done = 0   # the epoch was finished: the next one draws afresh
            return
        self.sampler.skip = self.batches_done * int(self.batch_size or 1)
        self.sampler.replay = {"seed": state.get("seed"),
                               "generator_state": state.get("generator_state")}
        self._replay_base = state.get("base_rng")


def _train_loaders(trainer: Any) -> list[ResumableDataLoader]:
    loaders = trainer.train_dataloader
    if isinstance(loaders, dict):
        loaders = list(loaders.values())
    elif not isinstance(loaders, (list, tuple)):
        loaders = [loaders]
    return [x for x in loaders if isinstance(x, ResumableDataLoader)]


class SpotrunCallback(pl.Callback):
    """Upload Lightning checkpoints to the job's store; save at once on the notice."""

    def __init__(self, dirpath: str | os.PathLike[str] = DEFAULT_DIR, *, uri: str | None = None,
                 keep: int | None = None, interval_s: float | None = None,
                 install_signal: bool = True) -> None:
        self.dirpath = Path(dirpath)
        self.store = job_store(uri)
        self.keep = keep or env_keep()
        self.interval_s = interval_s if interval_s is not None else env_interval_s()
        self.notice = Notice(install_signal)
        self.progress = Progress()
        self.uploaded_step: int | None = None
        self.emergency_steps: list[tuple[int, str]] = []
        self._last_save_t = time.monotonic()
        self._rng_to_restore: dict[str, Any] | None = None   # from the checkpoint resumed

    # -- random state -------------------------------------------------------------
    # The callback never moves the random state of an uninterrupted run (so the script
    # matches the same script without spotrun, bitwise); it only puts the saved state back
    # on a resume. Draws Lightning makes between a save and the next step (a validation
    # loader's base seed) it makes again on the resume, skipped validation included.

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        """Add the random state to the checkpoint."""
        checkpoint["spotrun"] = {"rng": _rng_save()}

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        """Keep the saved random state for the start of fit."""
        self._rng_to_restore = (checkpoint.get("spotrun") or {}).get("rng")

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """Resume: the saved random state, before the train loader draws its next epoch."""
        self._restore_saved_rng()

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Report the step training starts from."""
        self._restore_saved_rng()    # strategies that restore the checkpoint after on_fit_start
        self._last_save_t = time.monotonic()
        self.progress.step(trainer.global_step, force=True)

    def _restore_saved_rng(self) -> None:
        if self._rng_to_restore is not None:
            _rng_load(self._rng_to_restore)
            self._rng_to_restore = None

    # -- saving -------------------------------------------------------------------

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """After each batch: data position, progress, and a save on the notice or interval."""
        for loader in _train_loaders(trainer):
            loader.batches_done = batch_idx + 1
        self.progress.step(trainer.global_step)
        due = self.interval_s and time.monotonic() - self._last_save_t >= self.interval_s
        if self.notice.pending or due:
            self.save(trainer, "train")

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        """A finished epoch: the next starts from its first batch."""
        for loader in _train_loaders(trainer):
            loader.batches_done = 0

    def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        """During a validation in fit: on a notice, checkpoint the last finished step now."""
        if (self.notice.pending and not trainer.sanity_checking and trainer.state.fn == "fit"
                and trainer.global_step > 0 and self.uploaded_step != trainer.global_step):
            self.save(trainer, "evaluation")

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """End of training: the store gets a checkpoint of the final state."""
        if self.uploaded_step != trainer.global_step:
            self.save(trainer, "end")
        self.progress.step(trainer.global_step, force=True)

    def save(self, trainer: Any, where: str = "train") -> Path:
        """Write a Lightning checkpoint now and upload it; returns the local file."""
        t0 = time.monotonic()
        step = int(trainer.global_step)
        path = self.dirpath / f"step={step}.ckpt"
        trainer.save_checkpoint(path)
        if self.store is not None and trainer.is_global_zero:
            upload_files(self.store, step, {FILE: path}, KIND, {"file": FILE}, keep=self.keep)
        for old in self.dirpath.glob("step=*.ckpt"):   # the store keeps the history
            if old != path:
                old.unlink(missing_ok=True)
        note_save(self, step, where, t0)
        return path


def ckpt_path(dirpath: str | os.PathLike[str] = DEFAULT_DIR, *, uri: str | None = None) -> str | None:
    """The `ckpt_path` for `trainer.fit`: the job's newest Lightning checkpoint, downloaded.

    SPOTRUN_RESUME_CHECKPOINT first; outside spotrun (no store), the newest local one
    in dirpath; None for a fresh start.
    """
    folder = Path(dirpath)
    store = job_store(uri)
    if store is None:
        local = sorted(folder.glob("step=*.ckpt"), key=lambda p: int(p.stem.split("=")[1]))
        return str(local[-1]) if local else None

    def fetch(name: str) -> Path:
        dest = folder / f"resume-{name}"
        download(store, name, dest)
        return dest / FILE

    found = newest_of_kind(store, KIND, os.environ.get("SPOTRUN_RESUME_CHECKPOINT") or None, fetch)
    return str(found[1]) if found else None


__all__ = ["KIND", "EpochSampler", "ResumableDataLoader", "SpotrunCallback", "ckpt_path"]

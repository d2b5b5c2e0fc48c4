"""A resumable shuffling sampler: its data position is part of the checkpoint."""

from __future__ import annotations

import sys
import warnings
from typing import Any, Iterator

import torch
from torch.utils.data import Sampler
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter


class InexactResumeWarning(UserWarning):
    """A resume from this state will not replay the uninterrupted run bitwise."""


class StatefulSampler(Sampler[int]):
    """Shuffles with a per-epoch seed and remembers (epoch, position) for an exact resume.

    The position counts indices handed out, which equals indices consumed only with
    `num_workers=0`: worker processes are handed indices ahead of the loop (prefetch). Under a
    loader with workers it warns once (`multi_worker` turns True); use
    `spotrun.torch.ResumableDataLoader` there, which counts consumed batches.
    """

    def __init__(self, length: int, *, seed: int = 0, shuffle: bool = True) -> None:
        self.length = length
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self.multi_worker = False   # seen handing indices to a loader with worker processes

    def __len__(self) -> int:
        return self.length

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.length))
        # Own generator: the data order never depends on the global RNG.
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.length, generator=g).tolist()

    def _check_caller(self) -> None:
        # Once an epoch, a few frames: the stock iterator that asks for indices is a caller
        # (through a BatchSampler, if any) of this generator's first next().
        frame = sys._getframe(2)
        for _ in range(4):
            if frame is None:
                return
            if isinstance(frame.f_locals.get("self"), _MultiProcessingDataLoaderIter):
                if not self.multi_worker:
                    self.multi_worker = True
                    warnings.warn("StatefulSampler under a DataLoader with num_workers > 0: it "
                                  "counts indices handed to the workers ahead of the loop, so a "
                                  "resume skips batches never trained on. Use "
                                  "spotrun.torch.ResumableDataLoader", InexactResumeWarning,
                                  stacklevel=2)
                return
            frame = frame.f_back

    def __iter__(self) -> Iterator[int]:
        self._check_caller()
        order = self._order()
        while self.position < self.length:
            i = order[self.position]
            self.position += 1
            yield i
        self.epoch += 1
        self.position = 0

    def state_dict(self) -> dict[str, Any]:
        """Epoch and position within it."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "length": self.length}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position."""
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])

"""A resumable shuffling sampler: its data position is part of the checkpoint."""

from __future__ import annotations

from typing import Any, Iterator

import torch
from torch.utils.data import Sampler


class StatefulSampler(Sampler[int]):
    """Shuffles with a per-epoch seed and remembers (epoch, position) for an exact resume.

    The position counts indices handed out, which equals indices consumed with
    `num_workers=0`; loaders that prefetch should bring their own state_dict
    (e.g. torchdata's StatefulDataLoader) and pass it to the Checkpointer as an extra.
    """

    def __init__(self, length: int, *, seed: int = 0, shuffle: bool = True) -> None:
        self.length = length
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0

    def __len__(self) -> int:
        return self.length

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.length))
        # Own generator: the data order never depends on the global RNG.
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.length, generator=g).tolist()

    def __iter__(self) -> Iterator[int]:
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

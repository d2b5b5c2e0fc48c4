"""Lightning's train loader that resumes mid-epoch: `spotrun.torch.ResumableDataLoader`.

Part of spotrun.integrations.lightning (which re-exports these names); torch only.
"""

from __future__ import annotations

from typing import Any

# One implementation for plain loops and Lightning: the callback sets `batches_done` (its
# loop fetches a batch ahead, so the loader cannot count what is finished) and
# `tail_on_resume`.
from spotrun.torch.loader import EpochSampler, ResumableDataLoader

__all__ = ["EpochSampler", "ResumableDataLoader"]


def _train_loaders(trainer: Any) -> list[ResumableDataLoader]:
    loaders = trainer.train_dataloader
    if isinstance(loaders, dict):
        loaders = list(loaders.values())
    elif not isinstance(loaders, (list, tuple)):
        loaders = [loaders]
    return [x for x in loaders if isinstance(x, ResumableDataLoader)]


# -- loop progress of a checkpoint -------------------------------------------------------
# Lightning restarts exactly from the points its own callbacks save at. The callback saves
# at two other points and writes their progress as the equivalent point Lightning knows.

"""Lightning's train loader that resumes mid-epoch: stock DataLoader order, recorded per epoch.

Part of spotrun.integrations.lightning (which re-exports these names); torch only.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader, Sampler


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
        # Set by the callback while it saves during the validation that ends an epoch: the
        # resume finishes that epoch (its first iteration is empty and draws nothing), and
        # the next epoch's iteration then draws as in the uninterrupted run.
        self.tail_on_resume = False
        self._empty_next = False

    def __iter__(self) -> Any:
        if self._empty_next:
            self._empty_next = False
            return iter(())
        return super().__iter__()

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
                "base_rng": self.base_rng,
                "tail": bool(self.tail_on_resume and self.batches_done >= len(self))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The next iteration replays the saved epoch after its finished batches."""
        self.sampler.epoch = int(state["epoch"])
        self.batches_done = int(state["batches_done"])
        if self.batches_done >= len(self):
            self.batches_done = 0   # the epoch was finished: the next one draws afresh
            self._empty_next = bool(state.get("tail"))
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


# -- loop progress of a checkpoint -------------------------------------------------------
# Lightning restarts exactly from the points its own callbacks save at. The callback saves
# at two other points and writes their progress as the equivalent point Lightning knows.

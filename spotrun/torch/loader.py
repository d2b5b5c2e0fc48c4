"""A drop-in DataLoader whose state_dict resumes an epoch exactly where the loop left it.

    loader = ResumableDataLoader(dataset, batch_size=64, shuffle=True, num_workers=4)
    ckpt = Checkpointer(model=model, optimizer=opt, extras={"train_loader": loader})

What an exact mid-epoch resume needs from the data side, and where each piece comes from:
- the epoch's order: drawn as the stock DataLoader draws it (torch's global RNG, or the
  `generator`), the draw recorded so the resume replays it instead of drawing again;
- the position: batches the loop has taken from the iterator (prefetched ones do not count);
- the workers' base seed: drawn when the iterator is created, as the stock loader does, replayed;
- each worker's python / numpy / torch RNG after the last batch the loop took from it: the
  wrapped collate_fn returns it with each batch, the wrapped worker_init_fn (the user's first)
  restores it in the resumed workers.
The resumed epoch hands its batches to the workers in the same round-robin slots as the
interrupted one (batch i to worker i % num_workers), so each worker id sees the same stream.
What cannot be replayed is warned about (`InexactResumeWarning`; `warn_inexact` checks the
extras). Relies on the DataLoader iterator internals of the pinned torch version.
"""

from __future__ import annotations

import itertools
import random
import warnings
import weakref
import zlib
from collections import deque
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import torch
from torch.utils.data import (BatchSampler, DataLoader, IterableDataset, RandomSampler, Sampler,
                              SubsetRandomSampler, WeightedRandomSampler)
from torch.utils.data._utils.pin_memory import pin_memory as _pin
from torch.utils.data.dataloader import (_MultiProcessingDataLoaderIter,
                                         _SingleProcessDataLoaderIter)

from spotrun.errors import ConfigError
from spotrun.torch.rng import get_rng_state, set_rng_state
from spotrun.torch.sampler import InexactResumeWarning, StatefulSampler

_RANDOM_SAMPLERS = (RandomSampler, SubsetRandomSampler, WeightedRandomSampler)


# -- run inside the worker processes -------------------------------------------------------

def _worker_rng() -> tuple[Any, ...]:
    # numpy arrays travel inline with the batch (tensors would go through shared memory).
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return (random.getstate(), kind, keys.astype(np.int64), int(pos), int(has_gauss),
            float(gauss), torch.get_rng_state().numpy())


def _as_state(raw: tuple[Any, ...]) -> dict[str, Any]:
    """A worker's states as tensors and plain values (Lightning loads with weights_only=True)."""
    python, kind, keys, pos, has_gauss, gauss, state = raw
    return {"python": python, "numpy": [kind, torch.from_numpy(keys), pos, has_gauss, gauss],
            "torch": torch.from_numpy(state)}


def _set_worker_rng(state: Mapping[str, Any]) -> None:
    python = state["python"]
    random.setstate((python[0], tuple(python[1]), python[2]))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"].clone())


class _Tagged:
    """A batch with its worker's RNG states after making it (stripped before the loop sees it)."""

    __slots__ = ("batch", "rng")

    def __init__(self, batch: Any, rng: tuple[Any, ...]) -> None:
        self.batch, self.rng = batch, rng

    def pin_memory(self) -> "_Tagged":
        """Pin the batch (the loader's pin-memory thread calls this); the states stay as they are."""
        return _Tagged(_pin(self.batch), self.rng)


class _TaggingCollate:
    """The loader's collate_fn, then the worker's RNG states (after the batch's draws)."""

    def __init__(self, collate_fn: Callable[[Any], Any]) -> None:
        self.collate_fn = collate_fn

    def __call__(self, samples: Any) -> _Tagged:
        """The collated batch, tagged."""
        return _Tagged(self.collate_fn(samples), _worker_rng())


class _WorkerStart:
    """The user's worker_init_fn, then the RNG states the interrupted run's worker ended with."""

    def __init__(self, init_fn: Callable[[int], None] | None, states: list[Any]) -> None:
        self.init_fn, self.states = init_fn, states

    def __call__(self, worker_id: int) -> None:
        """Run in each new worker."""
        if self.init_fn is not None:
            self.init_fn(worker_id)
        if worker_id < len(self.states) and self.states[worker_id] is not None:
            _set_worker_rng(self.states[worker_id])


# -- the main process ----------------------------------------------------------------------

class EpochSampler(Sampler[int]):
    """The stock `RandomSampler` / `SequentialSampler` order, each epoch's seed recorded.

    Without a generator it draws the seed at the first next() from torch's global generator as
    `RandomSampler(generator=None)` does (or reuses `replay_seed`); with one it draws from it as
    RandomSampler does, a second permutation at the end included.
    """

    def __init__(self, length: int, *, shuffle: bool = True,
                 generator: torch.Generator | None = None) -> None:
        self.length, self.shuffle, self.generator = length, shuffle, generator
        self.epoch = 0
        self.seed: int | None = None          # drawn for the current epoch (global mode)
        self.replay_seed: int | None = None

    def set_epoch(self, epoch: int) -> None:
        """Lightning calls this at each epoch start (the order does not depend on it)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[int]:
        # A generator function like RandomSampler.__iter__: the seed is drawn at the first
        # next(), not at iter(), so the global random stream sees the same draw order.
        if not self.shuffle:
            yield from range(self.length)
            return
        replay, self.replay_seed = self.replay_seed, None
        if self.generator is None:
            seed = replay if replay is not None else int(
                torch.empty((), dtype=torch.int64).random_().item())
            self.seed = seed
            g = torch.Generator()
            g.manual_seed(seed)
        else:
            g = self.generator
        yield from torch.randperm(self.length, generator=g).tolist()
        if self.generator is not None:
            # RandomSampler draws one more permutation when asked past the end; a generator
            # shared with the user must see it too.
            torch.randperm(self.length, generator=g)


class _Positioned:
    """The loader's index sampler, started `skip` batches into the epoch.

    It fingerprints the order (a CRC chained over each batch's indices) so a resume can check
    that the batches it skips are the ones the interrupted run consumed, and records (and
    replays) the state of the generator the order is drawn from at the epoch's start.
    """

    def __init__(self, inner: Any, order_generator: torch.Generator | None, window: int) -> None:
        self.inner, self.order_generator = inner, order_generator
        self.skip = 0
        self.expect: int | None = None                  # fingerprint of the batches to skip
        self.replay_state: torch.Tensor | None = None
        self.start_state: torch.Tensor | None = None    # order generator at the epoch's start
        self.loaded: tuple[int, int | None] = (0, 0)    # (position, fingerprint) of a load
        self.warned = False
        self._crcs: deque[tuple[int, int]] = deque(maxlen=window)

    def __len__(self) -> int:
        return len(self.inner)

    def crc_at(self, position: int) -> int | None:
        """The fingerprint of the epoch's first `position` batches (None: no longer known)."""
        for n, crc in reversed(self._crcs):
            if n == position:
                return crc
        return self.loaded[1] if self.loaded[0] == position else None

    def drain(self) -> None:
        """Run the saved epoch's order to its end: its generator ends where the epoch left it."""
        if self.order_generator is not None and self.start_state is not None:
            self.order_generator.set_state(self.start_state)
            for _ in self.inner:
                pass

    def _mismatch(self) -> None:
        if not self.warned:
            self.warned = True
            warnings.warn("ResumableDataLoader: the batches skipped by this resume are not the "
                          "ones the interrupted run consumed: the sampler's order is not "
                          "reproducible. Seed it, and call its set_epoch(epoch) before each "
                          "epoch, the resumed one included", InexactResumeWarning, stacklevel=2)

    def __iter__(self) -> Iterator[Any]:
        skip, self.skip = self.skip, 0
        expect, self.expect = self.expect, None
        replay, self.replay_state = self.replay_state, None
        gen = self.order_generator
        if gen is not None:
            if replay is not None:
                gen.set_state(replay)
            self.start_state = gen.get_state()
        self._crcs.clear()
        n, crc = 0, 0
        for batch in self.inner:
            n += 1
            crc = zlib.crc32(repr(batch).encode(), crc)
            self._crcs.append((n, crc))
            if n == skip and expect is not None and crc != expect:
                self._mismatch()
            if n > skip:
                yield batch
        if n < skip and expect is not None:
            self._mismatch()


class _SingleIter(_SingleProcessDataLoaderIter):
    """The stock single-process iterator, counting the batches it hands out."""

    def __init__(self, loader: "ResumableDataLoader") -> None:
        self._owner = loader
        super().__init__(loader)

    def _next_data(self) -> Any:
        data = super()._next_data()
        self._owner._pos += 1
        return data


class _MultiIter(_MultiProcessingDataLoaderIter):
    """The stock worker iterator: round-robin from the resumed batch's worker, batches untagged."""

    def __init__(self, loader: "ResumableDataLoader") -> None:
        # Weak: a persistent iterator is the loader's, and a cycle would keep both (and the
        # workers) alive until a garbage collection, which may then run in a forked child.
        self._owner = weakref.proxy(loader)
        super().__init__(loader)

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        # The stock _reset primes the workers round-robin from worker 0; prime them only after
        # the cycle starts at the worker the interrupted run gave the first resumed batch to.
        prefetch, self._prefetch_factor = self._prefetch_factor, 0
        try:
            super()._reset(loader, first_iter)
        finally:
            self._prefetch_factor = prefetch
        self._worker_queue_idx_cycle = itertools.islice(
            itertools.cycle(range(self._num_workers)), loader._first_worker, None)
        for _ in range(prefetch * self._num_workers):
            self._try_put_index()

    def _process_data(self, data: Any, worker_idx: int) -> Any:
        data = super()._process_data(data, worker_idx)
        try:
            return self._owner._took(data, worker_idx)
        except ReferenceError:   # the loader is gone: a one-off next(iter(loader))
            return data.batch


def _order_sampler(loader: DataLoader) -> Any:
    """The sampler that decides the order (inside a stock BatchSampler, if any)."""
    batch_sampler = loader.batch_sampler
    if isinstance(batch_sampler, BatchSampler):
        return batch_sampler.sampler
    return loader.sampler if batch_sampler is None else batch_sampler


class ResumableDataLoader(DataLoader):
    """`torch.utils.data.DataLoader` (same arguments, same batches) whose state resumes mid-epoch.

    Put it in the Checkpointer's `extras` (its state_dict is cheap: taken at every step); after
    load_state_dict the next iteration continues with the first batch the loop had not taken,
    bitwise as the uninterrupted run, or starts the next epoch if that one was done.
    `seed=N` is short for `generator=torch.Generator().manual_seed(N)`. With a `sampler=` of
    your own, call its `set_epoch(epoch)` before each epoch (the resumed one too); a resume
    checks that the batches it skips are the ones consumed and warns if not.
    """

    _positioned: _Positioned | None = None

    def __init__(self, dataset: Any, batch_size: int | None = 1, shuffle: bool | None = None,
                 sampler: Any = None, batch_sampler: Any = None, num_workers: int = 0,
                 collate_fn: Callable[[Any], Any] | None = None, pin_memory: bool = False,
                 drop_last: bool = False, timeout: float = 0,
                 worker_init_fn: Callable[[int], None] | None = None,
                 multiprocessing_context: Any = None, generator: torch.Generator | None = None,
                 *, prefetch_factor: int | None = None, persistent_workers: bool = False,
                 pin_memory_device: str = "", in_order: bool = True,
                 seed: int | None = None) -> None:
        if seed is not None:
            if generator is not None:
                raise ConfigError("give seed or generator, not both", field="seed", value=seed,
                                  hint="seed=N is generator=torch.Generator().manual_seed(N)")
            generator = torch.Generator().manual_seed(seed)
        self._iterable = isinstance(dataset, IterableDataset)
        if not self._iterable and sampler is None and batch_sampler is None:
            sampler = EpochSampler(len(dataset), shuffle=bool(shuffle), generator=generator)
            shuffle = None
        super().__init__(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers,
                         collate_fn, pin_memory, drop_last, timeout, worker_init_fn,
                         multiprocessing_context, generator, prefetch_factor=prefetch_factor,
                         persistent_workers=persistent_workers,
                         pin_memory_device=pin_memory_device, in_order=in_order)
        self.epoch = 0                  # the epoch the last iteration belonged to
        self.base_rng: torch.Tensor | None = None    # the state this epoch's base seed came from
        self._replay_base: torch.Tensor | None = None
        self._started = False
        self._pending: int | None = None   # a loaded position the next iteration continues at
        self._pos = 0                      # batches of the epoch handed to the loop
        self._discard = 0
        self._first_worker = 0
        self._epoch_len: int | None = None
        # Lightning's callback sets batches_done itself (its loop fetches a batch ahead).
        self._external = False
        self._done = 0
        window = 4 * num_workers * int(self.prefetch_factor or 1) + 16
        self._records: deque[tuple[int, int, Any]] = deque(maxlen=window)  # (batch, worker, rng)
        self._settled: list[Any] = [None] * num_workers   # worker RNG older than the records
        self._warned: set[str] = set()
        # Set by the Lightning callback while it saves during the validation that ends an
        # epoch: the resume finishes that epoch (its first iteration is empty and draws
        # nothing), and the next epoch's iteration then draws as in the uninterrupted run.
        self.tail_on_resume = False
        self._empty_next = False
        order = _order_sampler(self)
        self._positioned = _Positioned(
            super()._index_sampler,
            order.generator if isinstance(order, (EpochSampler, *_RANDOM_SAMPLERS)) else None,
            window)

    @property
    def _index_sampler(self) -> Any:
        # The stock iterator takes its indices here: the positioned wrapper skips and checks.
        return self._positioned if self._positioned is not None else super()._index_sampler

    @property
    def batches_done(self) -> int:
        """Batches of the current epoch the loop has taken (under Lightning: finished)."""
        return self._done if self._external else self._pos

    @batches_done.setter
    def batches_done(self, value: int) -> None:
        self._external = True
        self._done = int(value)

    def inexact_reasons(self) -> list[str]:
        """Why a resume of this loader may not replay the interrupted run bitwise (empty: it will)."""
        out = []
        if self._iterable:
            out.append("an IterableDataset has no index to skip to: a mid-epoch resume re-reads "
                       "and drops the batches already consumed, exact only if the dataset yields "
                       "the same items each time and draws only from its worker's seeded "
                       "generators (with persistent_workers, not even then); prefer a map-style "
                       "Dataset")
        order = _order_sampler(self)
        if isinstance(order, _RANDOM_SAMPLERS) and order.generator is None:
            out.append(f"{type(order).__name__} without a generator draws its order from "
                       "torch's global RNG, which a resume cannot replay: give it "
                       "generator=torch.Generator().manual_seed(N), or use shuffle=True (the "
                       "loader replays that draw)")
        if isinstance(order, StatefulSampler):
            out.append("a StatefulSampler keeps a position of its own, which the loader would "
                       "skip a second time: use shuffle=True, seed=N instead")
        if self.num_workers > 0 and not self.in_order:
            out.append("in_order=False hands batches out as workers finish them, so which "
                       "batch came from which worker depends on timing: use in_order=True")
        return out

    def _warn(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            warnings.warn(f"ResumableDataLoader: {message}", InexactResumeWarning, stacklevel=3)

    def _length(self) -> int | None:
        if self._iterable:
            return None   # len() of an IterableDataset loader is a guess
        try:
            return len(self)
        except TypeError:
            return None

    def _worker_states(self, position: int) -> list[Any]:
        states = list(self._settled)
        for batch, worker, rng in self._records:
            if batch < position:
                states[worker] = rng
        return states

    def _took(self, tagged: _Tagged, worker: int) -> Any:
        """A batch goes to the loop: the position moves on, its worker's states are kept."""
        if len(self._records) == self._records.maxlen:
            _, old_worker, old_rng = self._records[0]
            self._settled[old_worker] = old_rng
        self._records.append((self._pos, worker, _as_state(tagged.rng)))
        self._pos += 1
        return tagged.batch

    def _begin(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:   # a new epoch
            if self._started:
                self.epoch += 1
            pending = self._done = 0
            self._positioned.loaded = (0, 0)   # type: ignore[union-attr]
            if not self.persistent_workers:   # new workers, seeded afresh
                self._records.clear()
                self._settled = [None] * self.num_workers
        self._started = True
        self._epoch_len = self._length()
        if self._iterable:
            self._discard, self._pos, self._first_worker = pending, 0, 0
        else:
            self._positioned.skip = self._pos = pending   # type: ignore[union-attr]
            self._first_worker = pending % self.num_workers if self.num_workers else 0

    def __iter__(self) -> Any:
        if self._empty_next:
            self._empty_next = False
            return iter(())
        for reason in self.inexact_reasons():
            self._warn(reason)
        self._begin()
        it = super().__iter__()
        discard, self._discard = self._discard, 0
        if discard:
            # Re-read what the loop consumed; the dataset's draws must not move the loop's RNG.
            rng = get_rng_state()
            for _ in zip(range(discard), it):
                pass
            set_rng_state(rng)
        return it

    def _get_iterator(self) -> Any:
        source, replay = self.generator, self._replay_base
        self._replay_base = None
        if replay is None:
            self.base_rng = torch.get_rng_state() if source is None else source.get_state()
        else:
            # The interrupted run drew this iterator's base seed already: draw it again from a
            # copy, so neither the global RNG nor the loader's generator moves a second time.
            self.base_rng = replay
            self.generator = torch.Generator()
            self.generator.set_state(replay)
        try:
            if self.num_workers == 0:
                return _SingleIter(self)
            self.check_worker_number_rationality()
            collate, init = self.collate_fn, self.worker_init_fn
            states = [] if self._iterable else self._worker_states(self._pos)
            self.collate_fn, self.worker_init_fn = _TaggingCollate(collate), _WorkerStart(init, states)
            try:
                return _MultiIter(self)
            finally:
                self.collate_fn, self.worker_init_fn = collate, init
        finally:
            self.generator = source

    def state_dict(self) -> dict[str, Any]:
        """Epoch, batches consumed in it, what it drew, each worker's RNG (cheap: every step)."""
        done = self.batches_done
        finished = self._epoch_len is not None and done >= self._epoch_len
        positioned: Any = self._positioned
        return {"epoch": self.epoch, "batches_done": done, "epoch_len": self._epoch_len,
                "started": self._started, "external": self._external,
                "seed": self.sampler.seed if isinstance(self.sampler, EpochSampler) else None,
                "generator_state": positioned.start_state,
                "generators": [] if self.generator is None else [self.generator.get_state()],
                "base_rng": self.base_rng,
                "num_workers": self.num_workers,
                "workers": self._worker_states(done) if self.num_workers else [],
                "fingerprint": positioned.crc_at(done),
                "tail": bool(self.tail_on_resume and finished)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """The next iteration continues the saved epoch after its consumed batches (or the next)."""
        positioned: Any = self._positioned
        done = int(state.get("batches_done", 0))
        self.epoch = int(state.get("epoch", 0))
        self._external = bool(state.get("external", "workers" not in state))  # older: Lightning's
        self._done = self._pos = done
        # As saved: a resume at an epoch's end iterates nothing first, which sets no length,
        # and a save before the next epoch must still say the epoch was finished (its tail).
        self._epoch_len = state.get("epoch_len")
        self._started = bool(state.get("started", True))
        self._pending, self._empty_next = None, False
        self.base_rng = state.get("base_rng")
        for gen, saved in zip([] if self.generator is None else [self.generator],
                              state.get("generators") or []):
            gen.set_state(saved)
        workers = list(state.get("workers") or [])
        if workers and len(workers) != self.num_workers:
            self._warn(f"saved with num_workers={len(workers)}, resumed with "
                       f"{self.num_workers}: the workers' random draws are not replayed")
            workers = []
        self._records.clear()
        self._settled = (workers + [None] * self.num_workers)[:self.num_workers]
        length = self._length()
        if state.get("epoch_len") is not None and length is not None and state["epoch_len"] != length:
            self._warn(f"the epoch had {state['epoch_len']} batches when saved and has {length} "
                       "now (another dataset, batch_size or drop_last): the position is not exact")
        positioned.start_state = state.get("generator_state")
        positioned.loaded = (done, state.get("fingerprint"))
        if isinstance(self.sampler, EpochSampler):
            self.sampler.seed = state.get("seed")
        if not self._started:
            return
        if length is not None and done >= length:   # the epoch was finished
            self._empty_next = bool(state.get("tail"))
            positioned.drain()
            if self.persistent_workers:
                # Its workers (and their base seed) live on into the next epoch.
                self._replay_base = self.base_rng
            return
        self._pending = done
        self._replay_base = self.base_rng
        positioned.replay_state = positioned.start_state
        positioned.expect = state.get("fingerprint")
        if isinstance(self.sampler, EpochSampler):
            self.sampler.replay_seed = state.get("seed")


def warn_inexact(extras: Mapping[str, Any]) -> list[str]:
    """Warn about data-loading state in a Checkpointer's extras that a resume cannot replay."""
    found: list[str] = []
    loaders = [v for v in extras.values() if isinstance(v, DataLoader)]
    for name, value in extras.items():
        where = f"extras[{name!r}]"
        if isinstance(value, ResumableDataLoader):
            for reason in value.inexact_reasons():
                found.append(f"{where}: {reason}")
                value._warn(reason)
            continue
        message = ""
        if isinstance(value, DataLoader):
            lost = " and its workers' random state" if value.num_workers else ""
            message = (f"{where} is a torch DataLoader, which has no state_dict: its position in "
                       f"the epoch{lost} is not saved, so a resume starts the epoch over. Use "
                       "spotrun.torch.ResumableDataLoader (the same arguments)")
        elif isinstance(value, StatefulSampler):
            users = [x for x in loaders if _order_sampler(x) is value]
            if any(isinstance(x, ResumableDataLoader) for x in users):
                message = (f"{where}: this StatefulSampler belongs to a ResumableDataLoader, "
                           "which keeps the position itself: put only the loader in extras")
            elif value.multi_worker or any(x.num_workers > 0 for x in users):
                message = (f"{where}: StatefulSampler counts indices handed out, and a loader "
                           "with num_workers > 0 takes them ahead of the loop, so a resume skips "
                           "batches never trained on and the workers' random draws differ. Use "
                           "spotrun.torch.ResumableDataLoader")
        if message:
            found.append(message)
            warnings.warn(message, InexactResumeWarning, stacklevel=2)
    return found

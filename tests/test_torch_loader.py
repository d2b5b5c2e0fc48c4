"""ResumableDataLoader in a plain loop: a resume continues bitwise as the uninterrupted run.

Real DataLoader worker processes (fork), random augmentation drawn from torch's, python's
and numpy's global RNG inside `__getitem__`. Each resume builds a fresh dataset and loader in
this process, as a new attempt would, and loads the state taken after k batches (with the
global RNG, as the Checkpointer saves it); the state is serialized only after the first run
went on, as a background save would.
"""

from __future__ import annotations

import io
import pickle
import random
import warnings
from pathlib import Path
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from torch.utils.data import (DataLoader, Dataset, DistributedSampler,  # noqa: E402
                              IterableDataset, RandomSampler)

from spotrun.errors import ConfigError  # noqa: E402
from spotrun.store.file import FileStore  # noqa: E402
from spotrun.torch import (Checkpointer, ResumableDataLoader, RuntimeOptions,  # noqa: E402
                           StatefulSampler)
from spotrun.torch.loader import InexactResumeWarning, warn_inexact  # noqa: E402
from spotrun.torch.rng import get_rng_state, set_rng_state  # noqa: E402


class Augmented(Dataset):
    """CIFAR-like: a random crop (torch.randint), a flip (torch.rand), python and numpy jitter."""

    def __init__(self, n: int = 42) -> None:
        g = torch.Generator().manual_seed(7)
        self.images = torch.randn(n, 3, 10, 10, generator=g)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        top, left = (int(v) for v in torch.randint(0, 3, (2,)))
        x = self.images[i, :, top:top + 8, left:left + 8]
        if torch.rand(()) < 0.5:
            x = x.flip(2)
        x = x * (0.9 + 0.2 * random.random()) + float(np.random.normal(0, 0.01))
        return x, i % 2


@pytest.fixture(autouse=True)
def _one_thread() -> Any:
    """One intra-op thread: the main process shares 2 cores with its workers and other tests."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _seed_all() -> None:
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)


def _loop(make: Callable[[], Any], total: int, *, at: tuple[int, ...] = (),
          resume: dict | None = None, set_epoch: bool = False) -> tuple[list, list]:
    """The plain loop a user writes: what each batch and each step drew, and the states at `at`."""
    _seed_all()                                 # every attempt seeds at start, as a script does
    loader = make()
    per_epoch, done = len(loader), 0
    if resume is not None:                      # what Checkpointer.restore() does
        set_rng_state(resume["rng"])
        loader.load_state_dict(resume["loader"])
        done = resume["done"]
    seen, states = [], []
    while done < total:
        if set_epoch:
            loader.sampler.set_epoch(done // per_epoch)
        for x, y in loader:
            done += 1
            if isinstance(loader, ResumableDataLoader):
                assert loader.epoch == (done - 1) // per_epoch
            seen.append((x, y, torch.rand(3)))   # the step's own draws (dropout, say)
            if done in at:
                states.append({"rng": get_rng_state(), "loader": loader.state_dict(), "done": done})
            if done == total:
                break
    return seen, [_saved_and_loaded(s) for s in states]


def _saved_and_loaded(state: dict) -> dict:
    """Through torch.save and a weights_only load, as Lightning reads its checkpoints."""
    buffer = io.BytesIO()
    torch.save(state["loader"], buffer)
    buffer.seek(0)
    return {**pickle.loads(pickle.dumps(state)),
            "loader": torch.load(buffer, weights_only=True)}


def _assert_same(got: list, want: list) -> None:
    assert len(got) == len(want)
    differ = [i for i, (a, b) in enumerate(zip(got, want))
              if not all(torch.equal(p, q) for p, q in zip(a, b))]
    assert not differ, f"batches {differ} of {len(want)} differ"


CASES = {
    "no-workers": dict(shuffle=True),
    "workers-global-rng": dict(shuffle=True, num_workers=2),
    "workers-seed-drop-last": dict(shuffle=True, num_workers=2, seed=3, drop_last=True),
    "workers-persistent": dict(shuffle=True, num_workers=2, persistent_workers=True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_resume_mid_epoch_at_epoch_end_and_in_the_second_epoch_is_bitwise(case: str):
    """k = 3 (mid-epoch, odd: the round-robin is rotated), the epoch's end, the second epoch."""
    def make():
        return ResumableDataLoader(Augmented(), batch_size=4, **CASES[case])
    per_epoch = len(make())
    at = (3, per_epoch, per_epoch + 5)
    total = 2 * per_epoch
    ref, states = _loop(make, total, at=at)
    for state in states:
        tail, _ = _loop(make, total, resume=state)
        _assert_same(tail, ref[state["done"]:])


def test_user_sampler_with_set_epoch_resumes_in_its_epoch():
    """DistributedSampler(num_replicas=1), set_epoch(epoch) by the loop: the rest of that order."""
    def make():
        ds = Augmented()
        return ResumableDataLoader(ds, batch_size=4, num_workers=2, sampler=DistributedSampler(
            ds, num_replicas=1, rank=0, shuffle=True, seed=5))
    total = 2 * len(make())
    ref, states = _loop(make, total, at=(total - 5,), set_epoch=True)
    tail, _ = _loop(make, total, resume=states[0], set_epoch=True)
    _assert_same(tail, ref[total - 5:])


@pytest.mark.parametrize("workers", [0, 2])
def test_adding_spotrun_changes_nothing(workers: int):
    """The stock DataLoader and ResumableDataLoader, same arguments: the same batches and draws."""
    kw: dict[str, Any] = dict(batch_size=4, shuffle=True, num_workers=workers)
    if not workers:
        kw["generator"] = torch.Generator().manual_seed(9)   # a shared generator sees the same draws
    stock, _ = _loop(lambda: DataLoader(Augmented(), **kw), 25)
    if not workers:
        kw["generator"] = torch.Generator().manual_seed(9)
    spot, _ = _loop(lambda: ResumableDataLoader(Augmented(), **kw), 25)
    _assert_same(spot, stock)


class Net(torch.nn.Module):
    """A BatchNorm conv net: its running statistics are state a resume must keep exact too."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                                        torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                        torch.nn.Flatten(), torch.nn.Dropout(0.2),
                                        torch.nn.Linear(4, 2))

    def forward(self, x: Any) -> Any:
        return self.body(x)


def _train(root: Path, total_steps: int, stop_at: int | None = None) -> dict:
    """docs/checkpointing.md's plain loop: workers, augmentation, 2 micro-batches a step."""
    _seed_all()
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = ResumableDataLoader(Augmented(40), batch_size=4, shuffle=True, num_workers=2)
    ckpt = Checkpointer(model=model, optimizer=opt, extras={"train_loader": loader},
                        store=FileStore(root), interval_s=1e9, every_steps=stop_at,
                        runtime=RuntimeOptions(env={}, install_signal=False))
    step = ckpt.restore()
    accum = 2
    while step < total_steps:
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y) / accum
            loss.backward()
            if loader.batches_done % accum == 0:
                opt.step()
                opt.zero_grad()
                step += 1
                ckpt.step(step)
                if step in (total_steps, stop_at):
                    break
        if step == stop_at:
            ckpt.wait()
            ckpt.close()
            return {}
    ckpt.finish(step)
    ckpt.close()
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_checkpointer_resume_with_gradient_accumulation_is_bitwise(tmp_path: Path):
    """Checkpoint at step 7 (14 batches: mid second epoch); a fresh attempt ends bitwise equal."""
    want = _train(tmp_path / "plain", 12)
    assert _train(tmp_path / "spot", 12, stop_at=7) == {}
    got = _train(tmp_path / "spot", 12)
    assert [k for k in want if not torch.equal(want[k], got[k])] == []


class Stream(IterableDataset):
    """An IterableDataset drawing from the global RNG (no index to skip to)."""

    def __len__(self) -> int:
        return 20

    def __iter__(self) -> Any:
        for i in range(20):
            yield torch.full((2,), float(i)) + torch.rand(2), i


def test_iterable_dataset_resume_rereads_the_consumed_batches_and_warns():
    """No index to skip to: the consumed batches are read again and dropped, with a warning."""
    def make():
        return ResumableDataLoader(Stream(), batch_size=4)
    with pytest.warns(InexactResumeWarning, match="IterableDataset has no index"):
        ref, states = _loop(make, 5, at=(2,))
    with pytest.warns(InexactResumeWarning, match="IterableDataset has no index"):
        tail, _ = _loop(make, 5, resume=states[0])
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(tail, ref[2:]))


def test_resume_warns_when_the_skipped_batches_are_not_the_consumed_ones():
    """The resumed loop forgets set_epoch: its epoch-0 order is not what epoch 1 consumed."""
    def make():
        ds = Augmented()
        return ResumableDataLoader(ds, batch_size=4, sampler=DistributedSampler(
            ds, num_replicas=1, rank=0, shuffle=True, seed=5))
    per_epoch = len(make())
    _, states = _loop(make, per_epoch + 4, at=(per_epoch + 3,), set_epoch=True)
    with pytest.warns(InexactResumeWarning, match="not the ones the interrupted run consumed"):
        _loop(make, per_epoch + 4, resume=states[0])


def test_warn_inexact_names_what_a_resume_cannot_replay():
    """What restore() reports about extras: one line each, what to do instead."""
    ds = Augmented()
    stock = DataLoader(ds, batch_size=4, shuffle=True, num_workers=2)
    sampler = StatefulSampler(len(ds))
    counted = DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2)
    unseeded = ResumableDataLoader(ds, batch_size=4, sampler=RandomSampler(ds))
    stream = ResumableDataLoader(Stream(), batch_size=4, num_workers=2)
    extras = {"stock": stock, "sampler": sampler, "counted": counted, "unseeded": unseeded,
              "stream": stream, "good": ResumableDataLoader(ds, batch_size=4, shuffle=True,
                                                            num_workers=2), "lr": 0.1}
    with pytest.warns(InexactResumeWarning) as caught:
        found = warn_inexact(extras)
    assert len(found) == len(caught) == 5
    said = "\n".join(found)
    for expected in ("extras['stock'] is a torch DataLoader", "ResumableDataLoader (the same",
                     "extras['sampler']: StatefulSampler counts indices handed out",
                     "extras['counted'] is a torch DataLoader",
                     "extras['unseeded']: RandomSampler without a generator",
                     "generator=torch.Generator().manual_seed(N)",
                     "extras['stream']: an IterableDataset has no index"):
        assert expected in said
    assert "'good'" not in said
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # warned once: not again when it iterates
        next(iter(unseeded))


def test_stateful_sampler_warns_under_worker_processes():
    """It counts indices handed out: right without workers, wrong (and said) with them."""
    ds = Augmented(8)
    quiet = StatefulSampler(len(ds))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        next(iter(DataLoader(ds, batch_size=4, sampler=quiet)))
    assert not quiet.multi_worker
    sampler = StatefulSampler(len(ds))
    with pytest.warns(InexactResumeWarning, match="num_workers > 0"):
        next(iter(DataLoader(ds, batch_size=4, sampler=sampler, num_workers=1)))
    assert sampler.multi_worker


def test_seed_and_generator_together_is_bad_input():
    """seed=N is a generator: both at once is a ConfigError naming the field."""
    with pytest.raises(ConfigError) as err:
        ResumableDataLoader(Augmented(), seed=1, generator=torch.Generator())
    assert err.value.field == "seed"

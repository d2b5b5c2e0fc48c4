"""Progress of long transfers: a rich bar on a terminal, else a log line every few seconds.

Nothing shows for a transfer that ends within `after_s`. Callbacks may come from several
threads at once (TransferManager's parts, a restore's parallel shard reads).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import structlog

from spotrun.store.base import ObjectStore, ProgressFn, StoreFeature

log = structlog.get_logger("spotrun.transfer")
AFTER_S = 2.0    # a transfer shorter than this shows nothing
EVERY_S = 5.0    # off a terminal: at most one progress line this often


def transfer_bar(console: Any) -> Any:
    """The rich bar every transfer shows on a terminal: name, bar, bytes, speed; gone when done."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn
    return Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                    TransferSpeedColumn(), console=console, transient=True)


@contextmanager
def one_bar(console: Any, label: str, *, show: bool) -> Iterator[ProgressFn | None]:
    """A progress callback (bytes done, total) drawing one rich bar labelled `label` (None
    when not shown); the bar appears with the first bytes."""
    if not show:
        yield None
        return
    with transfer_bar(console) as bar:
        task: list[Any] = []

        def progress(done: int, total: int) -> None:
            if not task:
                task.append(bar.add_task(label, total=total or None))
            bar.update(task[0], completed=done, total=total or None)
        yield progress


class TransferProgress:
    """A ProgressFn `(bytes_done, bytes_total)` for one transfer; use it as a context manager."""

    def __init__(self, what: str, *, after_s: float = AFTER_S, every_s: float = EVERY_S,
                 console: Any = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.what = what
        self.after_s = after_s
        self.every_s = every_s
        self.clock = clock
        self.done = 0
        self.total = 0
        self._console = console
        self._t0 = clock()
        self._logged_at: float | None = None
        self._bar: Any = None
        self._task: Any = None
        self._lock = threading.Lock()

    def __call__(self, done: int, total: int) -> None:
        with self._lock:
            self.done, self.total = done, total
            now = self.clock()
            if now - self._t0 < self.after_s:
                return
            if self._terminal():
                self._draw(done, total)
            elif self._logged_at is None or now - self._logged_at >= self.every_s:
                self._logged_at = now
                log.info("transfer_progress", what=self.what, bytes_done=done,
                         bytes_total=total)

    def _terminal(self) -> bool:
        if self._console is None:
            from rich.console import Console   # rich only once a transfer is long
            self._console = Console(stderr=True)
        return bool(self._console.is_terminal)

    def _draw(self, done: int, total: int) -> None:
        if self._bar is None:
            self._bar = transfer_bar(self._console)
            self._bar.start()
            self._task = self._bar.add_task(self.what, total=total or None)
        self._bar.update(self._task, completed=done, total=total or None)

    def close(self) -> None:
        """Take the bar down (a finished transfer leaves no bar behind)."""
        with self._lock:
            if self._bar is not None:
                self._bar.stop()
                self._bar = None

    def __enter__(self) -> "TransferProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class ByteTally:
    """Per-object `(done, total)` callbacks summed into one ProgressFn over all the objects."""

    def __init__(self, progress: ProgressFn, total: int) -> None:
        self.progress = progress
        self.total = total
        self.done = 0
        self._by_key: dict[str, int] = {}
        self._lock = threading.Lock()

    def part(self, key: str) -> ProgressFn:
        """The callback for one object of the whole."""
        def update(done: int, _total: int) -> None:
            with self._lock:   # one at a time, so the whole only grows
                self.done += done - self._by_key.get(key, 0)
                self._by_key[key] = done
                self.progress(self.done, self.total)
        return update


@contextmanager
def network_progress(store: ObjectStore, what: str) -> Iterator[TransferProgress | None]:
    """A TransferProgress for a transfer over the network (s3://, gs://); None for a store
    that declares no NETWORK feature (a local copy is quick)."""
    if StoreFeature.NETWORK not in store.features:
        yield None
        return
    with TransferProgress(what) as progress:
        yield progress

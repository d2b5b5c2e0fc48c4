"""The one host buffer every save snapshots into, allocated once and reused.

A save copies the state here (pinned memory when training on CUDA, so the
device-to-host copies run at full speed) and the background persist reads from
it; training then keeps changing its own tensors while the bytes go out. It only
grows (when the state grows, e.g. optimizer state created after the first step).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch

from spotrun.errors import CheckpointError
from spotrun.torch.flatten import Plan, Slot, copy_into, plan

SLACK_BYTES = 1 << 20   # room for small growth (extras, RNG) without a second allocation


@dataclass
class Snapshot:
    """A state tree captured in the buffer: its structure, slots and byte view."""

    step: int
    structure: Any
    slots: list[Slot]
    nbytes: int
    data: memoryview          # the first nbytes of the buffer
    ready: threading.Event    # set once every deferred copy is done
    copy_error: BaseException | None = None

    def wait_ready(self) -> None:
        """Block until the buffer holds the whole state; raises if a deferred copy failed."""
        self.ready.wait()
        if self.copy_error is not None:
            raise CheckpointError(f"snapshot copy failed: {self.copy_error}", field="checkpoint",
                                  value=self.step) from self.copy_error

    def meta(self) -> dict[str, Any]:
        """JSON header stored next to the data file."""
        return {"step": self.step, "structure": self.structure,
                "slots": [s.to_json() for s in self.slots], "nbytes": self.nbytes}


class SnapshotBuffer:
    """A reusable uint8 host buffer; `allocations` counts how often it was (re)allocated."""

    def __init__(self, *, pin: bool | None = None) -> None:
        self.pin = torch.cuda.is_available() if pin is None else pin
        self.buf: torch.Tensor | None = None
        self.allocations = 0
        self._warming: threading.Thread | None = None

    @property
    def capacity(self) -> int:
        """Bytes currently allocated."""
        return 0 if self.buf is None else self.buf.numel()

    def _allocate(self, nbytes: int) -> None:
        # Drop the old buffer first so peak host memory stays at one copy.
        self.buf = None
        buf = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=self.pin)
        # Touch every page now: first-touch page faults cost more than the copy itself.
        buf.zero_()
        self.buf = buf
        self.allocations += 1

    @property
    def unprepared(self) -> bool:
        """True until a buffer exists or is being allocated."""
        return self.buf is None and self._warming is None

    def prepare(self, tree: Any) -> None:
        """Allocate (and fault in) the buffer for tree in a background thread, off the stall."""
        if self._warming is not None or self.buf is not None:
            return
        nbytes = plan(tree).nbytes + SLACK_BYTES
        self._warming = threading.Thread(target=self._allocate, args=(nbytes,),
                                         name="spotrun-snapshot-alloc", daemon=True)
        self._warming.start()

    def _ensure(self, nbytes: int) -> torch.Tensor:
        if self._warming is not None:
            self._warming.join()
        if self.buf is None or self.buf.numel() < nbytes:
            self._allocate(nbytes)
        assert self.buf is not None
        return self.buf

    def capture(self, step: int, tree: Any, deferrable: set[int] | None = None) -> Snapshot:
        """Copy tree into the buffer and describe it.

        Leaves whose data_ptr is in `deferrable` (CPU tensors that only the
        optimizer step changes) are copied by a background thread; the caller
        must wait on `snapshot.ready` before they can change. The rest is copied now.
        """
        p: Plan = plan(tree)
        buf = self._ensure(p.nbytes)
        later: list[int] = []
        now: list[int] = []
        for i, x in enumerate(p.leaves):
            defer = (deferrable is not None and isinstance(x, torch.Tensor)
                     and x.device.type == "cpu" and x.data_ptr() in deferrable)
            (later if defer else now).append(i)
        copy_into(p, buf, now)
        view = memoryview(buf.numpy()).cast("B")[:p.nbytes]
        snap = Snapshot(step=step, structure=p.structure, slots=p.slots, nbytes=p.nbytes,
                        data=view, ready=threading.Event())
        if not later:
            snap.ready.set()
            return snap

        def _copy_rest() -> None:
            try:
                copy_into(p, buf, later)
            except BaseException as exc:   # reported by wait_ready, never lost
                snap.copy_error = exc
            finally:
                snap.ready.set()
        threading.Thread(target=_copy_rest, name="spotrun-snapshot-copy", daemon=True).start()
        return snap

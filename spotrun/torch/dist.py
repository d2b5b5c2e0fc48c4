"""What changes under torchrun: who writes, per-rank RNG, and agreeing on when to save.

Unsharded (default): every rank holds the same model and optimizer (DDP), so
rank 0 alone snapshots and persists them; each rank's RNG state and extras are
gathered to rank 0 so every rank resumes its own stream. Save decisions are
all-reduced so all ranks save at the same step. Sharded state goes through
`torch.distributed.checkpoint` (see `spotrun.torch.sharded`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as tdist

log = logging.getLogger(__name__)
_PER_RANK = ("rng", "extras")


def _unwrap(obj: Any) -> Any:
    # DDP/FSDP-less wrappers keep the real module in .module; save it unprefixed
    # so a checkpoint loads with or without the wrapper.
    if isinstance(obj, torch.nn.parallel.DistributedDataParallel):
        return obj.module
    return obj


@dataclass
class DistContext:
    """The process's place in a torch.distributed job (world of 1 outside torchrun)."""

    rank: int = 0
    world_size: int = 1
    sharded: bool = False

    @classmethod
    def current(cls, *, sharded: bool = False) -> "DistContext":
        """Read the initialised process group, if any."""
        if tdist.is_available() and tdist.is_initialized():
            return cls(rank=tdist.get_rank(), world_size=tdist.get_world_size(), sharded=sharded)
        return cls(sharded=sharded)

    @property
    def distributed(self) -> bool:
        """True with more than one rank."""
        return self.world_size > 1

    @property
    def node_writer(self) -> bool:
        """The first local rank of a node (torchrun's LOCAL_RANK 0) writes that node's progress."""
        return self.distributed and os.environ.get("LOCAL_RANK", "0") == "0"

    def from_rank0(self, obj: Any) -> Any:
        """Rank 0's value of obj on every rank (a collective under torchrun)."""
        if not self.distributed:
            return obj
        box = [obj]
        tdist.broadcast_object_list(box, src=0)
        return box[0]

    @property
    def is_writer(self) -> bool:
        """Rank 0 writes unsharded checkpoints and the progress file."""
        return self.rank == 0

    def state_dict_of(self, key: str, obj: Any) -> Any:
        """obj's state dict (the model without its DDP wrapper)."""
        return _unwrap(obj).state_dict() if key == "model" else obj.state_dict()

    def load_state_dict_of(self, key: str, obj: Any, state: Any) -> None:
        """Load state into obj (the model without its DDP wrapper)."""
        (_unwrap(obj) if key == "model" else obj).load_state_dict(state)

    def any_flags(self, *flags: bool) -> tuple[bool, ...]:
        """Each flag true on every rank if true on any (one collective per call, every rank calls it)."""
        if not self.distributed:
            return tuple(flags)
        t = torch.tensor([1 if f else 0 for f in flags], dtype=torch.int32)
        tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
        return tuple(bool(v) for v in t.tolist())

    def gather_ranked(self, tree: dict[str, Any]) -> dict[str, Any]:
        """Collect every rank's RNG state and extras into rank 0's tree."""
        if not self.distributed:
            return tree
        mine = {k: tree.pop(k) for k in _PER_RANK}
        got: list[Any] | None = [None] * self.world_size if self.is_writer else None
        tdist.gather_object(mine, got, dst=0)
        if self.is_writer:
            tree["ranks"] = got
        return tree

    def select_ranked(self, tree: dict[str, Any]) -> dict[str, Any]:
        """This rank's RNG state and extras from a gathered tree."""
        ranks = tree.pop("ranks", None)
        if ranks is None:
            return tree
        if len(ranks) != self.world_size:
            log.warning("checkpoint has %d ranks, job has %d: every rank takes rank 0's RNG",
                        len(ranks), self.world_size)
        mine = ranks[self.rank] if self.rank < len(ranks) else ranks[0]
        tree.update(mine)
        return tree

    def manifest_extra(self) -> dict[str, Any]:
        """Recorded in the manifest."""
        return {"world_size": self.world_size, "sharded": self.sharded}

    def barrier(self) -> None:
        """Wait for every rank (no-op outside torchrun)."""
        if self.distributed:
            tdist.barrier()

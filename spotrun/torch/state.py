"""The Checkpointer's state tree (what is saved, how it is put back) and its progress report."""

from __future__ import annotations

import logging
from typing import Any, MutableMapping

from spotrun.errors import CheckpointError
from spotrun.torch.rng import get_rng_state, set_rng_state

log = logging.getLogger(__name__)
PARTS = ("model", "optimizer", "scheduler", "scaler")


def stateful(obj: Any) -> bool:
    """True for objects with state_dict() and load_state_dict()."""
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def extras_tree(extras: MutableMapping[str, Any]) -> dict[str, Any]:
    """Extras as saved: stateful ones by their state_dict(), the rest by value."""
    return {name: ({"stateful": value.state_dict()} if stateful(value) else {"value": value})
            for name, value in extras.items()}


class StateMixin:
    """Builds and loads the tree; the Checkpointer supplies the objects and the dist context."""

    dist: Any
    extras: MutableMapping[str, Any]
    progress: Any
    clock: Any

    def state_tree_local(self, step: int, *, rng: Any = None,
                         extras: dict[str, Any] | None = None) -> dict[str, Any]:
        """This rank's state: everything an exact resume needs, as tensors and plain values.

        rng / extras: as recorded at the step boundary (a save from the watchdog or
        poll() happens later, after the loop may have drawn random numbers).
        """
        tree: dict[str, Any] = {"step": step, "rng": rng if rng is not None else get_rng_state(),
                                "extras": extras if extras is not None else extras_tree(self.extras)}
        for key in PARTS:
            obj = getattr(self, key)
            if obj is not None:
                tree[key] = self.dist.state_dict_of(key, obj)
        return tree

    def state_tree(self, step: int) -> dict[str, Any]:
        """The tree to save: under torchrun, every rank's RNG and extras gathered to rank 0."""
        return self.dist.gather_ranked(self.state_tree_local(step))

    def load_tree(self, tree: dict[str, Any]) -> None:
        """Put a restored tree back into the live objects."""
        tree = self.dist.select_ranked(tree)
        for key in PARTS:
            obj = getattr(self, key)
            if obj is None:
                continue
            if key not in tree:
                raise CheckpointError(f"checkpoint has no {key} state", field=key)
            try:
                self.dist.load_state_dict_of(key, obj, tree[key])
            except (RuntimeError, KeyError, ValueError) as exc:
                raise CheckpointError(f"cannot load {key} state: {exc}", field=key,
                                      hint="the checkpoint was written by a different model") from None
        set_rng_state(tree["rng"])
        for name, saved in tree.get("extras", {}).items():
            live = self.extras.get(name)
            if "stateful" in saved:
                if live is None or not stateful(live):
                    log.warning("checkpoint extra %r has state but no stateful object to take it", name)
                    continue
                live.load_state_dict(saved["stateful"])
            else:
                self.extras[name] = saved["value"]

    def progress_fields(self) -> dict[str, Any]:
        """What the progress file reports."""
        s: Any = self
        return {"step": s.current_step, "total_steps": s.total_steps,
                "steps_per_s": s._steps_per_s, "last_checkpoint_step": s.last_checkpoint_step,
                "checkpoint_save_s": s.checkpoint_save_s,
                "emergency_checkpoint_step": s.emergency_checkpoint_step,
                "checkpoint_persist_s": s.checkpoint_persist_s,
                "emergency_save_s": s.emergency_save_s,
                "last_moment_checkpoint_step": s.last_moment_checkpoint_step,
                "checkpoint_interval_s": s.interval_s, "notice_outcome": s.guard.outcome,
                **s.persister.failure_fields()}

    def write_progress(self) -> None:
        """Rewrite the progress file now."""
        s: Any = self
        s._last_progress_t = self.clock()
        self.progress.write(self.progress_fields())

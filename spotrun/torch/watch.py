"""Whether the training state changed since the last step boundary, however the loop changes it.

The notice's save from the watchdog thread writes the state of the last finished step
(`ckpt.step(n)`) while the loop is elsewhere (a long validation, data loading). That is only
right while nothing has changed the state since `n`. Loops change it in three ways, and each
is seen here:

* **An optimizer step** (`torch.optim` or any optimizer in `extras`): its step pre-hook.
* **A backward pass**: a post-accumulate-grad hook on every trained parameter of the model and
  of the modules in `extras`. A loop that updates weights by hand (`p.data.add_(p.grad, ...)`)
  runs a backward first, so the step counts as started from its first gradient. `.data`
  writes do not move a tensor's version counter, which is why the hook is needed.
* **Anything in place on a tensor** (under `torch.no_grad()`, `detach()`, an EMA's
  `update_parameters`, an optimizer's foreach kernels, a tensor in `extras` changed in
  place): the tensor's version counter moves. The versions of every parameter, buffer,
  optimizer state tensor and tensor in the recorded extras are taken at the boundary and
  compared before and after a save copies the state.
* **Settings that are not tensors**: each optimizer's param-group settings (a scheduler
  stepped after the boundary changes `lr`) and the scheduler's state are compared too.

What stays invisible: a write through `.data` with no backward in the same step (weight
clipping through `.data` right after the boundary, say). Call `ckpt.step_started()` before
such a write; docs/checkpointing.md says so.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch

log = logging.getLogger(__name__)

Labelled = list[tuple[str, torch.Tensor]]


def _tensors_in(label: str, value: Any, depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors inside a saved value (dicts, lists, tuples), a few levels deep, labelled."""
    if isinstance(value, torch.Tensor):
        yield label, value
    elif depth < 4 and isinstance(value, Mapping):
        for k, v in value.items():
            yield from _tensors_in(f"{label}[{k!r}]", v, depth + 1)
    elif depth < 4 and isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _tensors_in(f"{label}[{i}]", v, depth + 1)


def _optimizer_tensors(label: str, opt: torch.optim.Optimizer) -> Iterator[tuple[str, torch.Tensor]]:
    for i, st in enumerate(opt.state.values()):
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                yield f"{label} state {k!r} of parameter {i}", v


def step_pre_hook(opt: torch.optim.Optimizer, fn: Callable[..., Any]) -> Any:
    """opt.register_step_pre_hook(fn), or None where the optimizer cannot take one.

    A wrapper that subclasses Optimizer without running its __init__ (accelerate's
    AcceleratedOptimizer) has no hook table; its backward passes still mark a step started.
    """
    try:
        return opt.register_step_pre_hook(fn)
    except AttributeError:
        log.info("%s takes no step hooks: a step counts as started at its backward pass",
                 type(opt).__name__)
        return None


class StateWatch:
    """Hooks that mark a step started, and version counters that catch any other change."""

    def __init__(self, model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None,
                 extras: Mapping[str, Any], scheduler: Any = None) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.modules: list[tuple[str, torch.nn.Module]] = \
            ([("model", model)] if model is not None else []) + \
            [(f"extras[{k!r}]", v) for k, v in extras.items() if isinstance(v, torch.nn.Module)]
        self.optimizers: list[tuple[str, torch.optim.Optimizer]] = \
            ([("optimizer", optimizer)] if optimizer is not None else []) + \
            [(f"extras[{k!r}]", v) for k, v in extras.items()
             if isinstance(v, torch.optim.Optimizer)]
        self._fixed: Labelled = []          # parameters and buffers: the same objects all run
        self._buffer_ids: set[int] = set()
        for label, mod in self.modules:
            for name, p in mod.named_parameters():
                self._fixed.append((f"{label} parameter {name!r}", p))
            for name, b in mod.named_buffers():
                self._fixed.append((f"{label} buffer {name!r}", b))
                if mod is model:
                    self._buffer_ids.add(id(b))
        self._marked: list[tuple[torch.Tensor, int]] = []
        self._marked_extras: Mapping[str, Any] | None = None
        self._marked_settings: list[tuple[str, Any]] = []
        self._marked_step: int | None = None
        self._cache: list[torch.Tensor] = []
        self._cache_key: tuple[int, ...] | None = None

    def install(self, step_started: Callable[[str], None]) -> list[Any]:
        """Register the hooks (besides the main optimizer's, which the Checkpointer owns)."""
        handles: list[Any] = []
        seen: set[int] = set()
        for _, mod in self.modules:
            for p in mod.parameters():
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    handles.append(p.register_post_accumulate_grad_hook(
                        lambda _p: step_started("a backward pass")))
        for label, opt in self.optimizers:
            if opt is not self.optimizer:
                handle = step_pre_hook(opt, lambda *_a, _l=label: step_started(f"{_l}.step()"))
                if handle is not None:
                    handles.append(handle)
        for _, mod in self.modules:
            if mod is not self.model and any(True for _ in mod.buffers()):
                # The model's own train-mode forward keeps step n saveable (its buffers are
                # copied first); another module's is simply a started step.
                handles.append(mod.register_forward_pre_hook(
                    lambda m, _a: step_started("a train-mode forward") if m.training else None))
        return handles

    def _watched(self, recorded_extras: Mapping[str, Any] | None) -> Iterable[tuple[str, torch.Tensor]]:
        """Every tensor the save would write, labelled (labels are only built to name a change)."""
        yield from self._fixed
        for label, opt in self.optimizers:
            yield from _optimizer_tensors(label, opt)
        for name, saved in (recorded_extras or {}).items():
            # What the save writes is this recorded tree: tensors in it must not change.
            for value in saved.values():
                yield from _tensors_in(f"extras[{name!r}]", value)

    def _tensors(self, recorded_extras: Mapping[str, Any] | None) -> list[torch.Tensor]:
        # The per-step path: no labels, and the model's and optimizers' tensors listed again
        # only when an optimizer's state grows (its first step); their changes in place are
        # what the versions see, and optimizer.step() itself fires the pre-hook.
        key = tuple(len(opt.state) for _, opt in self.optimizers)
        if key != self._cache_key:
            self._cache = [t for _, t in self._fixed]
            for _, opt in self.optimizers:
                for st in opt.state.values():
                    self._cache.extend(v for v in st.values() if isinstance(v, torch.Tensor))
            self._cache_key = key
        out = list(self._cache)
        for saved in (recorded_extras or {}).values():
            for value in saved.values():
                if isinstance(value, torch.Tensor):
                    out.append(value)
                elif isinstance(value, (Mapping, list, tuple)):
                    out.extend(t for _, t in _tensors_in("", value))
        return out

    def _settings(self) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = [
            (f"{label} param_groups", [{k: v for k, v in g.items() if k != "params"}
                                       for g in opt.param_groups])
            for label, opt in self.optimizers]
        if self.scheduler is not None:
            out.append(("scheduler", self.scheduler.state_dict()))
        return out

    def mark(self, step: int, recorded_extras: Mapping[str, Any] | None) -> None:
        """At the boundary of `step`: remember every watched tensor's version and the settings."""
        self._marked = [(t, t._version) for t in self._tensors(recorded_extras)]
        self._marked_extras = recorded_extras
        self._marked_settings = self._settings()
        self._marked_step = step

    def changed(self, step: int, *, buffers_copied: bool) -> str | None:
        """What changed in place since the boundary of `step` (a label), or None if nothing did.

        buffers_copied: the model's buffers were copied as of `step` (a train-mode forward
        since), so their later changes do not matter.
        """
        if self._marked_step != step:
            return f"no versions were taken at step {step}"
        for t, version in self._marked:
            if t._version != version and not (buffers_copied and id(t) in self._buffer_ids):
                return next((label for label, u in self._watched(self._marked_extras) if u is t),
                            "a tensor of the state")
        for (label, before), (_, now) in zip(self._marked_settings, self._settings()):
            if not _same(before, now):
                return label
        return None


def _same(a: Any, b: Any) -> bool:
    """Equal settings (tensors inside compared by value; a comparison that fails is a change)."""
    try:
        return bool(a == b)
    except (RuntimeError, ValueError, TypeError):
        return False

"""What a loop script prints at the end: a SHA256 per part of its final state.

`report(model=model, optimizer=opt, ...)` prints one `final-sha256 <part>: <hex>` line per
part (a module or optimizer by its state_dict(), a tensor or plain value as it is), so two
runs compare part by part and a difference names the part.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

STATEFUL = (torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)


def _feed(h: Any, obj: Any) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, dict):
        for key in sorted(obj, key=repr):
            h.update(f"K{key!r}".encode())
            _feed(h, obj[key])
    elif isinstance(obj, (list, tuple)):
        h.update(f"L{len(obj)}".encode())
        for item in obj:
            _feed(h, item)
    elif obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        h.update(f"V{obj!r}".encode())
    else:   # a repr may hold an address: two equal states would hash apart
        raise TypeError(f"no stable digest for a {type(obj).__name__}: pass its state_dict()")


def sha256_of(obj: Any) -> str:
    """A stable SHA256 of a state: a state_dict() holder, a tensor, or nested plain values."""
    h = hashlib.sha256()
    _feed(h, obj.state_dict() if isinstance(obj, STATEFUL) else obj)
    return h.hexdigest()


def report(**parts: Any) -> None:
    """Print `final-sha256 <part>: <hex>` for each part."""
    for name, obj in parts.items():
        print(f"final-sha256 {name}: {sha256_of(obj)}", flush=True)

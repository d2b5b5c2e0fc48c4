"""Split a state tree into JSON structure plus one flat byte buffer of tensor data.

Every tensor (and numpy array) in the tree becomes a slot in a single buffer,
64-byte aligned; everything else is encoded as tagged JSON. Dicts, tuples and
OrderedDicts keep their exact type (optimizer state uses int keys, model state
dicts carry `_metadata`), so the decoded tree loads exactly like the original.
Objects JSON cannot carry fall back to pickle: checkpoints are trusted input,
read only from the job's own store.
"""

from __future__ import annotations

import base64
import pickle
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from spotrun.errors import CheckpointError

ALIGN = 64
VIEW_MIN_BYTES = 1 << 20   # decode(copy=False) hands out views of tensors at least this big


@dataclass(frozen=True)
class Slot:
    """Where one tensor's bytes live in the flat buffer."""

    offset: int
    nbytes: int
    dtype: str            # "torch.float32" or a numpy dtype string such as "<u4"
    shape: tuple[int, ...]
    kind: str             # "torch" or "numpy"
    device: str = "cpu"

    def to_json(self) -> list[Any]:
        """Compact JSON form."""
        return [self.offset, self.nbytes, self.dtype, list(self.shape), self.kind, self.device]

    @classmethod
    def from_json(cls, raw: list[Any]) -> "Slot":
        """Inverse of to_json."""
        return cls(int(raw[0]), int(raw[1]), str(raw[2]), tuple(raw[3]), str(raw[4]), str(raw[5]))


@dataclass
class Plan:
    """A tree split into its JSON structure, its tensors and their slots."""

    structure: Any
    leaves: list[Any]
    slots: list[Slot]
    nbytes: int


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan(tree: Any) -> Plan:
    """Lay the tree's tensors out in one buffer; nothing is copied yet."""
    leaves: list[Any] = []
    slots: list[Slot] = []
    offset = 0

    def leaf(x: Any, kind: str) -> dict[str, int]:
        nonlocal offset
        if kind == "torch":
            if x.is_sparse or x.is_quantized:
                raise CheckpointError("sparse/quantized tensors are not supported",
                                      field="state", value=str(x.layout))
            slot = Slot(offset, x.numel() * x.element_size(), str(x.dtype), tuple(x.shape),
                        "torch", str(x.device))
        else:
            slot = Slot(offset, x.nbytes, x.dtype.str, tuple(x.shape), "numpy")
        leaves.append(x)
        slots.append(slot)
        offset = _align(offset + slot.nbytes)
        return {"__T__": len(leaves) - 1}

    def enc(x: Any) -> Any:
        if x is None or isinstance(x, (bool, str)):
            return x
        if isinstance(x, int) and type(x) is int:
            return x
        if isinstance(x, float) and type(x) is float:
            return x
        if isinstance(x, torch.Tensor):
            return leaf(x.detach(), "torch")
        if isinstance(x, np.ndarray) and x.dtype != object:
            return leaf(x, "numpy")
        if isinstance(x, OrderedDict):
            meta = getattr(x, "_metadata", None)
            out = {"__od__": [[enc(k), enc(v)] for k, v in x.items()]}
            if meta is not None:
                out["meta"] = enc(dict(meta))
            return out
        if type(x) is dict:
            return {"__d__": [[enc(k), enc(v)] for k, v in x.items()]}
        if type(x) is list:
            return [enc(v) for v in x]
        if type(x) is tuple:
            return {"__t__": [enc(v) for v in x]}
        if isinstance(x, bytes):
            return {"__b__": base64.b64encode(x).decode()}
        # numpy scalars, dtypes, enums, user objects: rare and small.
        return {"__pk__": base64.b64encode(pickle.dumps(x)).decode()}

    structure = enc(tree)
    return Plan(structure=structure, leaves=leaves, slots=slots, nbytes=offset)


def copy_into(p: Plan, buf: torch.Tensor, indices: list[int] | None = None) -> None:
    """Copy the leaves (all, or those at indices) into their slots of buf (uint8, >= p.nbytes)."""
    non_blocking = buf.is_pinned()
    todo = range(len(p.leaves)) if indices is None else indices
    with torch.no_grad():
        for i in todo:
            x, s = p.leaves[i], p.slots[i]
            if s.nbytes == 0:
                continue
            dst = buf[s.offset:s.offset + s.nbytes]
            if s.kind == "torch":
                dst.view(x.dtype).view(x.shape).copy_(x, non_blocking=non_blocking)
            else:
                src = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
                dst.copy_(torch.from_numpy(src))
    if non_blocking and torch.cuda.is_available():
        torch.cuda.synchronize()


def _torch_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dt, torch.dtype):
        raise CheckpointError("unknown tensor dtype", field="checkpoint", value=name)
    return dt


def decode(structure: Any, slots: list[Slot], data: "bytes | bytearray | memoryview | torch.Tensor",
           *, copy: bool = True) -> Any:
    """Rebuild the tree from its structure and the flat buffer (tensors on CPU).

    copy=False: tensors are views of data (a torch buffer the caller hands over),
    one copy fewer on restore; load_state_dict copies what it keeps anyway.
    """
    if isinstance(data, torch.Tensor):
        raw = data
    elif len(data) == 0:
        raw = torch.empty(0, dtype=torch.uint8)
    else:
        with warnings.catch_warnings():
            # A read-only buffer is fine: every tensor is cloned out of it below.
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.frombuffer(data, dtype=torch.uint8)

    def tensor(i: int) -> Any:
        s = slots[i]
        if s.offset + s.nbytes > raw.numel():
            raise CheckpointError("tensor data out of range", field="checkpoint", value=i)
        chunk = raw[s.offset:s.offset + s.nbytes]
        if s.kind == "torch":
            dt = _torch_dtype(s.dtype)
            if s.nbytes == 0:
                return torch.empty(s.shape, dtype=dt)
            t = chunk.view(dt).view(s.shape)
            # Small tensors are cloned anyway: some consumers (torch.set_rng_state) need owners.
            return t if not copy and isinstance(data, torch.Tensor) and s.nbytes >= VIEW_MIN_BYTES \
                else t.clone()
        return np.frombuffer(chunk.numpy().tobytes(), dtype=np.dtype(s.dtype)).reshape(s.shape).copy()

    def dec(x: Any) -> Any:
        if isinstance(x, list):
            return [dec(v) for v in x]
        if not isinstance(x, dict):
            return x
        if "__T__" in x:
            return tensor(x["__T__"])
        if "__d__" in x:
            return {dec(k): dec(v) for k, v in x["__d__"]}
        if "__od__" in x:
            od = OrderedDict((dec(k), dec(v)) for k, v in x["__od__"])
            if "meta" in x:
                od._metadata = dec(x["meta"])  # type: ignore[attr-defined]
            return od
        if "__t__" in x:
            return tuple(dec(v) for v in x["__t__"])
        if "__b__" in x:
            return base64.b64decode(x["__b__"])
        if "__pk__" in x:
            return pickle.loads(base64.b64decode(x["__pk__"]))
        raise CheckpointError("unknown tag in checkpoint structure", field="checkpoint",
                              value=sorted(x))

    return dec(structure)

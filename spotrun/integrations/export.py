"""Export a job's checkpoint as a plain PyTorch `state_dict` file (and safetensors) for `spotrun pull`.

Works for every checkpoint kind spotrun writes: the `Checkpointer`'s (`spotrun.torch/1`),
a Trainer folder (`hf-trainer/1`) and a Lightning `.ckpt` (`lightning/1`). The files it
writes load with `torch.load(path, weights_only=True)` / `safetensors.torch.load_file`,
without spotrun.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from spotrun.checkpoints import Manifest
from spotrun.errors import CheckpointError
from spotrun.integrations._common import SEP, download
from spotrun.store.base import ObjectStore
from spotrun.torch.flatten import Slot, decode
from spotrun.torch.storage import read_checkpoint

STATE_DICT_FILE = "model.pt"
SAFETENSORS_FILE = "model.safetensors"


def state_dict_of(store: ObjectStore, manifest: Manifest) -> dict[str, torch.Tensor]:
    """The model's tensors in one checkpoint, by parameter name (on CPU)."""
    kind = manifest.extra.get("kind")
    if kind == "spotrun.torch/1":
        _, meta, data = read_checkpoint(store, manifest.name)
        tree = decode(meta["structure"], [Slot.from_json(s) for s in meta["slots"]], data)
        model = tree.get("model") if isinstance(tree, dict) else None
        if not isinstance(model, dict):
            raise CheckpointError("checkpoint has no single model state (sharded or no model=)",
                                  field="checkpoint", value=manifest.name)
        return _tensors(model)
    with tempfile.TemporaryDirectory(prefix="spotrun-export-") as tmp:
        folder = Path(tmp)
        if kind == "hf-trainer/1":
            weights = [f for f in manifest.files if f.endswith((".safetensors", ".bin"))
                       and SEP not in f and "model" in f]
            if not weights:
                raise CheckpointError("Trainer checkpoint has no model weights file",
                                      field="checkpoint", value=manifest.name)
            download(store, manifest.name, folder)
            merged: dict[str, torch.Tensor] = {}
            for name in sorted(weights):   # sharded weights: model-00001-of-00002...
                merged.update(_load_weights(folder / name))
            return merged
        if kind == "lightning/1":
            download(store, manifest.name, folder)
            ckpt = torch.load(folder / str(manifest.extra.get("file", "last.ckpt")),
                              map_location="cpu", weights_only=False)
            return _tensors(ckpt["state_dict"])
    raise CheckpointError(f"cannot export a checkpoint of kind {kind!r}", field="checkpoint",
                          value=manifest.name,
                          hint="known kinds: spotrun.torch/1, hf-trainer/1, lightning/1")


def _load_weights(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file
        return dict(load_file(str(path)))
    return _tensors(torch.load(path, map_location="cpu", weights_only=True))


def _tensors(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {str(k): v.detach().cpu() for k, v in state.items() if isinstance(v, torch.Tensor)}


def export(store: ObjectStore, manifest: Manifest, dest: Path) -> list[str]:
    """Write dest/model.pt (and dest/model.safetensors where installed); the names written."""
    state = state_dict_of(store, manifest)
    dest.mkdir(parents=True, exist_ok=True)
    torch.save(state, dest / STATE_DICT_FILE)
    written = [STATE_DICT_FILE]
    try:
        from safetensors.torch import save_file
    except ImportError:
        return written
    # safetensors refuses tensors sharing memory (tied weights): give each its own copy.
    save_file({k: v.clone().contiguous() for k, v in state.items()}, str(dest / SAFETENSORS_FILE),
              metadata={"step": str(manifest.step), "checkpoint": manifest.name})
    written.append(SAFETENSORS_FILE)
    return written

"""Sharded checkpoints through torch.distributed.checkpoint (DCP), for FSDP-style state.

Every rank writes its own shard with `dcp.save` straight into the checkpoint
folder (`ckpt-<step>/`, on a shared filesystem: a `file://` store); after a
barrier rank 0 hashes every file and publishes the manifest, so the checkpoint
follows the same layout rules as an unsharded one. Per-rank small state
(scheduler, scaler, RNG, extras) rides along as one pickled blob per rank.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
from typing import Any, MutableMapping, Protocol

import torch.distributed as tdist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from spotrun.checkpoints import MANIFEST, Manifest, apply_retention, checkpoint_name, latest_verified, write_manifest
from spotrun.errors import CheckpointError, ConfigError
from spotrun.store.base import ObjectStore, StoreFeature
from spotrun.torch.rng import get_rng_state, set_rng_state

log = logging.getLogger(__name__)
KIND = "spotrun.torch.dcp/1"


class ShardedState(Protocol):
    """What a sharded save or restore reads from its owner (the Checkpointer)."""

    model: Any
    optimizer: Any
    scheduler: Any
    scaler: Any
    extras: MutableMapping[str, Any]
    store: ObjectStore
    keep: int
    resume_name: str | None


def _local(ckpt: ShardedState) -> ObjectStore:
    """The checkpointer's store, whose objects DCP writes as files (LOCAL_PATH)."""
    if StoreFeature.LOCAL_PATH not in ckpt.store.features:
        raise ConfigError("sharded checkpoints need a file:// store on a shared filesystem",
                          field="SPOTRUN_CHECKPOINT_URI", value=ckpt.store.uri)
    return ckpt.store


def _rank() -> int:
    return tdist.get_rank() if tdist.is_initialized() else 0


def _state(ckpt: ShardedState) -> dict[str, Any]:
    optims = [ckpt.optimizer] if ckpt.optimizer is not None else []
    msd, osd = get_state_dict(ckpt.model, optims)
    small: dict[str, Any] = {"rng": get_rng_state(), "extras": {}}
    for key in ("scheduler", "scaler"):
        obj = getattr(ckpt, key)
        if obj is not None:
            small[key] = obj.state_dict()
    for name, value in ckpt.extras.items():
        small["extras"][name] = ({"stateful": value.state_dict()} if hasattr(value, "load_state_dict")
                                 else {"value": value})
    state: dict[str, Any] = {"model": msd, f"spotrun_rank{_rank()}": pickle.dumps(small)}
    if optims:
        state["optim"] = osd
    return state


def save_sharded(ckpt: ShardedState, step: int) -> Manifest | None:
    """Collective: every rank writes its shard; rank 0 returns the published manifest."""
    name = checkpoint_name(step)
    folder = _local(ckpt).local_path(name)
    dcp.save(_state(ckpt), checkpoint_id=str(folder))
    if tdist.is_initialized():
        tdist.barrier()
    manifest = None
    if _rank() == 0:
        files = {}
        for p in sorted(folder.iterdir()):
            if p.is_file() and p.name != MANIFEST:
                data = p.read_bytes()
                files[p.name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        extra = {"kind": KIND, "world_size": tdist.get_world_size() if tdist.is_initialized() else 1}
        manifest = write_manifest(ckpt.store, step, files, extra)
        apply_retention(ckpt.store, ckpt.keep)
    if tdist.is_initialized():
        tdist.barrier()
    return manifest


def restore_sharded(ckpt: ShardedState) -> int:
    """Collective: rank 0 picks the newest verified checkpoint, every rank loads its shard."""
    store = _local(ckpt)
    chosen: list[Any] = [None]
    if _rank() == 0:
        m = latest_verified(ckpt.store, deep=True)
        if ckpt.resume_name and (m is None or m.name != ckpt.resume_name):
            log.warning("sharded restore ignores SPOTRUN_RESUME_CHECKPOINT=%s; newest verified is %s",
                        ckpt.resume_name, m.name if m else None)
        chosen = [(m.name, m.step) if m is not None else None]
    if tdist.is_initialized():
        tdist.broadcast_object_list(chosen, src=0)
    if chosen[0] is None:
        return 0
    name, step = chosen[0]
    state = _state(ckpt)
    key = f"spotrun_rank{_rank()}"
    try:
        dcp.load(state, checkpoint_id=str(store.local_path(name)))
    except Exception as exc:   # DCP raises plain exceptions (often wrapped per rank)
        raise CheckpointError(f"cannot load sharded checkpoint: {exc}", field="checkpoint",
                              value=name, hint="same world size and model as when saved?") from None
    set_state_dict(ckpt.model, [ckpt.optimizer] if ckpt.optimizer is not None else [],
                   model_state_dict=state["model"], optim_state_dict=state.get("optim", {}))
    small = pickle.loads(state[key])
    for k in ("scheduler", "scaler"):
        obj = getattr(ckpt, k)
        if obj is not None and k in small:
            obj.load_state_dict(small[k])
    set_rng_state(small["rng"])
    for n, saved in small["extras"].items():
        if "stateful" in saved and n in ckpt.extras:
            ckpt.extras[n].load_state_dict(saved["stateful"])
        elif "value" in saved:
            ckpt.extras[n] = saved["value"]
    return int(step)

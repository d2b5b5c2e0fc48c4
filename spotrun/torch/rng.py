"""Capture and restore every random number generator a training loop draws from."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def get_rng_state() -> dict[str, Any]:
    """Python, numpy, torch CPU and (if present) every CUDA device's generator state."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what get_rng_state captured; CUDA states only if the device count matches."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)

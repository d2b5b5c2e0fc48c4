"""Memory feasibility: does one GPU of a type hold the job's training state?"""

from __future__ import annotations

from dataclasses import dataclass

from spotrun.catalog import InstanceType
from spotrun.spec import JobSpec

GIB_TO_GB = 1024 ** 3 / 1e9
HEADROOM = 0.20          # keep ~20% of a card free (BRIEF section 1)
REPORTED_SLACK = 0.01    # the API reports slightly under the marketed size (A10G 22.35 GiB = "24 GB")

# Training state bytes per parameter, by optimizer. Mixed precision (fp16/bf16/fp8) keeps
# low-precision weights (2) and grads (2) plus fp32 master weights (4); fp32/tf32 keeps fp32
# weights (4) and grads (4): 8 bytes either way. Optimizer state on top, in fp32: Adam/AdamW two
# moments (8) -> 16 bytes/param (ZeRO, Rajbhandari et al. 2020; BRIEF section 1); SGD momentum
# and Lion one (4) -> 12; Adafactor's factored moments are negligible -> 8.
STATE_BYTES_PER_PARAM = {"adamw": 16.0, "adam": 16.0, "sgd": 12.0, "lion": 12.0, "adafactor": 8.0}
# Gradients are not saved in a checkpoint.
GRAD_BYTES_PER_PARAM = {"fp32": 4.0, "tf32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 2.0}
# Activation allowance per GPU: 1 byte per parameter (about a bf16 half-copy of the weights, a
# micro-batch with activation checkpointing), at least 1 GB. Activations are per GPU: fsdp does
# not split them. An assumption: resources.gpu_memory_gb overrides the whole estimate.
# Above 7B the allowance grows as params^0.7, not linearly: checkpointed activations scale with
# layers x hidden width (x sequence x micro-batch), and layers x width grows as params^0.7 across
# the Llama 2 shapes (7B 32x4096, 13B 40x5120, 70B 80x8192: x5.0 for x10 params; Touvron et al.
# 2023, table 1). 70B: 7 GB x 10^0.7 = 35 GB, not 70.
ACTIVATION_BYTES_PER_PARAM = 1.0
ACTIVATION_MIN_GB = 1.0
ACTIVATION_LINEAR_UP_TO_B = 7.0
ACTIVATION_EXPONENT = 0.7


def activation_gb(params_b: float) -> float:
    """Per-GPU activation allowance in GB for a model of params_b billion parameters."""
    linear = params_b * ACTIVATION_BYTES_PER_PARAM
    if params_b > ACTIVATION_LINEAR_UP_TO_B:
        linear = (ACTIVATION_LINEAR_UP_TO_B * ACTIVATION_BYTES_PER_PARAM
                  * (params_b / ACTIVATION_LINEAR_UP_TO_B) ** ACTIVATION_EXPONENT)
    return max(ACTIVATION_MIN_GB, linear)


@dataclass(frozen=True)
class MemoryNeed:
    """Per-GPU memory a job needs on a given GPU count."""

    need_gb: float           # what must fit (headroom excluded)
    explicit: bool           # True when resources.gpu_memory_gb gave it
    state_gb: float = 0.0
    activation_gb: float = 0.0


def memory_need(spec: JobSpec, gpus_total: int) -> MemoryNeed | None:
    """Per-GPU need when the job runs on gpus_total GPUs; None when nothing says."""
    if spec.resources.gpu_memory_gb is not None:
        return MemoryNeed(need_gb=spec.resources.gpu_memory_gb, explicit=True)
    params_b = spec.model.params_billion
    if params_b is None:
        return None
    state = params_b * STATE_BYTES_PER_PARAM[spec.model.optimizer]
    if spec.model.sharding == "fsdp":
        state /= max(gpus_total, 1)
    act = activation_gb(params_b)
    return MemoryNeed(need_gb=state + act, explicit=False, state_gb=state, activation_gb=act)


def checkpoint_gb(spec: JobSpec, gpus_total: int) -> float | None:
    """GB one GPU writes per checkpoint (weights + optimizer state); None without a model."""
    params_b = spec.model.params_billion
    if params_b is None:
        return None
    per_param = STATE_BYTES_PER_PARAM[spec.model.optimizer] - GRAD_BYTES_PER_PARAM[spec.model.precision]
    gb = params_b * per_param
    return gb / max(gpus_total, 1) if spec.model.sharding == "fsdp" else gb


def memory_reason(itype: InstanceType, spec: JobSpec, gpus_total: int) -> str | None:
    """Why one GPU of itype cannot hold the job, or None when it fits."""
    need = memory_need(spec, gpus_total)
    if need is None:
        return None
    card_gb = itype.gpu_memory_gib * GIB_TO_GB
    if need.explicit:
        if need.need_gb <= card_gb * (1 + REPORTED_SLACK):
            return None
        return (f"needs {need.need_gb:.0f} GB per GPU (resources.gpu_memory_gb); "
                f"{itype.gpu} has {card_gb:.0f} GB")
    usable = card_gb * (1 - HEADROOM)
    if need.need_gb <= usable * (1 + REPORTED_SLACK):
        return None
    split = f" split over {gpus_total} GPUs" if spec.model.sharding == "fsdp" else ""
    return (f"needs {need.need_gb:.1f} GB per GPU (state {need.state_gb:.1f}{split} + "
            f"activations {need.activation_gb:.1f}); {itype.gpu} has {card_gb:.0f} GB, "
            f"{usable:.1f} usable with 20% headroom")

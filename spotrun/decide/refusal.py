"""Refusing what can never run: the binding reason and the nearest thing that would run.

A job is refused (exit 2, nothing written) when no catalog type, zone and market can ever
satisfy it: memory, GPUs per node, nodes, the type and zone filters, a deadline shorter
than the fastest candidate, or a spot job that loses more per reclaim than any pool runs
between reclaims (even when the notice is honoured). Prices and capacity are not reasons to
refuse: they move.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from spotrun.catalog import Catalog
from spotrun.costmodel.memory import (GIB_TO_GB, HEADROOM, STATE_BYTES_PER_PARAM, activation_gb,
                                      memory_need)
from spotrun.decide.core import fastest, is_never
from spotrun.decide.rank import NO_PROGRESS, Ranking, rank
from spotrun.errors import SpecError
from spotrun.spec import JobSpec


def refusal(spec: JobSpec, ranking: Ranking, *, catalog: Catalog, market: Any, history: Any,
            hours_left: float | None, notice: Any = None) -> SpecError | None:
    """The error to refuse the job with, or None when some pool can (or could) run it."""
    if not is_never(ranking, hours_left, spec):
        return None
    if ranking.candidates and hours_left is not None and all(
            c.misses_deadline for c in ranking.candidates):
        best = fastest(ranking)
        got = f"{hours_left:.1f} h" if hours_left is not None else "?"
        where = (f"; the fastest is {best.instance_type} {best.market.value} at "
                 f"{best.expected_hours:.1f} h") if best and best.expected_hours else ""
        return SpecError(f"the deadline leaves {got}, shorter than any candidate needs{where}",
                         field="policy.deadline", hint="give a later deadline or less work")
    res = spec.resources
    max_node = max(t.gpus for t in catalog.types.values())
    if res.gpus > max_node:
        most = sorted(n for n, t in catalog.types.items() if t.gpus == max_node)[:3]
        nodes = math.ceil(res.gpus / max_node)
        return SpecError(
            f"no instance type has {res.gpus} GPUs per node; the most is {max_node} "
            f"({', '.join(most)}, ...)", field="resources.gpus", value=res.gpus,
            hint=f"use resources.gpus: {max_node} (with resources.nodes: {nodes} once multi-node "
                 f"jobs are supported)")
    memory = _memory_refusal(spec, catalog, max_node)
    if memory is not None:   # not even the catalog's largest GPU holds it: filters do not matter
        return memory
    stuck = [r for r in ranking.rejected if NO_PROGRESS in r.reason]
    if stuck:   # name the pool that reclaims least: even it leaves no progress
        best = max(stuck, key=lambda r: r.mtbf_h or 0.0)
        return SpecError(
            f"no spot pool keeps progress; the best, {best.instance_type} in {best.reason}",
            field="policy.market", value=spec.policy.market.value,
            hint="use policy.market: on-demand, or auto with a policy.deadline; or lose less "
                 "per reclaim: a shorter checkpoint.interval_minutes, shorter steps, a smaller "
                 "checkpoint")
    if ranking.candidates:   # only on-demand rows, which an `auto` job launches under a deadline
        return SpecError("no spot pool can run the job, and policy.market: auto uses on-demand "
                         "only under a deadline", field="policy.market",
                         value=spec.policy.market.value,
                         hint="use policy.market: on-demand, or give policy.deadline")
    if res.instance_types or res.zones:
        wide = rank(replace(spec, resources=replace(res, instance_types=(), zones=())),
                    catalog=catalog, market=market, history=history, hours_left=hours_left,
                    notice=notice)
        types = list(dict.fromkeys(c.instance_type for c in wide.candidates))[:4]
        first = ranking.rejected[0].reason if ranking.rejected else "no pool left"
        which = "resources.instance_types" if res.instance_types else "resources.zones"
        hint = (f"types that can: {', '.join(types)}" if types
                else "no catalog type can run it at all")
        return SpecError(f"no allowed pool can run the job ({ranking.rejected[0].instance_type}"
                         f": {first})" if ranking.rejected else "no allowed pool can run the job",
                         field=which, hint=hint)
    first = ranking.rejected[0] if ranking.rejected else None
    return SpecError("no catalog type can run the job"
                     + (f" ({first.instance_type}: {first.reason})" if first else ""),
                     field="resources")


def _memory_refusal(spec: JobSpec, catalog: Catalog, max_node: int) -> SpecError | None:
    """Memory as the binding reason, with the GPU count fsdp would need; None if it is not."""
    need = memory_need(spec, (spec.resources.gpus_max or spec.resources.gpus) * spec.resources.nodes)
    if need is None:
        return None
    best = max(catalog.types.values(), key=lambda t: t.gpu_memory_gib)
    card_gb = best.gpu_memory_gib * GIB_TO_GB
    usable = card_gb if need.explicit else card_gb * (1 - HEADROOM)
    if need.need_gb <= usable * 1.01:
        return None
    if need.explicit:
        return SpecError(f"needs {need.need_gb:.0f} GB per GPU; the largest is {best.gpu} with "
                         f"{card_gb:.0f} GB", field="resources.gpu_memory_gb",
                         value=need.need_gb, hint="lower it, or shard the model (fsdp)")
    params = spec.model.params_billion or 0.0
    state = params * STATE_BYTES_PER_PARAM[spec.model.optimizer]
    act = activation_gb(params)
    room = usable - act
    field = "model.sharding" if spec.model.sharding == "none" else "resources.gpus"
    msg = (f"needs {need.need_gb:.0f} GB per GPU; the largest is {best.gpu} with {usable:.0f} "
           f"usable (20% headroom)")
    if room <= 0:
        return SpecError(msg, field="model.params_billion", value=params,
                         hint="activations alone do not fit one GPU: a smaller model or "
                              "resources.gpu_memory_gb measured on your job")
    gpus = math.ceil(state / room)
    if gpus <= max_node:
        hint = f"use model.sharding: fsdp with resources.gpus >= {gpus}"
    else:
        hint = (f"use model.sharding: fsdp with >= {gpus} GPUs, i.e. resources.nodes >= "
                f"{math.ceil(gpus / max_node)} of {max_node} GPUs (multi-node)")
    return SpecError(msg, field=field, hint=hint)

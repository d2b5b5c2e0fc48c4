"""Pools in several clouds: one model across them, one per cloud alone, and the comparison.

Each cloud's trace, prices and on-demand price make a model as one cloud makes it (model.py);
the model across clouds joins their pools (named `cloud:column`) on the rows they share, with
the moves of the checkpoint between clouds priced (spotrun.decide.policy.moves). Every model
runs the same policies on the same starts, so each policy's cost across clouds stands beside
its cost in each cloud alone (docs/simulate.md, "Several clouds").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources

import numpy as np

from spotrun.catalog import load_catalog
from spotrun.costmodel.egress import Throughput, egress_rate
from spotrun.decide.policy import OPTIMAL
from spotrun.decide.policy.history import MarketHistory
from spotrun.decide.policy.moves import CloudMoves
from spotrun.errors import BadInputError
from spotrun.simulate.model import SimModel, build_model
from spotrun.simulate.sweep import SimResult, run_policies
from spotrun.traces import PriceBook, Trace

# A checkpoint "GB" is 10^9 bytes, as `spotrun plan --checkpoint-gb` reads it.
_GB_BYTES = 10**9


def known_clouds() -> list[str]:
    """The clouds with a packaged catalog (each declares its egress rate)."""
    folder = resources.files("spotrun.data").joinpath("catalog")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


@dataclass
class CloudInput:
    """One cloud's market as the user gave it."""

    name: str
    trace: Trace
    prices: PriceBook | None
    spot_price_usd_per_hour: float | None
    od_price_usd_per_hour: float


@dataclass
class CloudModels:
    """The model across clouds (with its moves) and each cloud's model alone."""

    across: SimModel
    alone: dict[str, SimModel]
    checkpoint_gb: float

    @property
    def moves(self) -> CloudMoves:
        """The clouds of the across model's pools and the price of a move."""
        assert self.across.moves is not None
        return self.across.moves


def select_pools(inputs: list[CloudInput], pools: list[str]) -> list[CloudInput]:
    """Each cloud cut to the `cloud:column` pools named (every cloud needs one of them)."""
    names = [f"{c.name}:{p}" for c in inputs for p in c.trace.pools]
    if len(set(pools)) != len(pools):
        raise BadInputError("a pool is given twice", field="--pool", value=list(pools))
    unknown = [p for p in pools if p not in names]
    if unknown:
        raise BadInputError(f"unknown pool {unknown[0]!r}; allowed: {', '.join(names)}",
                            field="--pool", value=unknown[0])
    out = []
    for c in inputs:
        mine = [p.split(":", 1)[1] for p in pools if p.split(":", 1)[0] == c.name]
        if not mine:
            raise BadInputError(f"no pool of {c.name} given; each cloud of --trace needs one "
                                f"(or leave --pool out)", field="--pool")
        out.append(CloudInput(c.name, c.trace.select(mine), c.prices,
                              c.spot_price_usd_per_hour, c.od_price_usd_per_hour))
    return out


def _same_rows(inputs: list[CloudInput]) -> None:
    """Every cloud's trace must have the first one's rows (tick and time), to be joined."""
    first = inputs[0]
    for c in inputs[1:]:
        if not (np.array_equal(c.trace.ticks, first.trace.ticks)
                and np.array_equal(c.trace.elapsed_s, first.trace.elapsed_s)):
            raise BadInputError(
                f"{c.name}'s rows differ from {first.name}'s ({len(c.trace)} and "
                f"{len(first.trace)} rows); every cloud's trace needs the same tick and time "
                f"columns", field="--trace", value=c.trace.source)


def _prefixed(cloud: str, exc: BadInputError) -> BadInputError:
    """The same error, its message naming the cloud it is about."""
    return BadInputError(f"{cloud}: {exc.message}", field=exc.field, hint=exc.hint)


def copy_ticks(checkpoint_gb: float, tick_s: float) -> int:
    """Ticks the copy of the checkpoint takes at the throughput prior, rounded to the nearest
    whole tick as the model rounds the changeover."""
    seconds = checkpoint_gb * _GB_BYTES / Throughput().bytes_per_s
    return math.floor(seconds / tick_s + 0.5)


def build_cloud_models(inputs: list[CloudInput], *, work_hours: float, deadline_hours: float,
                       changeover_hours: float, nodes: int, checkpoint_gb: float,
                       quarantine_s: dict[str, float]) -> CloudModels:
    """A model per cloud alone and the model across them; BadInputError naming the flag."""
    _same_rows(inputs)
    alone: dict[str, SimModel] = {}
    for c in inputs:
        try:
            alone[c.name] = build_model(
                c.trace, c.prices, spot_price_usd_per_hour=c.spot_price_usd_per_hour,
                od_price_usd_per_hour=c.od_price_usd_per_hour, work_hours=work_hours,
                deadline_hours=deadline_hours, changeover_hours=changeover_hours, nodes=nodes,
                notice_quarantine_s=quarantine_s[c.name])
        except BadInputError as exc:
            raise _prefixed(c.name, exc) from None
    models = list(alone.values())
    first = models[0]
    nbytes = int(checkpoint_gb * _GB_BYTES)
    moves = CloudMoves(
        clouds=tuple(alone),
        pool_cloud=tuple(k for k, m in enumerate(models) for _ in m.pools),
        od_usd_per_hour=tuple(c.od_price_usd_per_hour for c in inputs),
        egress_usd=tuple(egress_rate(c.name, load_catalog(c.name)).usd(nbytes) for c in inputs),
        copy_ticks=copy_ticks(checkpoint_gb, first.tick_s))
    # One quarantine per history: the longest of the clouds' (aws 720 s, gcp 630 s: the same
    # whole rows on traces of three minutes or more).
    history = MarketHistory(
        [f"{name}:{p}" for name, m in alone.items() for p in m.pools],
        np.hstack([m.history.up for m in models]), np.hstack([m.history.price for m in models]),
        min(moves.od_usd_per_hour), first.tick_s,
        notice_quarantine_s=max(quarantine_s[name] for name in alone))
    across = SimModel(history=history, tick_values=first.tick_values, work_ticks=first.work_ticks,
                      deadline_ticks=first.deadline_ticks,
                      changeover_ticks=first.changeover_ticks, moves=moves)
    return CloudModels(across=across, alone=alone, checkpoint_gb=checkpoint_gb)


@dataclass
class CloudsResult:
    """Every policy's runs across clouds and in each cloud alone, on the same starts."""

    models: CloudModels
    across: SimResult
    alone: dict[str, SimResult]

    def summary(self) -> dict[str, dict]:
        """The across-clouds summary of each policy, with the comparison keys added."""
        across = self.across.summary()
        alone = self.alone_summary()
        out: dict[str, dict] = {}
        for name in self.alone[next(iter(self.alone))].runs:
            costs = {c: alone[c][name]["mean_cost_usd"] for c in alone}
            best = min(costs, key=lambda c: costs[c])
            runs = self.across.runs.get(name)
            row = out[name] = across.get(name) or _not_run(alone[best][name]["runs"])
            row["mean_cost_alone_usd"] = costs
            row["best_single_cloud"] = best
            row["saving_vs_best_single_cloud_pct"] = (
                None if runs is None or costs[best] <= 0 else
                round(100.0 * (1.0 - runs.mean_cost_usd / costs[best]), 4))
            row["mean_egress_usd"] = (None if runs is None or runs.egress_usd is None
                                      else round(float(runs.egress_usd.mean()), 4))
            row["moves_per_run"] = (None if runs is None or runs.moves is None
                                    else round(float(runs.moves.mean()), 4))
        return out

    def alone_summary(self) -> dict[str, dict]:
        """Each cloud alone: its policies' summaries, as a one-cloud simulate prints them."""
        return {c: r.summary() for c, r in self.alone.items()}


def _not_run(runs: int) -> dict:
    """The across-clouds keys of a policy that did not run there (the optimum, moves priced)."""
    return {"runs": runs, "mean_cost_usd": None, "mean_cost_vs_on_demand": None,
            "mean_cost_vs_optimal": None, "deadline_met_fraction": None}


def across_policies(models: CloudModels, names: list[str]) -> list[str]:
    """The policies that run across clouds: all, but the optimum only when moves are free
    (its dynamic programme prices no move)."""
    return [n for n in names if n != OPTIMAL or models.moves.free]


def compare_clouds(models: CloudModels, rows: np.ndarray, names: list[str], *, workers: int,
                   record: bool = False) -> CloudsResult:
    """Run the policies across clouds and in each cloud alone, on the same starts."""
    across = run_policies(models.across, rows, across_policies(models, names),
                          workers=workers, record=record)
    alone = {c: run_policies(m, rows, names, workers=workers) for c, m in models.alone.items()}
    return CloudsResult(models=models, across=across, alone=alone)

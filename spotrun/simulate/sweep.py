"""Run policies over many starts of one model, and summarise them (mean costs, ratios).

Every policy gets the same starts. Work is split into (policy, chunk of starts) tasks;
with workers > 1 they run in forked processes that inherit the model (no pickling).
"""

from __future__ import annotations

import multiprocessing as mp
from dataclasses import dataclass, field

import numpy as np

from spotrun.errors import SpotrunError
from spotrun.decide.policy import OPTIMAL, make_policy
from spotrun.decide.policy.base import Decision
from spotrun.simulate.optimal import optimal_costs, optimal_schedule
from spotrun.simulate.engine import ScheduledPolicy, run_policy
from spotrun.simulate.model import SimModel

_CHUNK_RUNS = 25
_MODEL: SimModel | None = None   # set in the parent before forking workers


@dataclass
class PolicyRuns:
    """All runs of one policy, in start order."""

    name: str
    costs_usd: np.ndarray
    deadline_met: np.ndarray
    decisions: list[list[Decision]] | None = None
    egress_usd: np.ndarray | None = None    # per run, included in costs_usd (several clouds)
    moves: np.ndarray | None = None         # per run: checkpoint moves between clouds

    @property
    def mean_cost_usd(self) -> float:
        """Mean cost over runs."""
        return float(self.costs_usd.mean())


@dataclass
class SimResult:
    """The starts and every policy's runs."""

    model: SimModel
    start_rows: np.ndarray
    runs: dict[str, PolicyRuns] = field(default_factory=dict)

    def summary(self) -> dict[str, dict[str, float | int | None]]:
        """Per policy: runs, mean cost, ratios of mean costs, share of deadlines met."""
        od = self.model.on_demand_cost_usd()
        opt = self.runs.get(OPTIMAL)
        out: dict[str, dict[str, float | int | None]] = {}
        for name, r in self.runs.items():
            mean = r.mean_cost_usd
            out[name] = {
                "runs": int(len(r.costs_usd)),
                "mean_cost_usd": round(mean, 4),
                "mean_cost_vs_on_demand": round(mean / od, 6) if od > 0 else None,
                "mean_cost_vs_optimal": (round(mean / opt.mean_cost_usd, 6)
                                         if opt is not None and opt.mean_cost_usd > 0 else None),
                "deadline_met_fraction": float(r.deadline_met.mean()),
            }
        return out


_Part = tuple[np.ndarray, np.ndarray, list | None, np.ndarray | None, np.ndarray | None]


def _task(args: tuple[str, np.ndarray, bool]) -> _Part:
    name, rows, record = args
    model = _MODEL
    assert model is not None
    if name == OPTIMAL:
        if not record:
            costs = optimal_costs(model, rows)
            # The optimum prices no move: it runs across clouds only when moves are free.
            return costs, np.isfinite(costs), None, np.zeros(len(costs)), None
        costs, met, decs, moves = [], [], [], []
        for row in rows:
            cost, schedule = optimal_schedule(model, int(row))
            replay = run_policy(model, ScheduledPolicy(schedule), int(row), record=True)
            if abs(replay.cost_usd - cost) > 1e-6 * max(1.0, cost):
                raise SpotrunError(f"optimal schedule replays to {replay.cost_usd} not {cost}",
                                   field="optimal", value=int(row))
            costs.append(replay.cost_usd)
            met.append(replay.deadline_met)
            decs.append(replay.decisions)
            moves.append(replay.moves)
        return np.asarray(costs), np.asarray(met), decs, np.zeros(len(costs)), np.asarray(moves)
    costs, met, decs, egress, moves = [], [], [], [], []
    for row in rows:
        r = run_policy(model, make_policy(name), int(row), record=record)
        costs.append(r.cost_usd)
        met.append(r.deadline_met)
        egress.append(r.egress_usd)
        moves.append(r.moves)
        if record:
            decs.append(r.decisions)
    return (np.asarray(costs), np.asarray(met), (decs if record else None), np.asarray(egress),
            np.asarray(moves))


def run_policies(model: SimModel, start_rows: np.ndarray, policies: list[str], *,
                 workers: int = 1, record: bool = False) -> SimResult:
    """Run each named policy on every start; optimal is batched unless decisions are recorded."""
    global _MODEL
    for name in policies:
        if name != OPTIMAL:
            make_policy(name)            # validates the name before any work
        elif model.moves is not None and not model.moves.free:
            raise SpotrunError("the optimum prices no move between clouds", field="optimal")
    _MODEL = model
    tasks = []
    chunk = max(_CHUNK_RUNS, -(-len(start_rows) // max(1, workers * 2)))
    for name in policies:
        size = chunk if name == OPTIMAL else _CHUNK_RUNS
        for i in range(0, len(start_rows), size):
            tasks.append((name, start_rows[i:i + size], record))
    try:
        if workers > 1 and len(tasks) > 1:
            with mp.get_context("fork").Pool(workers) as pool:
                parts = pool.map(_task, tasks, chunksize=1)
        else:
            parts = [_task(t) for t in tasks]
    finally:
        _MODEL = None
    result = SimResult(model=model, start_rows=np.asarray(start_rows))
    for name in policies:
        mine = [p for t, p in zip(tasks, parts) if t[0] == name]
        decs = None
        if record:
            decs = [d for p in mine for d in (p[2] or [])]
        known_moves = all(p[4] is not None for p in mine)
        result.runs[name] = PolicyRuns(name=name,
                                       costs_usd=np.concatenate([p[0] for p in mine]),
                                       deadline_met=np.concatenate([p[1] for p in mine]),
                                       decisions=decs,
                                       egress_usd=np.concatenate([p[3] for p in mine]),
                                       moves=(np.concatenate([p[4] for p in mine])
                                              if known_moves else None))
    return result

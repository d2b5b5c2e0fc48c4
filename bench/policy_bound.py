"""How much of the gap can ANY online policy close? An achievability bound (issue 14, bench only).

Synthetic family (`spotrun/simulate/synthetic.py`): the generator is known exactly: per
pool geometric up/down runs with known means per half, market-wide outages (a geometric
on/off process) in the second half, prices known per half, the halves independent. A
policy that knows all of that AND sees the generator's hidden state now (each pool's own
up/down state and the shared outage state separately, which the market only shows as
their AND) is at least as well informed as any non-anticipating policy, so its expected
cost is a lower bound on every online policy's expected cost under the same safety net.
It is solved exactly by dynamic programming (bench/mdp.py; the joint chain of every
allowed pool and the shared state: 4 states single pool, 32 all pools) and run through
the same simulator (`run_policy`) on the same starts as bench/policy.py.

Real traces, `--oracle-lite`: single pool, the MDP-optimal policy for a 2-state Markov
chain per pool fitted to the WHOLE trace (it sees the future's statistics, so it
upper-bounds what learning a Markov model online can reach), prices as in the trace; all
pools, spotrun's own plan (`markov-tiers`, the plan behind `spotrun`) with its market
model fitted to the WHOLE trace instead of the rows seen so far (`WholeTraceTiers`): what
that model class reaches when it knows the trace's statistics. Both are indicative, not
bounds: a richer model could do better.

    .venv/bin/python bench/policy_bound.py --optimal-cache /tmp/opt40.npz --json /tmp/bound.json
    .venv/bin/python bench/policy_bound.py --starts 12 --traces synthetic
    .venv/bin/python bench/policy_bound.py --oracle-lite --traces 16-node 4-node demo
    .venv/bin/python bench/policy_bound.py --oracle-lite --pools all \
        --traces 9-zone 16-node 4-node demo

Printed per setting: mean cost / mean optimal of greedy, uniform-progress and the bound,
the share of the better rule's gap to optimal that the bound closes, and the bound's own
expected cost (the DP's value at each start's state) against its realised cost; then the
mean closure, single pool and all pools. The cache file is bench/policy.py's format.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

# Small matrix products per tick: BLAS threads only spin on a loaded machine (5 x slower).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import policy as bp                                     # noqa: E402  bench/policy.py
from mdp import MarkovDP, chain2, kron_all, stationary2  # noqa: E402

from spotrun.errors import BadInputError               # noqa: E402
from spotrun.decide.policy import make_policy          # noqa: E402
from spotrun.decide.policy import markov as mk           # noqa: E402
from spotrun.decide.policy.base import (IDLE, ON_DEMAND, Decision, JobProgress,  # noqa: E402
                                        Mode, SafePolicy, job_shape, safety_net)
from spotrun.decide.policy.markov_refit import base_row  # noqa: E402
from spotrun.simulate import synthetic as syn           # noqa: E402
from spotrun.simulate.engine import run_policy          # noqa: E402
from spotrun.simulate.optimal import optimal_costs      # noqa: E402
from spotrun.simulate.model import build_model, pick_starts  # noqa: E402

BOUND = "bound"
SHARED = (48.0, 24.0)           # synthetic.py's market-wide on/off runs (second half)


def synthetic_hidden(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(x [rows, pools], s [rows]): each pool's own state and the shared state, as generated."""
    rng = np.random.default_rng(seed)
    half, rows, n_pools = syn.ROWS // 2, syn.ROWS, len(syn.POOLS)
    x = np.zeros((rows, n_pools), dtype=bool)
    for j in range(n_pools):
        x[:half, j] = syn._alternating(rng, half, *syn.REGIMES[0])
        x[half:, j] = syn._alternating(rng, rows - half, *syn.REGIMES[1])
    s = np.ones(rows, dtype=bool)
    s[half:] = syn._alternating(rng, rows - half, *SHARED)
    trace, _ = syn.regime_change_market(seed)
    if not ((x & s[:, None]).astype(np.int64) == trace.available).all():
        raise SystemExit("synthetic_hidden no longer reproduces synthetic.py's market")
    return x, s


class SyntheticModel:
    """The generator as a Markov chain over (shared state, pools' own states) for some pools."""

    def __init__(self, cols: list[int], seed: int) -> None:
        x, s = synthetic_hidden(seed)
        n = len(cols)
        self.half = syn.ROWS // 2
        self.window = syn.ROWS            # set to the job's deadline by run_one
        bits = np.arange(2 ** (n + 1))
        self.obs = np.stack([((bits >> j) & 1).astype(bool) & ((bits >> n) & 1).astype(bool)
                             for j in range(n)], axis=1)
        first_s = np.array([[0.0, 1.0], [0.0, 1.0]])           # no shared outage
        self.t1 = kron_all([first_s] + [chain2(*syn.REGIMES[0])] * n)
        self.t2 = kron_all([chain2(*SHARED)] + [chain2(*syn.REGIMES[1])] * n)
        init = kron_all([stationary2(*SHARED)[None, :]]
                        + [stationary2(*syn.REGIMES[1])[None, :]] * n)
        self.tb = np.repeat(init, len(bits), axis=0)             # the halves are independent
        self.hidden = (x[:, cols].astype(np.int64) << np.arange(n)).sum(axis=1) + \
            (s.astype(np.int64) << n)

    def trans(self, start: int) -> tuple[object, callable]:
        """(key, trans(tau)) for a window starting at row `start` (same key, same chain)."""
        half = self.half

        def f(tau: int) -> np.ndarray:
            t = start + tau
            return self.tb if t + 1 == half else (self.t1 if t + 1 < half else self.t2)
        return ("syn", min(max(half - start, 0), self.window)), f


class FittedModel:
    """One pool, a 2-state Markov chain fitted to its whole column (oracle-lite)."""

    def __init__(self, up: np.ndarray) -> None:
        up = np.asarray(up, dtype=bool)
        a, b = up[:-1], up[1:]
        p_ud = (a & ~b).sum() / max(a.sum(), 1)
        p_du = (~a & b).sum() / max((~a).sum(), 1)
        self.t = np.array([[1 - p_du, p_du], [p_ud, 1 - p_ud]])
        self.obs = np.array([[False], [True]])
        self.hidden = up.astype(np.int64)

    def trans(self, start: int) -> tuple[object, callable]:
        """(key, trans(tau)): time-homogeneous."""
        return ("fit",), lambda tau: self.t


class BoundPolicy(SafePolicy):
    """Follows a solved MarkovDP, reading the hidden state of the current row."""

    name = BOUND

    def __init__(self, dp: MarkovDP, hidden: np.ndarray, pools: list[str]) -> None:
        self.dp, self.hidden, self.pools = dp, hidden, pools
        self.overridden = 0

    def choose(self, job: JobProgress, market) -> Decision:
        """The DP's argmin at (tau, hidden state, placement, lost)."""
        tick = job.tick_s
        tau = round(job.elapsed_s / tick)
        lost = tau - round(job.work_done_s / tick)
        k = None
        if job.mode is Mode.IDLE:
            m = 0
        else:
            k = 0 if job.mode is Mode.ON_DEMAND else 1 + self.pools.index(job.pool)
            m = self.dp.m_index(k, round(job.changeover_left_s / tick))
        c = self.dp.choice(tau, int(self.hidden[market.now]), m, lost)
        if c == -1:
            return IDLE
        if c == 0:
            return job.current
        return ON_DEMAND if c == 1 else Decision(Mode.SPOT, self.pools[c - 2])

    def decide(self, job: JobProgress, market) -> Decision:
        """The DP's choice; counts where the safety net would change it (it should not)."""
        if job.remaining_s <= 1e-6:
            return IDLE
        want = self.choose(job, market)
        got = safety_net(job, want)
        self.overridden += got != want
        return got


class WholeTraceTiers(mk.MarkovTiersPolicy):
    """`markov-tiers` with its model fitted to the whole trace at every refit (oracle-lite,
    all pools): the refit rows and the tiers' prices are the plan's own, the transitions
    and reclaim rates are the whole trace's, so there is no surprise to refit on."""

    name = BOUND

    def table(self, job: JobProgress, market) -> mk.dp.Table:
        """The plan solved on the whole trace's model at the plan's latest refit row."""
        h, shape = market.h, job_shape(job)
        row = base_row(h, market.now, mk.refit_ticks(shape[1]), self.max_tiers)
        return mk.table_for(h, row, shape, self.max_tiers, rows=(0, len(h)))


def run_whole_trace(model, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Realised cost of WholeTraceTiers per start (its expected cost is not computed: NaN)."""
    costs = np.array([run_policy(model, WholeTraceTiers(), int(r)).cost_usd for r in rows])
    return costs, np.full(len(rows), np.nan), 0


def run_bound(model, rows: np.ndarray, cols_model) -> tuple[np.ndarray, np.ndarray, int]:
    """Realised and expected cost of the bound policy per start (one DP per distinct window)."""
    h = model.history
    tick_h = model.tick_h
    by_key: dict = {}
    for i, r in enumerate(rows):
        key, f = cols_model.trans(int(r))
        pw = h.price[r:r + model.deadline_ticks]
        key = (key, hashlib.sha1(np.ascontiguousarray(pw).tobytes()).hexdigest())
        by_key.setdefault(key, (f, []))[1].append(i)
    costs, expect = np.empty(len(rows)), np.empty(len(rows))
    over = 0
    for key, (f, idx) in by_key.items():
        r0 = int(rows[idx[0]])
        price = np.empty((model.deadline_ticks, 1 + len(h.pools)))
        price[:, 0] = h.od_price_usd_per_hour * tick_h
        price[:, 1:] = h.price[r0:r0 + model.deadline_ticks] * tick_h
        dp = MarkovDP(model.work_ticks, model.deadline_ticks, model.changeover_ticks,
                      cols_model.obs, f, price)
        for i in idx:
            r = int(rows[i])
            pol = BoundPolicy(dp, cols_model.hidden, h.pools)
            res = run_policy(model, pol, r)
            assert res.deadline_met, f"bound missed a deadline at row {r}"
            costs[i] = res.cost_usd
            expect[i] = dp.v0[int(cols_model.hidden[r])]
            over += pol.overridden
        del dp
    return costs, expect, over


def run_one(task: tuple) -> dict | None:
    """Rules, optimal (unless cached) and the bound on one (trace, pools, job); None: no fit."""
    label, pools, work_h, factor, args, cached = task
    trace, prices = bp._load(label)
    nodes = next(t[3] for t in bp.TRACES if t[0] == label)
    try:
        model = build_model(trace.select(pools), prices,
                            spot_price_usd_per_hour=None if prices else bp.FLAT_SPOT_USD_PER_HOUR,
                            od_price_usd_per_hour=bp.OD_PRICE_USD_PER_HOUR, work_hours=work_h,
                            deadline_hours=work_h * factor,
                            changeover_hours=args.changeover_hours, nodes=nodes)
    except BadInputError:
        return None
    rows = pick_starts(model, starts=args.starts, seed=args.seed, t0=None)
    t0 = time.monotonic()
    opt = cached if cached is not None else optimal_costs(model, rows)
    costs = {}
    for name in args.policies:
        costs[name] = np.array([run_policy(model, make_policy(name), int(r)).cost_usd
                                for r in rows])
    if label == "synthetic":
        cm = SyntheticModel([trace.pools.index(p) for p in pools], seed=0)
        cm.window = model.deadline_ticks
        bc, be, over = run_bound(model, rows, cm)
    elif len(pools) == 1:
        bc, be, over = run_bound(model, rows, FittedModel(model.history.up[:, 0]))
    else:
        bc, be, over = run_whole_trace(model, rows)
    costs[BOUND] = bc
    assert (bc >= opt - 1e-9 * np.maximum(1.0, opt)).all(), "bound beat the hindsight optimum"
    mo = opt.mean()
    print(f"  done {label} {','.join(pools)} {work_h:g} h x{factor:g}: "
          f"{time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    return {"opt_costs": opt, "ratio": {n: float(c.mean() / mo) for n, c in costs.items()},
            "expected_ratio": float(be.mean() / mo), "overridden": over,
            "seconds": time.monotonic() - t0}


def main() -> None:
    """Run the bound over the bench settings and print the table and mean closures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=40)
    ap.add_argument("--optimal-cache", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--changeover-hours", type=float, default=0.2)
    ap.add_argument("--traces", nargs="+", default=["synthetic"])
    ap.add_argument("--oracle-lite", action="store_true",
                    help="real traces: plans whose market model is fitted to the whole trace")
    ap.add_argument("--pools", choices=("single", "all", "both"), default="single",
                    help="real traces with --oracle-lite: single pools (the 2-state chain), "
                         "all pools (markov-tiers on the whole trace), or both")
    ap.add_argument("--policies", nargs="+", default=list(bp.RULES))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    cache = bp.load_cache(args.optimal_cache)
    t_start = time.monotonic()
    tasks, meta = [], []
    for label in args.traces:
        if label != "synthetic" and not args.oracle_lite:
            raise SystemExit(f"--traces {label}: real traces need --oracle-lite")
        trace, _ = bp._load(label)
        for work_h in bp.WORK_HOURS:
            for factor in bp.DEADLINE_FACTORS:
                wanted = "both" if label == "synthetic" else args.pools
                for setting, pool_sets in (("single", [[p] for p in trace.pools]),
                                           ("all", [list(trace.pools)])):
                    if wanted not in ("both", setting):
                        continue
                    for pools in pool_sets:
                        key = bp._cache_key(label, pools, work_h, work_h * factor, args)
                        tasks.append((label, pools, work_h, factor, args, cache.get(key)))
                        meta.append((label, setting, work_h, factor, key))
    results = bp.run_biggest_first(run_one, tasks, args.workers,
                                   lambda t: t[2] * t[3] * 4 ** len(t[1]))
    bp.save_cache(args.optimal_cache, cache, meta, results)
    table = report(meta, results, args)
    print(f"\nwall time: {time.monotonic() - t_start:.0f} s ({args.starts} starts per setting, "
          f"{args.workers} workers)")
    if args.json:
        args.json.write_text(json.dumps(table, indent=1))


def report(meta: list, results: list, args) -> list[dict]:
    """Print per setting and the means; returns the rows."""
    groups: dict[tuple, list[dict]] = {}
    for (label, setting, work_h, factor, _), r in zip(meta, results):
        if r is not None:
            groups.setdefault((label, setting, work_h, factor), []).append(r)
    names = [*args.policies, BOUND]
    print(f"{'trace':10} {'pools':6} {'work':>5} {'dl':>5} " + "".join(f"{n[:10]:>11}" for n in names)
          + f" {'E[bound]':>9} {'closed':>8} {'net':>4}")
    rows, acc = [], {}
    for (label, setting, work_h, factor), rs in groups.items():
        ratio = {n: float(np.mean([r["ratio"][n] for r in rs])) for n in names}
        exp = float(np.mean([r["expected_ratio"] for r in rs]))
        exp = None if np.isnan(exp) else exp        # whole-trace markov-tiers: not computed
        better = min(ratio[n] for n in bp.RULES)
        cl = bp.closure(better, ratio[BOUND])
        over = sum(r["overridden"] for r in rs)
        acc.setdefault((label == "synthetic", setting), []).append((cl, better - 1,
                                                                    better - ratio[BOUND]))
        print(f"{label:10} {setting:6} {work_h:5g} {factor:5g} "
              + "".join(f"{ratio[n]:11.4f}" for n in names)
              + (f" {exp:9.4f}" if exp is not None else f" {'-':>9}") + f" {cl:8.1%} {over:4d}")
        rows.append({"trace": label, "setting": setting, "work_h": work_h, "factor": factor,
                     "ratio": ratio, "expected_bound_ratio": exp, "closed": cl,
                     "net_overrides": over})
    print("\nshare of the better rule's gap to optimal that the bound closes:")
    for (is_syn, setting), items in acc.items():
        mean = float(np.mean([x[0] for x in items]))
        summed = sum(x[2] for x in items) / max(sum(x[1] for x in items), 1e-12)
        kind = ("synthetic (known generator)" if is_syn else
                "real traces (oracle-lite" + (", markov-tiers)" if setting == "all" else ")"))
        print(f"  {kind}, {setting}: {len(items)} settings; mean {mean:.1%}, "
              f"of the summed gap {summed:.1%}, lowest {min(x[0] for x in items):.1%}")
    return rows


if __name__ == "__main__":
    main()

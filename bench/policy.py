"""Policy benchmark (issue 7): each policy's mean cost against on-demand and the optimum.

9-zone p3.2xlarge availability trace with its spot prices (../shared/traces, copied
under spotrun/data/traces if present), 48 h of work, changeover 0.2 h, deadlines
60/72/96 h, seeded starts (the same for every policy), one zone at a time (averaged
over the 9 zones) and all 9 zones together. Asserts that every run meets its
deadline and that no policy ever beats `optimal`.

    .venv/bin/python bench/policy.py                 # the recorded figures (300 starts)
    .venv/bin/python bench/policy.py --quick         # a quick look (60 starts)
    .venv/bin/python bench/policy.py --optimal-cache /tmp/opt.npz   # reuse optimal's costs
    .venv/bin/python bench/policy.py --heldout       # also the traces it was not tuned on

`--optimal-cache` keeps `optimal`'s costs per setting (pools, deadline, starts, seed,
work, changeover) in an .npz file, so iterating on an online policy skips the DP.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from spotrun.policy import ALL_POLICY_NAMES, OPTIMAL
from spotrun.simulate.model import build_model, pick_starts
from spotrun.simulate.runner import PolicyRuns, run_policies
from spotrun.traces import load_prices, load_trace

ROOT = Path(__file__).resolve().parents[1]
TRACE = "aws_p3.2xlarge_availability_2023-02-15_9az.csv"
PRICES = "aws_p3.2xlarge_spot_price_changes_2023-02-15_9az.csv"
RULES = ("greedy", "uniform-progress")
OD_PRICE_USD_PER_HOUR = 3.06     # p3.2xlarge on-demand, us-east-1 (BRIEF section 1)
# Held-out traces (other months, 300 s ticks, no price file): (label, file, nodes needed).
HELDOUT = (("16-node avail., 1 node", "aws_p3.2xlarge_16node_availability_2023-08-27.csv", 1),
           ("16-node avail., 8 nodes", "aws_p3.2xlarge_16node_availability_2023-08-27.csv", 8),
           ("4-node preempt., 4 nodes", "aws_p3.2xlarge_4node_preemption_2023-08-03.csv", 4),
           ("4-node preempt., 1 node", "aws_p3.2xlarge_4node_preemption_2023-08-03.csv", 1))
# Their spot price: what us-east-2 / us-west-2 charged most of the time in the 9-zone price file.
HELDOUT_SPOT_USD_PER_HOUR = 0.918


def _find(name: str) -> Path:
    for d in (ROOT / "spotrun" / "data" / "traces", ROOT.parent / "shared" / "traces",
              Path("/work/shared/traces")):
        if (d / name).exists():
            return d / name
    raise SystemExit(f"trace file {name} not found")


def _cache_key(trace, pools: list[str], deadline_h: float, args, starts: int,
               nodes: int) -> str:
    # the trace's file is part of it: held-out traces share zone names with the 9-zone one
    return "|".join([Path(str(trace.source)).name, ",".join(pools), f"{deadline_h:g}",
                     str(starts), f"n{nodes}", str(args.seed), f"{args.work_hours:g}",
                     f"{args.changeover_hours:g}"])


def run_setting(trace, prices, pools: list[str], deadline_h: float, args,
                cache: dict[str, np.ndarray] | None = None, *, nodes: int = 1,
                starts: int | None = None) -> dict:
    """Run every policy on one (pools, deadline) setting; check the invariants."""
    starts = starts or args.starts
    model = build_model(trace.select(pools), prices,
                        spot_price_usd_per_hour=(HELDOUT_SPOT_USD_PER_HOUR if prices is None
                                                 else None),
                        od_price_usd_per_hour=OD_PRICE_USD_PER_HOUR, work_hours=args.work_hours,
                        deadline_hours=deadline_h, changeover_hours=args.changeover_hours,
                        nodes=nodes)
    rows = pick_starts(model, starts=starts, seed=args.seed, t0=None)
    key = _cache_key(trace, pools, deadline_h, args, starts, nodes)
    cached = cache.get(key) if cache is not None else None
    names = [n for n in ALL_POLICY_NAMES if n != OPTIMAL or cached is None]
    res = run_policies(model, rows, names, workers=args.workers)
    if cached is not None:
        res.runs[OPTIMAL] = PolicyRuns(OPTIMAL, cached, np.isfinite(cached))
    elif cache is not None:
        cache[key] = res.runs[OPTIMAL].costs_usd
    opt = res.runs[OPTIMAL].costs_usd
    for name, r in res.runs.items():
        assert r.deadline_met.all(), f"{name} missed a deadline ({pools}, {deadline_h} h)"
        worse = r.costs_usd < opt - 1e-9 * np.maximum(1.0, opt)
        assert not worse.any(), f"{name} beat optimal at rows {rows[worse][:5]}"
    return res.summary()


def closure(better: float, ours: float) -> float:
    """Share of the better rule's gap to optimal (ratio 1) that ours closes."""
    return (better - ours) / (better - 1.0) if better > 1.0 else 0.0


def main() -> None:
    """Run the benchmark and print the tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=300)
    ap.add_argument("--quick", action="store_true", help="60 starts (not the recorded figures)")
    ap.add_argument("--optimal-cache", type=Path, help=".npz file of optimal's costs to reuse")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--work-hours", type=float, default=48.0)
    ap.add_argument("--changeover-hours", type=float, default=0.2)
    ap.add_argument("--deadlines", type=float, nargs="+", default=[60.0, 72.0, 96.0])
    ap.add_argument("--json", type=Path, help="also write the figures to this file")
    ap.add_argument("--heldout", action="store_true",
                    help="also run the 16-node and 4-node traces (not used for tuning)")
    ap.add_argument("--heldout-starts", type=int, default=100)
    args = ap.parse_args()
    if args.quick:
        args.starts = 60
    cache: dict[str, np.ndarray] | None = None
    if args.optimal_cache:
        cache = {}
        if args.optimal_cache.exists():
            with np.load(args.optimal_cache) as z:
                cache = {k: z[k] for k in z.files}
    t_start = time.monotonic()
    trace, prices = load_trace(_find(TRACE)), load_prices(_find(PRICES))
    zones = trace.pools
    figures: dict = {"args": {k: (str(v) if isinstance(v, Path) else v)
                              for k, v in vars(args).items()}, "deadlines": {}}
    for deadline_h in args.deadlines:
        single = {z: run_setting(trace, prices, [z], deadline_h, args, cache) for z in zones}
        every = run_setting(trace, prices, zones, deadline_h, args, cache)
        avg = {name: {key: float(np.mean([single[z][name][key] for z in zones]))
                      for key in ("mean_cost_vs_on_demand", "mean_cost_vs_optimal")}
               for name in ALL_POLICY_NAMES}
        figures["deadlines"][str(deadline_h)] = {"single_zone_avg": avg, "all_zones": every,
                                                 "per_zone": single}
        print(f"deadline {deadline_h:g} h done ({time.monotonic() - t_start:.0f} s)",
              file=sys.stderr)
    if args.heldout:
        figures["heldout"] = run_heldout(args, cache)
        print(f"held-out traces done ({time.monotonic() - t_start:.0f} s)", file=sys.stderr)
    if cache is not None:
        with open(args.optimal_cache, "wb") as f:
            np.savez(f, **cache)
    print_tables(figures, args)
    if args.heldout:
        print_heldout(figures["heldout"], args)
    print(f"\nwall time: {time.monotonic() - t_start:.0f} s "
          f"({args.starts} starts, {args.workers} workers)")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


def run_heldout(args, cache: dict[str, np.ndarray] | None) -> dict:
    """The rules and spotrun on traces the policy was not tuned on (flat spot price)."""
    out: dict = {}
    for label, name, nodes in HELDOUT:
        trace = load_trace(_find(name))
        for deadline_h in args.deadlines:
            single = [run_setting(trace, None, [z], deadline_h, args, cache, nodes=nodes,
                                  starts=args.heldout_starts)
                      for z in trace.pools]
            every = run_setting(trace, None, trace.pools, deadline_h, args, cache, nodes=nodes,
                                starts=args.heldout_starts)
            for setting, summaries in (("single_zone_avg", single), ("all_zones", [every])):
                out.setdefault(label, {}).setdefault(setting, {})[str(deadline_h)] = {
                    n: float(np.mean([s[n]["mean_cost_vs_optimal"] for s in summaries]))
                    for n in (*RULES, "spotrun")}
    return out


def print_heldout(held: dict, args) -> None:
    """Mean cost / optimal of the rules and spotrun on the held-out traces."""
    dls = [str(d) for d in args.deadlines]
    print(f"\nheld-out traces ({args.heldout_starts} starts, flat spot "
          f"${HELDOUT_SPOT_USD_PER_HOUR}/h): mean cost / optimal at "
          + ", ".join(f"{float(d):g} h" for d in dls))
    for label, settings in held.items():
        for setting, by_dl in settings.items():
            cells = []
            for n in (*RULES, "spotrun"):
                cells.append(f"{n} " + "/".join(f"{by_dl[d][n]:.4f}" for d in dls))
            wins = sum(by_dl[d]["spotrun"] < min(by_dl[d][r] for r in RULES) for d in dls)
            print(f"{label:26} {setting:16} " + "  ".join(cells)
                  + f"  | spotrun best at {wins}/{len(dls)}")


def print_tables(figures: dict, args) -> None:
    """Mean cost vs on-demand and vs optimal per policy, deadline and setting; gap closure."""
    dls = list(figures["deadlines"])
    for setting, label in (("single_zone_avg", "single zone (mean over 9 zones)"),
                           ("all_zones", "all 9 zones")):
        print(f"\n{label}: mean cost / on-demand  |  mean cost / optimal")
        print(f"{'policy':18}" + "".join(f"{d + ' h':>10}" for d in dls) + "  |"
              + "".join(f"{d + ' h':>10}" for d in dls))
        for name in ALL_POLICY_NAMES:
            row = [figures["deadlines"][d][setting][name] for d in dls]
            print(f"{name:18}" + "".join(f"{r['mean_cost_vs_on_demand']:10.4f}" for r in row)
                  + "  |" + "".join(f"{r['mean_cost_vs_optimal']:10.4f}" for r in row))
        cl = []
        for d in dls:
            s = figures["deadlines"][d][setting]
            better = min(s[r]["mean_cost_vs_optimal"] for r in RULES)
            cl.append(closure(better, s["spotrun"]["mean_cost_vs_optimal"]))
        print(f"{'gap closed':18}" + "".join(f"{c:10.1%}" for c in cl)
              + f"  | mean {np.mean(cl):.1%}")
        figures.setdefault("closure", {})[setting] = cl


if __name__ == "__main__":
    main()

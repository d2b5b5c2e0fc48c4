"""Placement across two clouds beside each cloud alone (issue 43): `simulate`'s comparison.

Traces: there is no GCP trace in the shared folder, so the two clouds are two real AWS
p3.2xlarge traces of August 2023 (docs/simulate.md, "Several clouds"):

- aws: `aws_p3.2xlarge_16node_availability_2023-08-27.csv` (us-east-2b, us-west-2a,
  us-west-2c; a pool is up when one instance is obtainable), spot $0.918/h (what
  us-east-2 / us-west-2 charged most of the time in the 9-zone price file, as
  bench/policy.py prices it), on-demand $3.06/h;
- gcp: `aws_p3.2xlarge_4node_preemption_2023-08-03.csv` RELABELLED: three AWS zones stand in
  for GCP's, priced as GCP prices a V100 (the packaged catalog's n1-standard-8+v100x1 in
  us-central1: spot $1.193/h, on-demand $2.86/h) and moved out at GCP's egress rate.

Both have five-minute rows from their start; the second is cut to the first's 4,736 rows
(395 h). They were measured three weeks apart, so their outages are independent, as two
clouds' are. Jobs of 8 h (deadline 12 h) and 48 h (deadline 72 h), changeover 0.2 h, 40
seeded starts; checkpoints of 0 (moves free), 10 and 500 GB. Every policy runs across the
clouds and in each cloud alone on the same starts; the cloud-alone runs do not depend on the
checkpoint, so they run once per job. Printed per job and policy: each cloud alone, and per
checkpoint the cost across clouds, its saving over the best single cloud, the egress share
of that cost and the moves per run. The bench asserts that every run met its deadline.

    .venv/bin/python bench/clouds.py                     # the recorded figures
    .venv/bin/python bench/clouds.py --write-traces DIR  # and the two CSVs, for the CLI:
    spotrun simulate --trace aws=DIR/aws.csv --trace gcp=DIR/gcp.csv --spot-price aws=0.918 \\
      --spot-price gcp=1.19296 --od-price aws=3.06 --od-price gcp=2.86 --work-hours 8 \\
      --deadline-hours 12 --starts 40 --checkpoint-gb 500 --policy greedy --policy spotrun
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from spotrun.catalog import load_catalog
from spotrun.decide.policy import OPTIMAL
from spotrun.simulate.clouds import (CloudInput, CloudModels, CloudsResult, across_policies,
                                     build_cloud_models)
from spotrun.simulate.model import pick_starts
from spotrun.simulate.sweep import run_policies
from spotrun.traces import Trace, load_trace

AWS_TRACE = "aws_p3.2xlarge_16node_availability_2023-08-27.csv"
GCP_TRACE = "aws_p3.2xlarge_4node_preemption_2023-08-03.csv"     # relabelled as GCP
AWS_SPOT_USD_PER_HOUR = 0.918    # bench/policy.py's flat price of us-east-2 / us-west-2
AWS_OD_USD_PER_HOUR = 3.06       # p3.2xlarge, us-east-1
GCP_TYPE, GCP_REGION = "n1-standard-8+v100x1", "us-central1"
JOBS = ((8.0, 12.0), (48.0, 72.0))          # (work h, deadline h)
CHECKPOINTS_GB = (0.0, 10.0, 500.0)
POLICIES = ("greedy", "uniform-progress", "spotrun", OPTIMAL)
# The provider facts' notice quarantines (aws 720 s, gcp 630 s): three rows of five minutes.
QUARANTINE_S = {"aws": 720.0, "gcp": 630.0}


def _find(name: str) -> Path:
    root = Path(__file__).resolve().parents[1]
    for d in (root.parent / "shared" / "traces", Path("/work/shared/traces")):
        if (d / name).exists():
            return d / name
    raise SystemExit(f"trace file {name} not found")


def _cut(trace: Trace, rows: int) -> Trace:
    """The first rows of a trace."""
    return Trace(ticks=trace.ticks[:rows], elapsed_s=trace.elapsed_s[:rows], pools=trace.pools,
                 available=trace.available[:rows], source=trace.source)


def clouds() -> list[CloudInput]:
    """The two clouds: the AWS trace, and the other AWS trace relabelled with GCP's prices."""
    aws = load_trace(_find(AWS_TRACE))
    gcp = _cut(load_trace(_find(GCP_TRACE)), len(aws))
    gcp_type = load_catalog("gcp").types[GCP_TYPE]
    return [CloudInput("aws", aws, None, AWS_SPOT_USD_PER_HOUR, AWS_OD_USD_PER_HOUR),
            CloudInput("gcp", gcp, None, float(gcp_type.extra["spot_usd_per_hour"][GCP_REGION]),
                       gcp_type.on_demand_price(GCP_REGION))]


def write_traces(inputs: list[CloudInput], folder: Path) -> None:
    """Each cloud's (cut) trace as an availability CSV the CLI reads."""
    folder.mkdir(parents=True, exist_ok=True)
    for c in inputs:
        lines = ["tick,elapsed_s," + ",".join(c.trace.pools)]
        for i in range(len(c.trace)):
            cells = ["" if x < 0 else str(x) for x in c.trace.available[i]]
            lines.append(f"{c.trace.ticks[i]},{c.trace.elapsed_s[i]:g}," + ",".join(cells))
        (folder / f"{c.name}.csv").write_text("\n".join(lines) + "\n")


def run_job(inputs: list[CloudInput], work_h: float, deadline_h: float, args) -> dict:
    """Every policy in each cloud alone once, then across clouds per checkpoint size."""
    per_gb: dict[float, dict] = {}
    alone = None
    rows = None
    for gb in args.checkpoints:
        models: CloudModels = build_cloud_models(
            inputs, work_hours=work_h, deadline_hours=deadline_h,
            changeover_hours=args.changeover_hours, nodes=1, checkpoint_gb=gb,
            quarantine_s=QUARANTINE_S)
        if rows is None:
            rows = pick_starts(models.across, starts=args.starts, seed=args.seed, t0=None)
            alone = {c: run_policies(m, rows, list(args.policies), workers=args.workers)
                     for c, m in models.alone.items()}
        across = run_policies(models.across, rows, across_policies(models, list(args.policies)),
                              workers=args.workers)
        result = CloudsResult(models=models, across=across, alone=alone or {})
        for r in [*across.runs.values(), *(x for a in result.alone.values()
                                           for x in a.runs.values())]:
            assert r.deadline_met.all(), f"{r.name} missed a deadline ({work_h} h, {gb} GB)"
        per_gb[gb] = result.summary()
    return per_gb


def print_job(work_h: float, deadline_h: float, per_gb: dict, policies: list[str]) -> None:
    """One block per job: each cloud alone, then per checkpoint across clouds and saving."""
    first = next(iter(per_gb.values()))
    clouds_ = list(first[policies[0]]["mean_cost_alone_usd"])
    print(f"\njob {work_h:g} h, deadline {deadline_h:g} h (mean $ per run; saving: across "
          f"clouds against the best single cloud; egress: its share of the cost across)")
    head = f"{'policy':17}" + "".join(f"{c + ' alone':>10}" for c in clouds_)
    for gb in per_gb:
        head += f" | {f'{gb:g} GB: across':>16} {'saving':>7} {'egress':>6} {'moves':>5}"
    print(head)
    for name in policies:
        s0 = first[name]
        line = f"{name:17}" + "".join(f"{s0['mean_cost_alone_usd'][c]:10.2f}" for c in clouds_)
        for gb, summary in per_gb.items():
            s = summary[name]
            if s["mean_cost_usd"] is None:
                line += f" | {'-':>16} {'-':>7} {'-':>6} {'-':>5}"
                continue
            share = (s["mean_egress_usd"] or 0.0) / s["mean_cost_usd"]
            moves = "-" if s["moves_per_run"] is None else f"{s['moves_per_run']:.2f}"
            line += (f" | {s['mean_cost_usd']:16.2f} {s['saving_vs_best_single_cloud_pct']:+6.1f}%"
                     f" {share:6.1%} {moves:>5}")
        print(line)


def main() -> None:
    """Run the comparison and print it."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--changeover-hours", type=float, default=0.2)
    ap.add_argument("--checkpoints", type=float, nargs="+", default=list(CHECKPOINTS_GB))
    ap.add_argument("--policies", nargs="+", default=list(POLICIES))
    ap.add_argument("--write-traces", type=Path, metavar="DIR",
                    help="also write the two clouds' CSVs here (aws.csv, gcp.csv)")
    args = ap.parse_args()
    began = time.monotonic()
    inputs = clouds()
    if args.write_traces:
        write_traces(inputs, args.write_traces)
    print(f"aws: {AWS_TRACE} ({', '.join(inputs[0].trace.pools)}), spot "
          f"${inputs[0].spot_price_usd_per_hour:g}/h, on-demand ${inputs[0].od_price_usd_per_hour:g}/h")
    print(f"gcp: {GCP_TRACE} RELABELLED (AWS zones {', '.join(inputs[1].trace.pools)} standing "
          f"in for GCP's), GCP's V100 prices: spot ${inputs[1].spot_price_usd_per_hour:.3f}/h, "
          f"on-demand ${inputs[1].od_price_usd_per_hour:g}/h; first {len(inputs[0].trace)} rows "
          f"of 300 s of both")
    for work_h, deadline_h in JOBS:
        per_gb = run_job(inputs, work_h, deadline_h, args)
        print_job(work_h, deadline_h, per_gb, list(args.policies))
    print(f"\noptimal: across clouds with free moves only (its programme prices no move); "
          f"every run met its deadline (asserted)\nwall time: {time.monotonic() - began:.0f} s "
          f"({args.starts} starts, {args.workers} workers)")


if __name__ == "__main__":
    main()

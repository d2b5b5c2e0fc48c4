#!/usr/bin/env python3
"""Regenerate spotrun/data/risk/reclaim_priors.yaml from the shared spot traces.

    .venv/bin/python tools/reclaim_priors.py --traces /work/shared/traces \
        --out spotrun/data/risk/reclaim_priors.yaml

tests/test_risk_priors.py runs this script and checks its output equals the packaged file.

Which traces are pooled, and why (all three measured p3.2xlarge, so they all feed family p3):
- the 9-zone trace (Feb-Apr 2023) is a launch probe: 1 = one p3.2xlarge could be launched.
  A reclaim is an available -> unavailable flip, the exposure the hours available
  (spotrun.costmodel.priors.zone_priors_from_trace, the rule behind aws.yaml's
  preemption_priors). It is the only source for six of the nine zones.
- the 4-node trace (Aug 2023) holds real reclaims: how many of 4 running instances were still
  alive. Counted per instance: each instance lost is one reclaim and the exposure is
  instance-hours alive, which is the unit the daemon itself observes (a running instance
  reclaimed per hour it ran). Pooled with the probes because both estimate that one hazard;
  where they overlap in zone (us-east-1f: probe 2.27 h, real 2.15 h between reclaims) they agree.
- the 16-node trace (Aug 2023) records how many of 16 *requested* instances were obtainable:
  capacity, like the 9-zone probe, not instances held. It is pooled in its one-instance view
  (>= 1 obtainable = a launch of one succeeds, the 9-zone definition). Counting its drops per
  instance instead gives similar figures (us-west-2a 1.85 h vs 1.80 h, us-west-2c 1.97 vs
  1.95 h), so the choice does not move the prior. It is kept because it is the only later
  season for us-east-2b and us-west-2a, and that season was worse: a prior built from
  Feb-Apr alone would be too optimistic there.
Pooling = summing exposure and reclaims per zone (each source weighted by its hours), the
same rule the region and whole-family rows use. Blank cells (a zone's trace ended) are
censoring, never reclaims.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import yaml

from spotrun.costmodel.priors import zone_priors_from_trace
from spotrun.traces import load_trace

SPOT_TRACES = ("public spot-traces data of \"Can't Be Late\" (NSDI'24), "
               "github.com/skypilot-org/spot-traces commit 221da1ab")
# key -> (file in the traces folder, how it is counted, what it measured)
SOURCES: dict[str, dict[str, str]] = {
    "9az": {"file": "aws_p3.2xlarge_availability_2023-02-15_9az.csv", "counting": "probe",
            "instance_type": "p3.2xlarge", "origin": SPOT_TRACES,
            "measured": "launch probe, 1 instance, ~195 s ticks, 2023-02-15 -> 2023-04-02"},
    "16node": {"file": "aws_p3.2xlarge_16node_availability_2023-08-27.csv", "counting": "probe",
               "instance_type": "p3.2xlarge", "origin": SPOT_TRACES,
               "measured": "obtainable of 16 requested, 300 s ticks, from 2023-08-27; "
                           "one-instance view (>= 1 obtainable)"},
    "4node": {"file": "aws_p3.2xlarge_4node_preemption_2023-08-03.csv", "counting": "alive",
              "instance_type": "p3.2xlarge", "origin": SPOT_TRACES,
              "measured": "alive of 4 running (real reclaims), 300 s ticks, from 2023-08-03; "
                          "per instance"},
}


def family_of(instance_type: str) -> str:
    """The instance family: the type name before the dot (p3.2xlarge -> p3)."""
    return instance_type.split(".", 1)[0]


def region_of(zone: str) -> str:
    """us-east-1f -> us-east-1 (a zone is its region plus one letter)."""
    return zone[:-1] if zone and zone[-1].isalpha() else zone


def alive_counts(path: Path) -> dict[str, tuple[float, int]]:
    """Per zone: (instance-hours alive, instances lost) from a count-of-running-instances trace."""
    trace = load_trace(path)
    gaps = np.diff(trace.elapsed_s, append=trace.elapsed_s[-1] + trace.tick_s)
    out: dict[str, tuple[float, int]] = {}
    for j, zone in enumerate(trace.pools):
        a = trace.available[:, j]
        alive = np.clip(a, 0, None)
        # A drop between two recorded rows is that many reclaims; into blank is censoring.
        both = (a[:-1] >= 0) & (a[1:] >= 0)
        lost = int(np.clip(a[:-1] - a[1:], 0, None)[both].sum())
        out[zone] = (float((alive * gaps).sum() / 3600.0), lost)
    return out


def probe_counts(path: Path) -> dict[str, tuple[float, int]]:
    """Per zone: (hours available, available -> unavailable flips) from a launch-probe trace."""
    priors = zone_priors_from_trace(load_trace(path))
    return {z: (p.up_hours, p.reclaims) for z, p in priors.items()}


class _Flow(dict):
    """A mapping written on one line."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Flow, lambda d, m: d.represent_mapping("tag:yaml.org,2002:map", m,
                                                                 flow_style=True))


def _row(hours: float, reclaims: int) -> dict[str, float | int]:
    return _Flow({"up_hours": round(hours, 2), "reclaims": int(reclaims),
            "mtbf_h": round(hours / max(reclaims, 1), 2)})


def derive(traces: Path) -> dict:
    """The packaged document: sources, then per family the zone, region and family pools."""
    parts: dict[str, dict[str, dict[str, tuple[float, int]]]] = {}   # family -> zone -> key
    traced: dict[str, str] = {}
    for key, src in SOURCES.items():
        count = probe_counts if src["counting"] == "probe" else alive_counts
        counts = count(traces / src["file"])
        fam = family_of(src["instance_type"])
        traced.setdefault(fam, src["instance_type"])
        for zone, hn in counts.items():
            parts.setdefault(fam, {}).setdefault(zone, {})[key] = hn
    families: dict[str, dict] = {}
    for fam in sorted(parts):
        zones, regions = {}, {}
        total_h, total_n = 0.0, 0
        for zone in sorted(parts[fam]):
            by = parts[fam][zone]
            h = sum(v[0] for v in by.values())
            n = sum(v[1] for v in by.values())
            zones[zone] = _Flow({**_row(h, n),
                                 "parts": {k: [round(v[0], 2), v[1]] for k, v in by.items()}})
            rh, rn = regions.get(region_of(zone), (0.0, 0))
            regions[region_of(zone)] = (rh + h, rn + n)
            total_h, total_n = total_h + h, total_n + n
        families[fam] = {"traced_type": traced[fam], "zones": zones,
                         "regions": {r: _row(*regions[r]) for r in sorted(regions)},
                         "all": _row(total_h, total_n)}
    return {"sources": {k: {kk: v for kk, v in s.items()} for k, s in SOURCES.items()},
            "families": families}


HEADER = """\
# Reclaim priors per instance family and zone, derived from the shared spot traces.
# GENERATED by tools/reclaim_priors.py from the traces named under `sources` (see that script
# for which traces are pooled and why); do not edit by hand. tests/test_risk_priors.py re-runs
# the script and checks it reproduces this file. Only derived figures are kept here:
#   up_hours = exposure (hours available, or instance-hours alive), reclaims = events in it,
#   mtbf_h = up_hours / max(reclaims, 1); parts = [up_hours, reclaims] per source.
# regions and all pool the zones (sums). Read by spotrun.costmodel.risk.
"""


def render(doc: dict) -> str:
    """The YAML text, deterministic for one input."""
    return HEADER + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                              width=200)


def main(argv: list[str] | None = None) -> int:
    """Write the derived YAML (or print it with --out -)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="/work/shared/traces", help="folder of the shared traces")
    ap.add_argument("--out", default="spotrun/data/risk/reclaim_priors.yaml",
                    help="file to write ('-' = stdout)")
    args = ap.parse_args(argv)
    folder = Path(args.traces)
    missing = [s["file"] for s in SOURCES.values() if not (folder / s["file"]).is_file()]
    if missing:
        print(f"--traces: missing {', '.join(missing)} in {folder}", file=sys.stderr)
        return 2
    text = render(derive(folder))
    if args.out == "-":
        sys.stdout.write(text)
    else:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

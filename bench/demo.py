"""The demo's promises on a loaded machine: the paced market (candidate) beside a fixed x60
clock (peer), in one run, each demo under the same busy loops.

    python bench/demo.py --runs 10 --peer-runs 5 --load 6

Each run is `spotrun demo` in a fresh home, as `make demo` runs it. A run keeps its promises
when it exits 0: at least two reclaims, each attempt after the first resumed from a step > 0
its predecessor saved and trained past it, the job succeeded, the audit adds up (the demo
checks all of it and says what it proved). Prints one line per run, then the success rate
of each clock and the ratio of their mean wall times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from load import BusyLoad  # noqa: E402  (the suite's load tool: busy-loop processes)

SPOTRUN = [sys.executable, "-m", "spotrun"]


def one_run(pacing: str, stall_s: float, limit_s: float) -> dict:
    """One `spotrun demo` in a fresh home; its outcome from the demo's own checks."""
    with tempfile.TemporaryDirectory(prefix="demo-bench-") as tmp:
        home = Path(tmp) / "home"
        env = {**os.environ, "SPOTRUN_HOME": str(home), "COLUMNS": "100"}
        began = time.monotonic()
        argv = SPOTRUN + ["demo", "--pacing", pacing, "--stall-s", str(stall_s)]
        try:
            proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                                  timeout=limit_s)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            proc = subprocess.CompletedProcess(argv, 124, out + f"\nnot proved: still running "
                                               f"after {limit_s:.0f} s", "")
            subprocess.run(SPOTRUN + ["market", "stop"], env=env, capture_output=True)
        wall_s = time.monotonic() - began
        atts: list[dict] = []
        try:
            jobs = json.loads(subprocess.run(SPOTRUN + ["status", "--json"], env=env,
                                             capture_output=True, text=True).stdout)
            job = json.loads(subprocess.run(SPOTRUN + ["status", jobs[0]["id"], "--json"],
                                            env=env, capture_output=True, text=True).stdout)
            atts = job["attempts"]
        except (ValueError, IndexError, KeyError):
            pass
        failures = [line.split("not proved:", 1)[1].strip() for line in proc.stdout.splitlines()
                    if "not proved:" in line]
        return {"pacing": pacing, "ok": proc.returncode == 0, "wall_s": wall_s,
                "reclaims": sum(1 for a in atts if a["end_reason"] == "reclaimed"),
                "path": " ".join(f"{a['resumed_from'] or 0}->{a['ran_to'] or 0}" for a in atts),
                "failures": failures or ([] if proc.returncode == 0
                                         else [proc.stdout.strip().splitlines()[-1:]])}


def main() -> int:
    """Run the candidate and the peer under load; print the runs and the summary."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="paced (candidate) runs")
    ap.add_argument("--peer-runs", type=int, default=5, help="fixed-clock (peer) runs")
    ap.add_argument("--load", type=int, default=6, help="busy loops during every run")
    ap.add_argument("--stall-s", type=float, default=300.0)
    ap.add_argument("--limit-s", type=float, default=600.0, help="wall limit of one run")
    args = ap.parse_args()
    print(f"{os.cpu_count()} cores, {args.load} busy loops; spotrun demo, fresh home per run")
    results = []
    with BusyLoad(args.load):
        for pacing, n in (("rehearsal", args.runs), ("fixed", args.peer_runs)):
            for i in range(n):
                r = one_run(pacing, args.stall_s, args.limit_s)
                results.append(r)
                print(f"{pacing:9} run {i + 1:2}: {'ok  ' if r['ok'] else 'FAIL'} "
                      f"{r['wall_s']:6.1f} s  reclaims {r['reclaims']}  attempts {r['path']}"
                      + (f"  ({'; '.join(map(str, r['failures']))})" if not r["ok"] else ""),
                      flush=True)
    summary = {}
    for pacing in ("rehearsal", "fixed"):
        rs = [r for r in results if r["pacing"] == pacing]
        if rs:
            summary[pacing] = (sum(r["ok"] for r in rs), len(rs),
                               statistics.mean(r["wall_s"] for r in rs))
            ok, n, wall = summary[pacing]
            print(f"{pacing:9}: {ok}/{n} kept every promise; mean wall {wall:.1f} s")
    if len(summary) == 2:
        print(f"wall-time ratio rehearsal/fixed: {summary['rehearsal'][2] / summary['fixed'][2]:.2f}")
    return 0 if all(r["ok"] for r in results if r["pacing"] == "rehearsal") else 1


if __name__ == "__main__":
    sys.exit(main())

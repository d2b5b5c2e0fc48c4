"""Start-up time of the CLI verbs users run most: `status` and `submit`, against a bare Python.

Prints min and median wall seconds over N runs of each command, side by side with the floor
(an interpreter that imports nothing), and the ratio. Run: `.venv/bin/python bench/startup.py`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPEC = "name: bench\ncommand: python train.py\nwork: {total_steps: 100}\n"


def _time(argv: list[str], env: dict[str, str], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        p = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        out.append(time.perf_counter() - t0)
        if p.returncode != 0:
            raise SystemExit(f"{argv} failed: {p.stderr.decode()[-500:]}")
    return out


def main() -> None:
    """Time the verbs and print one row each."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="spotrun-bench-"))
    spec = home / "job.yaml"
    spec.write_text(SPEC)
    env = dict(os.environ, SPOTRUN_HOME=str(home / "home"))
    exe = [sys.executable, "-m", "spotrun"]
    subprocess.run(exe + ["submit", str(spec)], env=env, check=True, capture_output=True)
    floor = _time([sys.executable, "-c", "pass"], env, args.runs)
    rows = {"status": exe + ["status"], "status --json": exe + ["status", "--json"],
            "submit": exe + ["submit", str(spec)]}
    base = statistics.median(floor)
    print(f"{'command':<16} {'min s':>7} {'median s':>9} {'x bare python':>14}")
    print(f"{'python -c pass':<16} {min(floor):>7.3f} {base:>9.3f} {1.0:>14.1f}")
    for name, argv in rows.items():
        t = _time(argv, env, args.runs)
        print(f"{'spotrun ' + name:<16} {min(t):>7.3f} {statistics.median(t):>9.3f} "
              f"{statistics.median(t) / base:>14.1f}")


if __name__ == "__main__":
    main()

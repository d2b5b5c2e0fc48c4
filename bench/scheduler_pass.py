"""One scheduler pass at N queued jobs, in this process (issue 24, "Work per pass").

Fills a fresh home with N queued jobs through the product's own submit path (a spot job with
a price cap under every price, so each one waits and is decided on every pass it must be;
with --distinct each job has its own estimate, so no two decisions are alike),
starts the local market as the daemon does (a detached process on the home's market dir),
then times `SchedulerLoop.tick` three times: the first pass (every job decided), a second with
nothing changed, and a third after the market's prices moved (every job decided again).

    .venv/bin/python bench/scheduler_pass.py                  # N = 10, 100, 1000
    .venv/bin/python bench/scheduler_pass.py --jobs 10 200 --distinct
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from spotrun.config import load_settings
from spotrun.daemon.app import build_context
from spotrun.daemon.scheduler import SchedulerLoop
from spotrun.db import new_job_id
from spotrun.jobs import submit, validate_submission
from spotrun.providers.local.market.client import stop_market

SPEC = """name: waits
command: 'true'
work: {reference_hours: 1.0, reference_instance: p3.2xlarge}
policy: {market: spot, max_price_usd_per_hour: 0.01}
"""


def fill(home: Path, n: int, distinct: bool = False) -> None:
    """N queued jobs through validate_submission and submit (one validation, N rows)."""
    settings = load_settings(str(home))
    path = home / "waits.yaml"
    path.write_text(SPEC)
    sub = validate_submission(path, settings)
    ctx = build_context(settings)
    for k in range(n):
        job_id = new_job_id(f"waits{k}")   # ids are random: a number in each keeps them apart
        spec = replace(sub.spec, work=replace(sub.spec.work, reference_hours=1.0 + k / 1e4)) \
            if distinct else sub.spec
        submit(replace(sub, spec=spec, job_id=job_id,
                       checkpoint_uri=sub.checkpoint_uri.replace(sub.job_id, job_id)),
               ctx.engine)
    ctx.engine.dispose()


def passes(home: Path) -> list[float]:
    """Wall seconds of three scheduler passes: cold, unchanged, after a price move."""
    settings = load_settings(str(home))
    ctx = build_context(settings)
    loop = SchedulerLoop(ctx)
    ctx.provider.now()   # the market is up before the first timed pass
    out = []
    start = ctx.clock.now()
    for k in range(3):
        if k == 2:
            _move_prices(ctx.provider)
        t0 = time.perf_counter()
        # Passes 3 s apart on the daemon's clock: past the 2 s retry delay of a waiting job.
        loop.tick(start + timedelta(seconds=3.0 * k))
        out.append(time.perf_counter() - t0)
    ctx.engine.dispose()
    return out


def _move_prices(provider) -> None:
    """Wait (deadline 120 s) until the market's prices differ from what the last pass saw."""
    before = [(r.zone, r.instance_type, r.spot_price_usd_per_hour)
              for r in provider.market_view(None)]
    deadline = time.monotonic() + 120.0
    while time.monotonic() < deadline:
        now = [(r.zone, r.instance_type, r.spot_price_usd_per_hour)
               for r in provider.market_view(None)]
        if now != before:
            return
        time.sleep(0.2)
    print("  (prices did not move within 120 s)")


def main() -> None:
    """Print the three pass times per N."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--distinct", action="store_true", help="a different estimate per job")
    args = ap.parse_args()
    print(f"{'jobs':>6} {'cold s':>8} {'same s':>8} {'moved s':>8}")
    for n in args.jobs:
        with tempfile.TemporaryDirectory(prefix="spotrun-pass-") as tmp:
            home = Path(tmp) / "home"
            home.mkdir()
            os.environ["SPOTRUN_HOME"] = str(home)
            fill(home, n, args.distinct)
            try:
                cold, same, moved = passes(home)
            finally:
                stop_market(home / "market")
            print(f"{n:>6} {cold:>8.3f} {same:>8.3f} {moved:>8.3f}", flush=True)


if __name__ == "__main__":
    main()

"""Read verbs at scale: `status --json`, `audit --json`, the dashboard's JSON routes, `/metrics`.

Fills a fresh home with N jobs through the product's own writers (submit, the scheduler's
attempt and node intents, `move_job`/`move_attempt`, `add_event`, the spend loop's booking),
in six shapes: queued (waiting), running (with a heartbeat and a deadline), succeeded after a
reclaim, failed, recovering after a reclaim, and a running two-node attempt. Then it times
each read: the verbs in this process (click's CliRunner) and as their own process (`python -m
spotrun`, what a user waits for), the routes over HTTP from a real `spotrun ui` server in
this process on a free port. It prints the first and the median time at the smallest and the
largest N and their ratio (issue 24: at most 3x, `/metrics` under 1 s). The server is fresh
for each N, so the first call of a route finds no audit kept; later calls reuse finished jobs'.

    .venv/bin/python bench/reads.py                   # N = 10 and 1000
    .venv/bin/python bench/reads.py --jobs 10 200 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable

from spotrun import layout
from spotrun.db import Attempt, Job, add_event, new_job_id, open_settings_db, session
from spotrun.providers.base import InstanceInfo, PricePoint
from spotrun.states import AttemptState, EndReason, JobState, Market, NodeState, move_attempt, \
    move_job

T0 = datetime(2030, 1, 15, 12, 0, tzinfo=timezone.utc)   # provider clock of the first launch
TYPE = "p3.2xlarge"
STEPS = 1000
SHAPES = ("queued", "running", "succeeded", "failed", "recovering", "multinode")


def at(minutes: float) -> datetime:
    """T0 plus minutes (provider clock)."""
    return T0 + timedelta(minutes=minutes)


class PriceFeed:
    """The spend loop's price side, set by hand: the one edge a filled home cannot reach."""

    name = "local"

    def __init__(self, zones: list[str], clock: datetime) -> None:
        self.zones, self.clock = zones, clock

    def now(self) -> datetime:
        """The provider clock the spend loop books up to."""
        return self.clock

    def spot_price(self, instance_type: str, zone: str) -> float | None:
        """One spot price for every pool."""
        return 0.9

    def on_demand_price(self, instance_type: str) -> float:
        """The catalog's on-demand price of p3.2xlarge (us-east-1)."""
        return 3.06

    def price_history(self, instance_type: str, zones: list[str], start: datetime,
                      end: datetime) -> list[PricePoint]:
        """One change point, before every attempt."""
        return [PricePoint(instance_type, z, at(-60), 0.9) for z in zones]

    def describe(self, *, job_id: str | None = None,
                 instance_ids: list[str] | None = None) -> list[InstanceInfo]:
        """No live instances: the spend loop books from the attempt rows."""
        return []


def _attempt(job: Job, number: int, zone: str, market: Market = Market.SPOT,
             nodes: int = 1) -> Attempt:
    """The scheduler's intent row (spotrun.daemon.scheduler._start_attempt's fields)."""
    return Attempt(job_id=job.id, number=number, state=AttemptState.LAUNCHING, nodes=nodes,
                   market=market, instance_type=TYPE, zone=zone,
                   price_usd_per_hour=0.9 if market is Market.SPOT else 3.06,
                   client_token=f"{job.id}-a{number}", start_step=0)


def _run(s: Any, job: Job, a: Attempt, start: float, *, last_step: int,
         nodes: bool = False) -> None:
    """Launched, then running: what reconcile and the heartbeat loop record."""
    move_attempt(a, AttemptState.RUNNING)
    a.started_at, a.running_at, a.last_step = at(start), at(start + 2), last_step
    if not nodes:
        a.instance_id = f"i-{job.id[-6:]}{a.number:02d}"
    move_job(job, JobState.STARTING)
    move_job(job, JobState.RUNNING)
    job.last_step = max(job.last_step, last_step)
    add_event(s, job.id, "launched", f"attempt {a.number}", attempt_id=a.id)
    add_event(s, job.id, "running", f"attempt {a.number}", attempt_id=a.id)


def _end(s: Any, job: Job, a: Attempt, end: float, why: EndReason, to: JobState) -> None:
    """An attempt's end and where its job goes, as reconcile records them."""
    move_attempt(a, AttemptState.ENDED)
    a.ended_at, a.end_reason = at(end), why
    if why is EndReason.RECLAIMED:
        a.notice_at = at(end - 2)
    move_job(job, to)
    add_event(s, job.id, why.value, f"attempt {a.number}", attempt_id=a.id)


def _shape(s: Any, job: Job, shape: str, zones: list[str], store: Any) -> None:
    """Give a queued job its history for one shape (caller commits)."""
    from spotrun.daemon.nodes import add_group_intents
    if shape == "queued":
        job.reason = "waiting: no spot capacity in any pool"
        add_event(s, job.id, "waiting", job.reason)
        return
    first = _attempt(job, 1, zones[0], nodes=2 if shape == "multinode" else 1)
    s.add(first)
    s.flush()
    if shape == "multinode":
        for k, n in enumerate(add_group_intents(s, first)):
            n.instance_id, n.launched_at, n.running_at = f"i-{job.id[-6:]}n{k}", at(0), at(2)
            n.state = NodeState.RUNNING
        _run(s, job, first, 0, last_step=300, nodes=True)
        return
    _run(s, job, first, 0, last_step=400)
    if shape == "running":
        job.deadline_at = at(24 * 60)
        store.put_bytes(layout.heartbeat_key(job.id, 1),
                        json.dumps({"attempt": 1, "phase": "running", "step": 420}).encode())
    elif shape == "failed":
        _end(s, job, first, 30, EndReason.ERROR, JobState.RECOVERING)
        move_job(job, JobState.FAILED)
        job.reason = "the command failed"
    else:   # reclaimed, then (succeeded) an on-demand attempt to the end
        _end(s, job, first, 30, EndReason.RECLAIMED, JobState.RECOVERING)
        if shape == "succeeded":
            second = _attempt(job, 2, zones[-1], Market.ON_DEMAND)
            second.start_step = 350
            s.add(second)
            s.flush()
            _run(s, job, second, 33, last_step=STEPS)
            _end(s, job, second, 90, EndReason.COMPLETED, JobState.SUCCEEDED)
    s.add(first)


def market_state(settings: Any) -> None:
    """The local market's state dir as a daemon's home has it (options, epoch, clock), so the
    audit and the deadlines read the market's truth; no market process is started."""
    from spotrun.providers.local.market.core import Market
    from spotrun.providers.local.market.options import MarketOptions
    Market(settings.home_path / "market", MarketOptions.from_settings(settings)).state.close()


def fill_home(home: Path, n_jobs: int) -> Any:
    """N jobs in SHAPES order (repeating) under home, their ledger booked; the settings."""
    from spotrun.config import load_settings
    from spotrun.daemon.spend import SpendLoop
    from spotrun.jobs import submit, validate_submission
    from spotrun.store import open_store
    from spotrun.zones import known_zones
    home.mkdir(parents=True, exist_ok=True)
    settings = load_settings(str(home))
    spec = home / "reads.yaml"
    spec.write_text(f"name: reads\ncommand: python train.py\nwork: {{total_steps: {STEPS}}}\n"
                    "policy: {market: spot}\n")
    sub = validate_submission(spec, settings)   # once: the spec is the same for every job
    engine = open_settings_db(settings)
    store = open_store(settings.store_url)
    zones = known_zones(settings)
    taken: set[str] = set()
    for i in range(n_jobs):
        job_id = new_job_id(sub.spec.name)
        while job_id in taken:   # 3 random bytes: a thousand ids may draw one twice
            job_id = new_job_id(sub.spec.name)
        taken.add(job_id)
        one = replace(sub, job_id=job_id, checkpoint_uri=sub.checkpoint_uri.replace(
            sub.job_id, job_id))
        submit(one, engine)
        with session(engine) as s:
            job = s.get(Job, job_id)
            job.created_at = job.created_at + timedelta(microseconds=i)   # a stable order
            _shape(s, job, SHAPES[i % len(SHAPES)], zones, store)
            s.add(job)
            s.commit()
    SpendLoop(engine, PriceFeed(zones, at(120)), storage_interval_s=1e9).tick(at(120))
    engine.dispose()
    return settings


# ---------------------------------------------------------------- the reads


def _cli(settings: Any, *args: str) -> Callable[[], Any]:
    from click.testing import CliRunner

    from spotrun.cli import cli

    def call() -> Any:
        res = CliRunner().invoke(cli, [*args, "--json"], env={"SPOTRUN_HOME": str(
            settings.home_path)})
        if res.exit_code != 0:
            raise RuntimeError(f"spotrun {' '.join(args)} --json: {res.output[-500:]}")
        return json.loads(res.output)
    return call


def _process(settings: Any, *args: str) -> Callable[[], Any]:
    """The verb as its own process (what a user waits for: imports and engine included)."""
    import os
    import subprocess
    env = {**os.environ, "SPOTRUN_HOME": str(settings.home_path)}

    def call() -> Any:
        out = subprocess.run([sys.executable, "-m", "spotrun", *args, "--json"], env=env,
                             capture_output=True, text=True, check=True)
        return json.loads(out.stdout)
    return call


def _route(url: str) -> Callable[[], str]:
    def call() -> str:
        with urllib.request.urlopen(url, timeout=600) as r:
            return r.read().decode()
    return call


def reads(settings: Any, base_url: str) -> dict[str, Callable[[], Any]]:
    """Every read, by name: the two verbs, then each JSON route and /metrics."""
    from spotrun.db import iter_jobs
    engine = open_settings_db(settings)
    with session(engine) as s:
        jobs = list(iter_jobs(s))
    engine.dispose()
    one = next(j.id for j in jobs if j.state is JobState.SUCCEEDED)
    return {"status --json": _cli(settings, "status"), "audit --json": _cli(settings, "audit"),
            "spotrun status --json (process)": _process(settings, "status"),
            "spotrun audit --json (process)": _process(settings, "audit"),
            "/api/status": _route(f"{base_url}/api/status"),
            "/api/status/<id>": _route(f"{base_url}/api/status/{one}"),
            "/api/audit": _route(f"{base_url}/api/audit"),
            "/api/audit/<id>": _route(f"{base_url}/api/audit/{one}"),
            "/api/page/<id>": _route(f"{base_url}/api/page/{one}"),
            "/metrics": _route(f"{base_url}/metrics")}


def time_reads(settings: Any, repeat: int) -> dict[str, list[float]]:
    """Seconds per call of every read, `repeat` calls each (a fresh server: no warm cache)."""
    from spotrun.ui.server import make_server
    server = make_server(settings, port=0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        out: dict[str, list[float]] = {}
        for name, call in reads(settings, f"http://127.0.0.1:{server.server_address[1]}").items():
            out[name] = []
            for _ in range(repeat):
                t = time.perf_counter()
                call()
                out[name].append(time.perf_counter() - t)
        return out
    finally:
        server.shutdown()
        server.server_close()


def main(argv: list[str] | None = None) -> int:
    """Fill, time, print."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, nargs="+", default=[10, 1000])
    p.add_argument("--repeat", type=int, default=3, help="calls per read (median shown)")
    p.add_argument("--dir", default=None, help="where the homes go (default: a temp dir)")
    p.add_argument("--no-market", action="store_true",
                   help="leave out the local market's state dir (no market truth to read)")
    args = p.parse_args(argv)
    root = Path(args.dir or tempfile.mkdtemp(prefix="spotrun-reads-"))
    results: dict[int, dict[str, list[float]]] = {}
    for n in args.jobs:
        t = time.perf_counter()
        settings = fill_home(root / f"home-{n}", n)
        if not args.no_market:
            market_state(settings)
        print(f"filled {n} jobs in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        results[n] = time_reads(settings, args.repeat)
    lo, hi = min(args.jobs), max(args.jobs)
    print(f"| read | first s at {lo} | median s at {lo} | first s at {hi} | median s at {hi} "
          f"| ratio (median) |")
    print("|---|---|---|---|---|---|")
    ok = True
    for name in results[lo]:
        a, b = results[lo][name], results[hi][name]
        ratio = statistics.median(b) / statistics.median(a)
        ok = ok and ratio <= 3.0
        print(f"| {name} | {a[0]:.3f} | {statistics.median(a):.3f} | {b[0]:.3f} | "
              f"{statistics.median(b):.3f} | x{ratio:.1f} |")
    metrics_s = statistics.median(results[hi]["/metrics"])
    print(f"\n/metrics at {hi} jobs: {metrics_s:.3f} s (target under 1 s); every ratio at most "
          f"3x: {'yes' if ok else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

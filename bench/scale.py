"""A daemon for a team: N queued and M running jobs under the real daemon (issue 24).

For each N, a fresh home (temp dir, local provider, file store, SQLite) gets N queued jobs
through the product's own submit path (a spot job with a price cap under every price: each
waits, and is decided by every pass that must) and M running ones (on-demand, `sleep 3600`:
the local market starts a real agent per instance, so each is a real running attempt). Then
`spotrun daemon` runs as its own process: the bench waits (deadline) until the M jobs run,
lets the daemon run `--seconds` more (the health window is the last minute, so the figures
are the steady state, not the launches), and prints:

- per loop: tick p50/p99/max over the last minute and lag (`spotrun daemon --check --json`);
- the read verbs' times while the daemon runs (`spotrun status --json` and `spotrun audit
  --json` as their own processes, `/api/status`, `/api/audit` and `/metrics` from a
  `spotrun ui` server in this process) and their ratio largest N / smallest N;
- waiting events per queued job, and database rows per job (events, ledger rows), with how
  many of each the steady window added.

Every process it started is ended at the end (daemon, market, the instances' agents).

With `--standins` the running instances are light stand-ins, not agents: the bench starts the
market itself with each instance's process a `sleep`, and one thread of the bench writes each
running attempt's real heartbeat report (spotrun.reports.Heartbeat, the key the agent writes)
at the agent's heartbeat interval, its step moving on. 200 real agents need about 3 cores of
a 2-core box; the daemon's side of the work (read the reports, book, schedule) is the same.

    .venv/bin/python bench/scale.py                                  # N = 10 and 1000, M = 50
    .venv/bin/python bench/scale.py --queued 10 1000 --running 200 --standins --seconds 60
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from sqlalchemy import text

from spotrun.config import load_settings
from spotrun.db import new_job_id, open_settings_db
from spotrun.jobs import submit, validate_submission
from spotrun.states import JobState

QUEUED_SPEC = """name: waits
command: 'true'
work: {reference_hours: 1.0, reference_instance: p3.2xlarge}
policy: {market: spot, max_price_usd_per_hour: 0.01}
"""
RUNNING_SPEC = """name: sleeps
command: sleep 3600
work: {reference_hours: 1000.0, reference_instance: p3.2xlarge}
policy: {market: on-demand}
"""
READ_REPEAT = 3


def fill(settings: Any, spec_text: str, file_name: str, n: int) -> list[str]:
    """N jobs of one spec through validate_submission and submit; their ids."""
    path = settings.home_path / file_name
    path.write_text(spec_text)
    sub = validate_submission(path, settings)   # once: every job has the same spec
    engine = open_settings_db(settings)
    ids: list[str] = []
    taken: set[str] = set()
    for _ in range(n):
        job_id = new_job_id(sub.spec.name)
        while job_id in taken:   # 3 random bytes: a thousand ids may draw one twice
            job_id = new_job_id(sub.spec.name)
        taken.add(job_id)
        submit(replace(sub, job_id=job_id,
                       checkpoint_uri=sub.checkpoint_uri.replace(sub.job_id, job_id)), engine)
        ids.append(job_id)
    engine.dispose()
    return ids


def counts(settings: Any) -> dict[str, Any]:
    """Rows in the database now: jobs by state, events (waiting ones of queued jobs apart),
    ledger rows."""
    names = {"queued": JobState.QUEUED.name, "running": JobState.RUNNING.name}   # as stored
    engine = open_settings_db(settings)
    with engine.connect() as c:
        states = dict(c.execute(text("SELECT state, count(*) FROM job GROUP BY state")).all())
        events = c.execute(text("SELECT count(*) FROM event")).scalar_one()
        waiting = c.execute(text(
            "SELECT count(*), count(DISTINCT e.job_id) FROM event e JOIN job j "
            "ON j.id = e.job_id WHERE e.kind = 'waiting' AND j.state = :queued"), names).one()
        waiting_max = c.execute(text(
            "SELECT max(n) FROM (SELECT count(*) AS n FROM event e JOIN job j ON j.id = e.job_id"
            " WHERE e.kind = 'waiting' AND j.state = :queued GROUP BY e.job_id)"), names).scalar()
        ledger = c.execute(text("SELECT count(*) FROM spendentry")).scalar_one()
        ledger_running = c.execute(text(
            "SELECT count(*) FROM spendentry s JOIN job j ON j.id = s.job_id "
            "WHERE j.state = :running"), names).scalar_one()
    engine.dispose()
    return {"states": {str(k).lower(): v for k, v in states.items()}, "events": events,
            "waiting_events": waiting[0], "waiting_jobs": waiting[1],
            "waiting_max": waiting_max or 0, "ledger": ledger, "ledger_running": ledger_running}


def wait_running(settings: Any, m: int, daemon: subprocess.Popen, timeout_s: float) -> float:
    """Seconds until m jobs are running (a deadline; the daemon must stay up)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if daemon.poll() is not None:
            raise RuntimeError(f"the daemon exited with {daemon.returncode}")
        if counts(settings)["states"].get("running", 0) >= m:
            return time.monotonic() - t0
        threading.Event().wait(1.0)
    raise RuntimeError(f"{m} jobs not running after {timeout_s:.0f} s: {counts(settings)}")


def _spotrun(settings: Any, *args: str) -> Callable[[], Any]:
    """A verb as its own process (what a user waits for); its JSON."""
    env = {**os.environ, "SPOTRUN_HOME": str(settings.home_path)}

    def call() -> Any:
        out = subprocess.run([sys.executable, "-m", "spotrun", *args], env=env,
                             capture_output=True, text=True, timeout=600)
        if out.returncode not in (0, 1) or not out.stdout.strip():
            raise RuntimeError(f"spotrun {' '.join(args)}: {out.stderr[-500:]}")
        return json.loads(out.stdout)
    return call


def _route(url: str) -> Callable[[], str]:
    def call() -> str:
        with urllib.request.urlopen(url, timeout=600) as r:
            return r.read().decode()
    return call


def time_reads(settings: Any) -> dict[str, float]:
    """Median seconds of each read (READ_REPEAT calls), while the daemon runs."""
    from spotrun.ui.server import make_server
    server = make_server(settings, port=0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    reads = {"spotrun status --json": _spotrun(settings, "status", "--json"),
             "spotrun audit --json": _spotrun(settings, "audit", "--json"),
             "/api/status": _route(f"{base}/api/status"),
             "/api/audit": _route(f"{base}/api/audit"),
             "/metrics": _route(f"{base}/metrics")}
    try:
        out: dict[str, float] = {}
        for name, call in reads.items():
            took = []
            for _ in range(READ_REPEAT):
                t = time.perf_counter()
                call()
                took.append(time.perf_counter() - t)
            out[name] = statistics.median(took)
        return out
    finally:
        server.shutdown()
        server.server_close()


def stop_all(home: Path, daemon: subprocess.Popen | None) -> None:
    """End the daemon (SIGTERM, then SIGKILL), the market, and every instance it recorded."""
    from spotrun.providers.local.market import procs
    from spotrun.providers.local.market.client import read_live_info, stop_market
    from spotrun.providers.local.market.state import DB_FILE, MarketState
    if daemon is not None and daemon.poll() is None:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
    state_dir = home / "market"
    try:
        stop_market(state_dir, timeout_s=30)
    except Exception as exc:   # the kill below still runs
        print(f"  (market stop: {exc})", file=sys.stderr)
    info = read_live_info(state_dir)
    if info:
        try:
            os.kill(int(info["pid"]), signal.SIGKILL)
        except ProcessLookupError:
            pass
    if (state_dir / DB_FILE).exists():
        state = MarketState(state_dir)
        for rec in state.all():
            procs.signal_instance(rec.instance_id, rec.pid, rec.pid_start_ticks, signal.SIGKILL)
        state.close()


def run_one(root: Path, n: int, m: int, seconds: float, launch_timeout_s: float,
            standins: bool = False) -> dict:
    """Fill a home with n queued and m running jobs, run the daemon, measure; the figures."""
    home = root / f"home-{n}-{m}"
    home.mkdir(parents=True)
    os.environ["SPOTRUN_HOME"] = str(home)
    settings = load_settings(str(home))
    t = time.perf_counter()
    fill(settings, QUEUED_SPEC, "waits.yaml", n)
    fill(settings, RUNNING_SPEC, "sleeps.yaml", m)
    print(f"[{n}/{m}] filled in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    log = open(home / "daemon.log", "wb")
    writer = None
    if standins:
        start_standin_market(settings)
        writer = StandIns(settings).start()
    daemon = subprocess.Popen([sys.executable, "-m", "spotrun", "daemon"],
                              env={**os.environ, "SPOTRUN_HOME": str(home)},
                              stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        to_running = wait_running(settings, m, daemon, launch_timeout_s)
        print(f"[{n}/{m}] {m} running after {to_running:.1f} s; steady window {seconds:g} s",
              file=sys.stderr, flush=True)
        before = counts(settings)
        load_start = os.getloadavg()[0]
        threading.Event().wait(seconds)
        check = _spotrun(settings, "daemon", "--check", "--json")()
        after = counts(settings)
        load = os.getloadavg()[0]   # the box's load over the window's last minute
        reads = time_reads(settings)
    finally:
        if writer is not None:
            writer.close()
        stop_all(home, daemon)
        log.close()
    return {"queued": n, "running": m, "standins": standins, "to_running_s": to_running, "check": check,
            "before": before, "after": after, "reads": reads, "seconds": seconds,
            "load_1min": load, "load_start": load_start}


class StandIns:
    """Writes every running attempt's heartbeat at the agent's interval, as agents would."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.stop = threading.Event()
        self.written = 0
        self.thread = threading.Thread(target=self._run, name="standins", daemon=True)

    def start(self) -> "StandIns":
        """Start the writer thread."""
        self.thread.start()
        return self

    def close(self) -> None:
        """Stop writing."""
        self.stop.set()
        self.thread.join(timeout=30)

    def _run(self) -> None:
        from spotrun import layout
        from spotrun.agent.clock import iso
        from spotrun.reports import Heartbeat, dump
        from spotrun.store import open_store
        engine = open_settings_db(self.settings)
        interval_s = float(self.settings.agent.heartbeat_interval_s)
        t0 = time.time()
        stores: dict[str, Any] = {}
        while not self.stop.wait(interval_s):
            with engine.connect() as c:
                rows = c.execute(text(
                    "SELECT a.job_id, a.number, j.store_uri FROM attempt a JOIN job j ON "
                    "j.id = a.job_id WHERE a.state = 'RUNNING'")).all()
            step = int((time.time() - t0) * 10)
            for job_id, number, uri in rows:
                store = stores.get(uri) or stores.setdefault(uri, open_store(uri))
                store.put_bytes(layout.heartbeat_key(job_id, number), json.dumps(dump(Heartbeat(
                    ts=iso(time.time()), attempt=number, phase="running", step=step,
                    total_steps=10 ** 9, steps_per_s=10.0))).encode())
                self.written += 1
        engine.dispose()


def start_standin_market(settings: Any) -> None:
    """The local market, started before the daemon, whose instances are `sleep` processes."""
    from spotrun.providers.local.market.client import ensure_market
    from spotrun.providers.local.market.options import MarketOptions
    ensure_market(settings.home_path / "market",
                  replace(MarketOptions.from_settings(settings), instance_command="sleep 36000"))


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def report(results: list[dict]) -> None:
    """Markdown tables: loops per run, reads and ratio, rows per job."""
    results = sorted(results, key=lambda r: r["queued"])
    for r in results:
        loops = r["check"].get("loops") or {}
        kind = "stand-in" if r.get("standins") else "real-agent"
        print(f"\n#### {r['queued']} queued, {r['running']} running ({kind} instances; "
              f"running after {r['to_running_s']:.0f} s; load average "
              f"{r['load_start']:.1f} at the window's start, {r['load_1min']:.1f} at its end; "
              f"check ok: {r['check'].get('ok')})\n")
        print("| loop | every s | ticks | p50 ms | p99 ms | max ms | lag ms | max lag ms |")
        print("|---|---|---|---|---|---|---|---|")
        for name, f in sorted(loops.items()):
            print(f"| {name} | {f['interval_s']:g} | {f['ticks']} | {_ms(f['p50_s'])} | "
                  f"{_ms(f['p99_s'])} | {_ms(f['max_s'])} | {_ms(f['lag_s'])} | "
                  f"{_ms(f['lag_max_s'])} |")
        slow = [n for n, f in loops.items() if (f["p99_s"] or 0) >= 1.0]
        print(f"\nloops with p99 of 1 s or more: {', '.join(slow) or 'none'}")
    lo, hi = results[0], results[-1]
    print(f"\n| read (median of {READ_REPEAT}, s) | {lo['queued']} queued | {hi['queued']} queued "
          f"| ratio |")
    print("|---|---|---|---|")
    for name, a in lo["reads"].items():
        b = hi["reads"][name]
        print(f"| `{name}` | {a:.3f} | {b:.3f} | x{b / a:.1f} |")
    print("\n| rows | " + " | ".join(f"{r['queued']}q/{r['running']}r" for r in results) + " |")
    print("|---|" + "---|" * len(results))

    def row(label: str, f: Callable[[dict], str]) -> None:
        print(f"| {label} | " + " | ".join(f(r) for r in results) + " |")

    def total(r: dict) -> int:
        return sum(r["after"]["states"].values())
    row("jobs (queued, running)", lambda r: f"{total(r)} ("
        f"{r['after']['states'].get('queued', 0)}, {r['after']['states'].get('running', 0)})")
    row("events per job", lambda r: f"{r['after']['events'] / total(r):.2f}")
    row("events added in the window", lambda r: str(r["after"]["events"] - r["before"]["events"]))
    row("waiting events per queued job (max)", lambda r: (
        f"{r['after']['waiting_events'] / max(1, r['after']['states'].get('queued', 0)):.2f} "
        f"({r['after']['waiting_max']})"))
    row("ledger rows per job", lambda r: f"{r['after']['ledger'] / total(r):.2f}")
    row("ledger rows per running job", lambda r: (
        f"{r['after']['ledger_running'] / max(1, r['after']['states'].get('running', 0)):.2f}"))
    row("ledger rows added in the window",
        lambda r: str(r["after"]["ledger"] - r["before"]["ledger"]))


def main(argv: list[str] | None = None) -> int:
    """Run each N under the daemon, print the tables (and the raw figures with --json-out)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queued", type=int, nargs="+", default=[10, 1000])
    p.add_argument("--running", type=int, default=50, help="running jobs (one real agent each)")
    p.add_argument("--seconds", type=float, default=60.0,
                   help="how long the daemon runs once the running jobs are up")
    p.add_argument("--standins", action="store_true",
                   help="running instances are light stand-ins writing the agent's heartbeat")
    p.add_argument("--launch-timeout", type=float, default=600.0,
                   help="seconds allowed for the running jobs to start")
    p.add_argument("--dir", default=None, help="where the homes go (default: a temp dir)")
    p.add_argument("--json-out", default=None, help="also write the raw figures here")
    args = p.parse_args(argv)
    root = Path(args.dir or tempfile.mkdtemp(prefix="spotrun-scale-"))
    results = [run_one(root, n, args.running, args.seconds, args.launch_timeout, args.standins)
               for n in args.queued]
    report(results)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The team server under 20 clients: status and submit through the API beside the database.

Fills a fresh home with N jobs through the product's own writers (bench/reads.py's six
shapes: attempts, events, node rows and a booked ledger), adds one member user per client,
and starts a real `spotrun server` (uvicorn) as its own process on 127.0.0.1. Then two
phases of `--seconds` each, the same call mix at the same concurrency:

- **api**: C client threads (httpx, one token each) call `GET /api/v1/jobs` (status, the
  list), `GET /api/v1/jobs/{id}` (one job) and `POST /api/v1/jobs` (submit with a small
  workdir bundle, packed once here: the time is the server's, not the laptop's packing);
- **direct**: the same C threads call the CLI's own code path in this process
  (spotrun.backends.local.LocalBackend: status, status JOB, submit SPEC, which packs and
  stores the bundle itself), what `spotrun --local ...` runs once its interpreter is up.

In-process, not `spotrun status --json` as C processes: C interpreters starting at once on
two cores would measure start-up (0.5 s each, docs/benchmarks.md) and the box, not the
database. The CLI as a process is timed apart, one call at a time (`--process-calls`).

Each client calls the three kinds in turn (client i starts at kind i mod 3), with
`--think-s` between calls (0: closed loop, every client always waiting on a call). Prints
p50/p99/max per call kind for both phases and the ratio api/direct; target: API p99 under
200 ms. With `--profile FILE` the server runs under cProfile (written when it stops).

    .venv/bin/python bench/api.py                        # 1,000 jobs, 20 clients, 30 s each
    .venv/bin/python bench/api.py --think-s 1 --seconds 60
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import httpx

from reads import fill_home   # bench/ is the script's folder: the same home as bench/reads.py

KINDS = ("status (list)", "status JOB", "submit")
SPEC = ("name: bench\ncommand: python train.py\nworkdir: wd\nwork: {total_steps: 1000}\n"
        "policy: {market: spot}\n")


def write_spec(root: Path) -> Path:
    """A spec with a small workdir (a script and a config, about 2 KB) next to it."""
    wd = root / "wd"
    wd.mkdir(parents=True, exist_ok=True)
    (wd / "train.py").write_text("import time\n" + "# training loop\n" * 60)
    (wd / "config.json").write_text(json.dumps({"lr": 3e-4, "steps": 1000}))
    spec = root / "bench.yaml"
    spec.write_text(SPEC)
    return spec


def add_users(settings: Any, n: int) -> list[str]:
    """n member users (one per client), their tokens."""
    from spotrun.db import open_settings_db
    from spotrun.server.identity import add_user
    engine = open_settings_db(settings)
    tokens = [add_user(engine, f"engineer{i:02d}", "member") for i in range(n)]
    engine.dispose()
    return tokens


def free_port() -> int:
    """A port nobody listens on now (the server binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(settings: Any, port: int, log: Any, profile: str | None
                 ) -> subprocess.Popen:
    """`spotrun server` as its own process, answering /health (a deadline)."""
    prof = ["-m", "cProfile", "-o", profile] if profile else []
    proc = subprocess.Popen([sys.executable, *prof, "-m", "spotrun", "server", "--host",
                             "127.0.0.1", "--port", str(port)],
                            env={**os.environ, "SPOTRUN_HOME": str(settings.home_path)},
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} (see {log.name})")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        threading.Event().wait(0.1)
    raise RuntimeError("the server did not answer within 60 s")


def stop_server(proc: subprocess.Popen) -> None:
    """SIGINT (uvicorn's clean stop: cProfile writes its file), then SIGKILL."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def submission(spec: Path) -> bytes:
    """The streamed submit body (spotrun.backends.wire), built once."""
    from spotrun.backends.transfer import packed, submission_body
    with packed(str(spec)) as (data, bundle):
        chunks, _ = submission_body(str(spec), data, bundle, None)
        return b"".join(chunks)


def api_calls(url: str, token: str, job_id: str, body: bytes) -> tuple[list[Callable], Any]:
    """The three calls of one API client (its own connection), and the client to close."""
    from spotrun.backends.wire import SUBMIT_TYPE
    client = httpx.Client(base_url=url + "/api/v1", timeout=120,
                          headers={"Authorization": f"Bearer {token}"})

    def ok(resp: httpx.Response) -> None:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:300]}")
    return [lambda: ok(client.get("/jobs")),
            lambda: ok(client.get(f"/jobs/{job_id}")),
            lambda: ok(client.post("/jobs", content=body,
                                   headers={"Content-Type": SUBMIT_TYPE}))], client


def direct_calls(settings: Any, engine: Any, job_id: str, spec: Path) -> list[Callable]:
    """The same three calls through LocalBackend (the CLI's direct-database path; the job's
    owner is this OS user, as a local submit's is)."""
    from spotrun.backends.local import LocalBackend
    backend = LocalBackend(settings, engine)
    return [lambda: backend.status(None), lambda: backend.status(job_id),
            lambda: backend.submit(str(spec), owner=None, dry_run=False)]


def run_phase(clients: list[list[Callable]], seconds: float, think_s: float,
              warmup_s: float = 0.0) -> dict[str, list[float]]:
    """Every client calls its kinds in turn until the time is up; seconds per call by kind
    (calls started in the first warmup_s are made but not counted)."""
    took: dict[str, list[float]] = {k: [] for k in KINDS}
    counted_from = time.perf_counter() + warmup_s
    errors: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def client(i: int, calls: list[Callable]) -> None:
        k = i % len(KINDS)
        while not stop.is_set():
            t = time.perf_counter()
            try:
                calls[k]()
            except Exception as exc:   # counted and shown: a failed call is no latency
                with lock:
                    errors.append(f"{KINDS[k]}: {exc}")
            else:
                if t >= counted_from:
                    with lock:
                        took[KINDS[k]].append(time.perf_counter() - t)
            k = (k + 1) % len(KINDS)
            if think_s:
                stop.wait(think_s)

    threads = [threading.Thread(target=client, args=(i, c), daemon=True)
               for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    stop.wait(warmup_s + seconds)
    stop.set()
    for t in threads:
        t.join(timeout=300)
    if errors:
        print(f"  {len(errors)} failed calls, first: {errors[0]}", file=sys.stderr)
    took["errors"] = [float(len(errors))]
    return took


def pct(xs: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of xs."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(q * len(s))) - 1))]


def process_status(settings: Any, calls: int) -> list[float]:
    """`spotrun status --json` as its own process, one call at a time (what a user waits for)."""
    env = {**os.environ, "SPOTRUN_HOME": str(settings.home_path)}
    out = []
    for _ in range(calls):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "spotrun", "status", "--json"], env=env,
                       capture_output=True, check=True)
        out.append(time.perf_counter() - t)
    return out


def main(argv: list[str] | None = None) -> int:
    """Fill, serve, load both paths, print."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--seconds", type=float, default=30.0, help="length of each phase")
    p.add_argument("--think-s", type=float, default=0.0,
                   help="each client's pause between calls (0: closed loop)")
    p.add_argument("--warmup-s", type=float, default=5.0,
                   help="calls made first and not counted, each phase (a server's first "
                        "calls import modules and build the shared status list)")
    p.add_argument("--process-calls", type=int, default=3,
                   help="`spotrun status --json` processes timed one at a time")
    p.add_argument("--profile", default=None, help="run the server under cProfile, into FILE")
    p.add_argument("--dir", default=None, help="where the home goes (default: a temp dir)")
    args = p.parse_args(argv)
    root = Path(args.dir or tempfile.mkdtemp(prefix="spotrun-api-"))
    t = time.perf_counter()
    settings = fill_home(root / "home", args.jobs)
    tokens = add_users(settings, args.clients)
    spec = write_spec(root / "laptop")
    print(f"filled {args.jobs} jobs in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    from spotrun.db import iter_jobs, open_settings_db, session
    from spotrun.states import JobState
    engine = open_settings_db(settings)
    with session(engine) as s:
        one = next(j.id for j in iter_jobs(s) if j.state is JobState.SUCCEEDED)
    body = submission(spec)
    port = free_port()
    log = open(root / "server.log", "wb")
    server = start_server(settings, port, log, args.profile)
    load0 = os.getloadavg()[0]
    try:
        made = [api_calls(f"http://127.0.0.1:{port}", tok, one, body) for tok in tokens]
        api = run_phase([calls for calls, _ in made], args.seconds, args.think_s,
                        args.warmup_s)
        for _, client in made:
            client.close()
    finally:
        stop_server(server)
        log.close()
    load1 = os.getloadavg()[0]
    direct = run_phase([direct_calls(settings, engine, one, spec) for _ in range(args.clients)],
                       args.seconds, args.think_s, args.warmup_s)
    load2 = os.getloadavg()[0]
    with session(engine) as s:
        total = sum(1 for _ in iter_jobs(s))
    engine.dispose()
    procs = process_status(settings, args.process_calls) if args.process_calls else []

    print(f"\n{args.jobs} jobs at the start, {total} after both phases; {args.clients} "
          f"clients, think {args.think_s:g} s, {args.seconds:g} s per phase after "
          f"{args.warmup_s:g} s of warm-up; load average "
          f"{load0:.1f} / {load1:.1f} / {load2:.1f} (start / after api / after direct)\n")
    print("| call | api calls | api ms p50 / p99 / max | direct calls | direct ms p50 / p99 / "
          "max | p99 api / direct |")
    print("|---|---|---|---|---|---|")
    worst = 0.0
    for k in KINDS:
        a, d = api[k], direct[k]
        if not a or not d:
            print(f"| {k} | {len(a)} | - | {len(d)} | - | - |")
            continue
        worst = max(worst, pct(a, 0.99))

        def ms(xs: list[float]) -> str:
            return f"{statistics.median(xs) * 1e3:.0f} / {pct(xs, 0.99) * 1e3:.0f} / " \
                   f"{max(xs) * 1e3:.0f}"
        print(f"| {k} | {len(a)} | {ms(a)} | {len(d)} | {ms(d)} | "
              f"x{pct(a, 0.99) / pct(d, 0.99):.2f} |")
    print(f"\nfailed calls: api {api['errors'][0]:.0f}, direct {direct['errors'][0]:.0f}; "
          f"API p99 worst {worst * 1e3:.0f} ms (target under 200 ms: "
          f"{'met' if worst < 0.2 else 'not met'})")
    if procs:
        print(f"`spotrun status --json` as a process, one at a time: median "
              f"{statistics.median(procs):.3f} s of {len(procs)}")
    if args.profile:
        print(f"server profile: {args.profile}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

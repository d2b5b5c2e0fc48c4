"""Shared fixtures: a temp SPOTRUN_HOME, hand-made traces, and local markets that are always stopped."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from spotrun.providers.local.market import procs
from spotrun.providers.local.market.client import (MarketClient, ensure_market, read_live_info,
                                                  stop_market)
from spotrun.providers.local.market.options import MarketOptions
from spotrun.providers.local.market.state import DB_FILE, MarketState

# An instance workload for tests: records its env, starts the helpers it is told to,
# and runs until ./stop appears in its cwd (the instance's disk).
INSTANCE_SCRIPT = r'''
import json, os, subprocess, sys, time
json.dump({k: v for k, v in os.environ.items() if k.startswith("SPOTRUN_")},
          open("env.json", "w"))
kids = []
loop = "import time\nwhile True: time.sleep(0.2)"
if os.environ.get("TEST_INSTANCE_CHILDREN"):
    kids.append(subprocess.Popen([sys.executable, "-c", loop]).pid)          # same group
    kids.append(subprocess.Popen([sys.executable, "-c", loop],
                                 start_new_session=True).pid)              # own session
if os.environ.get("TEST_INSTANCE_ORPHAN"):
    # A daemonised helper: its own session, no environment (no instance marker), and its
    # parent gone before any kill, so only its ancestry says whose it is.
    spawn = ("import subprocess, sys\n"
             "print(subprocess.Popen([sys.executable, '-c', sys.argv[1]], env={},"
             " start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,"
             " stderr=subprocess.DEVNULL).pid)")
    kids.append(int(subprocess.run([sys.executable, "-c", spawn, loop], capture_output=True,
                                   text=True, check=True).stdout))
json.dump(kids, open("children.json.tmp", "w"))
os.replace("children.json.tmp", "children.json")
while not os.path.exists("stop"):
    time.sleep(0.05)
'''


@pytest.fixture
def tmp_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh SPOTRUN_HOME for one test."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("SPOTRUN_HOME", str(home))
    monkeypatch.delenv("SPOTRUN_DB_URL", raising=False)
    return home


@pytest.fixture(scope="session")
def instance_command(tmp_path_factory: pytest.TempPathFactory) -> str:
    """`--instance-command` running INSTANCE_SCRIPT (the agent's stand-in in market tests)."""
    script = tmp_path_factory.mktemp("instance") / "instance.py"
    script.write_text(INSTANCE_SCRIPT)
    return f"{sys.executable} {script}"


def write_trace(path: Path, pools: dict[str, list[int | None]], tick_s: float = 60.0) -> Path:
    """Write an availability CSV (tick, elapsed_s, one column per pool; None = blank)."""
    rows = max(len(v) for v in pools.values())
    lines = ["tick,elapsed_s," + ",".join(pools)]
    for i in range(rows):
        cells = ["" if i >= len(v) or v[i] is None else str(v[i]) for v in pools.values()]
        lines.append(f"{i},{i * tick_s:g}," + ",".join(cells))
    path.write_text("\n".join(lines) + "\n")
    return path


def write_prices(path: Path, points: list[tuple[str, int, float]]) -> Path:
    """Write a price change-point CSV from (zone, tick, usd_per_hour)."""
    lines = ["zone,tick,time_utc,spot_price_usd_per_hour"]
    lines += [f"{z},{t},,{p}" for z, t, p in points]
    path.write_text("\n".join(lines) + "\n")
    return path


def kill_leftovers(state_dir: Path) -> None:
    """SIGKILL the market of state_dir and every instance process it recorded."""
    info = read_live_info(state_dir)
    if info:
        try:
            os.kill(int(info["pid"]), signal.SIGKILL)
        except ProcessLookupError:
            pass
    if (state_dir / DB_FILE).exists():
        state = MarketState(state_dir)
        for rec in state.all():
            procs.kill_instance(rec.instance_id, rec.pid, rec.pid_start_ticks)
        state.close()


MarketFactory = Callable[..., MarketClient]


@pytest.fixture
def market_factory(tmp_path: Path, instance_command: str) -> Iterator[MarketFactory]:
    """Start markets (detached, real processes); each is stopped and cleaned up at teardown."""
    dirs: list[Path] = []

    def start(state_dir: Path | None = None, **opts: Any) -> MarketClient:
        opts.setdefault("instance_command", instance_command)
        opts.setdefault("grace_s", 1.0)
        if "trace" in opts:
            opts["trace"] = str(opts["trace"])
        directory = state_dir or tmp_path / f"market{len(dirs)}"
        if directory not in dirs:
            dirs.append(directory)
        return ensure_market(directory, MarketOptions(**opts))

    yield start
    for directory in dirs:
        try:
            stop_market(directory, timeout_s=10)
        except Exception:   # teardown must go on: kill whatever is left below
            pass
        kill_leftovers(directory)


@pytest.fixture
def local_market(market_factory: MarketFactory, tmp_path: Path) -> MarketClient:
    """A market on a tiny trace: zone `za` always available, `zb` never; flat spot price."""
    trace = write_trace(tmp_path / "trace.csv", {"za": [1] * 10, "zb": [0] * 10})
    return market_factory(trace=trace, spot_price_usd_per_hour=0.9, time_scale=10.0)




@pytest.fixture
def cpu_load() -> Iterator[Any]:
    """Busy loops (two per core) for the test's duration: end-to-end tests run loaded."""
    from load import BusyLoad
    with BusyLoad() as load:
        yield load


@pytest.fixture(scope="session")
def reference_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Uninterrupted demo runs, one per argument string for the whole session (all workers)."""
    from reference_run import ReferenceRuns
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    runs = ReferenceRuns(shared, tmp_path_factory.mktemp("reference"))
    yield runs
    runs.close()


# The modules that took longest on a 2-core box (pytest --durations, summed per file), longest
# first. Under xdist (`--dist loadfile`) they are handed out first, so that no worker is left
# alone with a long module at the end; a module missing here only loses its head start.
HEAVY_MODULES = [
    "test_multinode_e2e.py", "test_e2e_local.py", "test_loops_conformance.py",
    "test_demo_e2e.py", "test_faults_db.py", "test_torch_notice_any_loop.py",
    "test_chaos.py", "test_multinode_agent.py",
    "test_integrations_baseline.py", "test_outputs_e2e.py",
    "test_job_state_lightning.py", "test_notify.py",
    "test_notice_lands_e2e.py", "test_rehearsal_startup.py", "test_faults_runtime.py",
    "aws/test_aws_e2e.py", "test_audit_e2e.py", "test_budget_e2e.py", "test_first_hour_e2e.py",
    "test_torch_notice.py", "test_daemon_faults.py",
    "test_notice_lands.py", "test_multinode_daemon.py", "test_torch_multinode.py",
    "test_provider_contract.py", "test_torch_resume.py", "gcp/test_gcp_e2e.py",
    "gcp/test_gcp_multinode.py",
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, put the heavy modules first (a stable sort: the same order on every worker)."""
    if not hasattr(config, "workerinput"):
        return
    rank = {name: i for i, name in enumerate(HEAVY_MODULES)}

    def key(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0].removeprefix("tests/")
        return rank.get(path, len(HEAVY_MODULES))
    items.sort(key=key)

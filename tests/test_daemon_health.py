"""The daemon's own health (issue 24): per-loop tick p50/p99 over the last minute and lag, kept by
the runner, shown by `spotrun daemon --check` and in `/metrics`.

The runner's figures are checked on a hand-moved clock (spotrun.clock.ManualClock), ticks driven
by hand; the scheduler's lag and slots with short real intervals in tests/test_loop_isolation.py;
the rest on a real daemon process over the local market, the real CLI and the real dashboard
server.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from spotrun.clock import ManualClock
from spotrun.config import load_settings
from spotrun.daemon.health import BUCKETS_S, LoopHealth, live_loop_health, read_health
from spotrun.daemon.runner import Runner, Scheduled
from spotrun.db import open_db
from spotrun.ui.metrics import render_metrics
from spotrun.ui.server import make_server

from conftest import kill_leftovers, write_trace
from daemon_helpers import DaemonProc, write_home
from polling import wait_for


class _Loop:
    """A loop whose ticks take the durations it is given, on the manual clock."""

    def __init__(self, name: str, clock: ManualClock, fail: bool = False) -> None:
        self.name, self.clock, self.fail = name, clock, fail
        self.next_s = 0.0
        self.ticks = 0

    def tick(self, now) -> None:
        """Take next_s seconds of the clock."""
        self.ticks += 1
        self.clock.advance(self.next_s)
        if self.fail:
            raise RuntimeError("boom")


def _runner(clock: ManualClock, *loops: tuple[_Loop, float]) -> tuple[Runner, dict]:
    items = {loop.name: Scheduled(loop, interval_s) for loop, interval_s in loops}
    runner = Runner(list(items.values()), clock=clock)
    runner.health.track({name: item.interval_s for name, item in items.items()})
    return runner, items


def _at(clock: ManualClock, start: float, offset_s: float) -> None:
    clock.now_s = start + offset_s


def test_runner_gives_p50_p99_over_the_last_minute_and_a_histogram_since_the_start():
    clock = ManualClock(start_s=1000.0)   # small numbers: durations exact to a nanosecond
    t0 = clock.now_s
    fast = _Loop("fast", clock)
    runner, items = _runner(clock, (fast, 0.5))
    # 100 ticks, taking 0.5 ms .. 99.5 ms (in a shuffled order; off the histogram's bucket
    # bounds), each tick(now) driven here as the scheduler would.
    durations = [((i * 37) % 100 + 0.5) / 1000.0 for i in range(100)]
    for i, took in enumerate(durations):
        _at(clock, t0, i * 0.5)
        fast.next_s = took
        runner.run_tick(items["fast"])
    snap = runner.health.snapshot()["fast"]
    assert snap["ticks"] == 100 and snap["interval_s"] == 0.5 and snap["errors"] == 0
    # Nearest rank: the 50th and 99th of the 100 sorted durations.
    assert snap["p50_s"] == pytest.approx(0.0495) and snap["p99_s"] == pytest.approx(0.0985)
    assert snap["max_s"] == pytest.approx(0.0995)
    assert snap["lag_s"] is None   # the lag is the scheduler's: none without it
    _at(clock, t0, 50.3)
    fast.next_s = 0.001
    runner.run_tick(items["fast"])
    # A minute later the window is empty; the histogram counts on.
    _at(clock, t0, 200.0)
    snap = runner.health.snapshot()["fast"]
    assert snap["ticks"] == 0 and snap["p50_s"] is None and snap["p99_s"] is None
    h = snap["histogram"]
    assert h["count"] == 101 and h["cumulative"][-1] == 101
    assert h["sum_s"] == pytest.approx(sum(durations) + 0.001)
    # Cumulative buckets: <= 5 ms holds the 0.5 .. 4.5 ms ticks and the 1 ms one.
    assert h["le"] == list(BUCKETS_S) and h["cumulative"][0] == 6
    assert h["cumulative"][BUCKETS_S.index(0.1)] == 101


def test_health_keeps_the_lag_and_next_slot_the_scheduler_reports():
    clock = ManualClock(start_s=1000.0)
    t0 = clock.now_s
    health = LoopHealth(clock)
    health.track({"quick": 1.0})
    assert health.snapshot()["quick"]["histogram"]["count"] == 0   # declared before a tick
    health.lag("quick", 0.3)
    health.lag("quick", 0.0)
    snap = health.snapshot()["quick"]
    assert snap["lag_s"] == 0.0 and snap["lag_max_s"] == pytest.approx(0.3)
    # The scheduler's next run is 0.5 s away; 2.7 s later it has not started: 2.2 s overdue.
    health.next_slot("quick", 0.5)
    _at(clock, t0, 2.7)
    assert health.snapshot()["quick"]["overdue_s"] == pytest.approx(2.2)
    started = health.begin("quick")
    assert health.snapshot()["quick"]["overdue_s"] == 0.0   # running: not overdue
    health.end("quick", started)
    # A minute on, the window's lags are gone; the last one stays.
    _at(clock, t0, 100.0)
    snap = health.snapshot()["quick"]
    assert snap["lag_max_s"] is None and snap["lag_s"] == 0.0


def test_a_failing_tick_is_timed_and_counted():
    clock = ManualClock()
    bad = _Loop("bad", clock, fail=True)
    runner, items = _runner(clock, (bad, 1.0))
    bad.next_s = 0.2
    runner.run_tick(items["bad"])
    snap = runner.health.snapshot()["bad"]
    assert runner.errors == 1 and snap["errors"] == 1 and snap["ticks"] == 1
    assert snap["p99_s"] == pytest.approx(0.2)


# ---------------------------------------------------------------- a real daemon

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
_VALUE = r"(?:[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|[+-]Inf|NaN)"
_SAMPLE = re.compile(rf"^({_NAME})(?:\{{((?:{_LABEL})(?:,{_LABEL})*)?\}})? ({_VALUE})(?: -?\d+)?$")
_COMMENT = re.compile(rf"^# (HELP|TYPE) ({_NAME}) (.*)$")
_TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


def parse_exposition(text: str) -> dict[str, dict]:
    """Prometheus text format 0.0.4, strictly: {family: {type, samples: [(name, labels, v)]}}."""
    assert text.endswith("\n")
    families: dict[str, dict] = {}
    for line in text.splitlines():
        assert line, "no blank lines"
        m = _COMMENT.match(line)
        if m:
            kind, name, rest = m.groups()
            fam = families.setdefault(name, {"type": None, "samples": []})
            if kind == "TYPE":
                assert rest in _TYPES and fam["type"] is None and not fam["samples"], line
                fam["type"] = rest
            continue
        assert not line.startswith("#"), line
        m = _SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, labels, value = m.groups()
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        fam = families.get(name) or families.get(base)
        assert fam is not None and fam["type"] is not None, f"sample before its TYPE: {line}"
        if fam is families.get(base) and name != base:
            assert fam["type"] in ("histogram", "summary"), line
        pairs = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"',
                                labels or ""))
        fam["samples"].append((name, pairs, float(value)))
    return families


def _check(home: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, SPOTRUN_HOME=str(home), COLUMNS="80")
    env.pop("SPOTRUN_DB_URL", None)
    return subprocess.run([sys.executable, "-m", "spotrun", "daemon", "--check", *extra],
                          env=env, capture_output=True, text=True, timeout=60)


def _loops_reported(home: Path, names: set[str]) -> dict | None:
    out = _check(home, "--json")
    report = json.loads(out.stdout)
    loops = report.get("loops") or {}
    if out.returncode == 0 and names <= set(loops) and all(loops[n]["ticks"] for n in names):
        return report
    return None


def _histograms(families: dict) -> dict[str, list[tuple[str, float]]]:
    by_loop: dict[str, list[tuple[str, float]]] = {}
    for name, labels, v in families["spotrun_daemon_loop_seconds"]["samples"]:
        if name.endswith("_bucket"):
            by_loop.setdefault(labels["loop"], []).append((labels["le"], v))
    return by_loop


@pytest.fixture
def daemon(tmp_home: Path, tmp_path: Path):
    trace = write_trace(tmp_path / "trace.csv", {"za": [1] * 20}, tick_s=600.0)
    write_home(tmp_home, trace, lease_ttl=5.0)
    d = DaemonProc(tmp_home, tmp_path / "daemon.log")
    try:
        yield d
    finally:
        if d.proc.poll() is None:
            d.kill()
        kill_leftovers(tmp_home / "market")


def test_check_and_metrics_show_the_loops_of_a_running_daemon(daemon, tmp_home: Path):
    core = {"schedule", "reconcile", "heartbeats", "spend", "liveness"}
    report = wait_for(lambda: _loops_reported(tmp_home, core), 60,
                      "daemon --check to show the loops' figures")
    assert report["ok"] and report["lease"]["pid"] == daemon.proc.pid
    assert report["loops_window_s"] == 60.0 and report["loops_age_s"] < 30
    for name in core:
        f = report["loops"][name]
        assert 0 <= f["p50_s"] <= f["p99_s"] <= f["max_s"], (name, f)
        assert f["lag_s"] is not None and f["lag_s"] >= 0 and f["errors"] == 0, (name, f)
        assert "histogram" not in f
    settings = load_settings(str(tmp_home))
    assert report["loops"]["schedule"]["interval_s"] == settings.daemon.schedule_interval_s

    text = _check(tmp_home)
    assert text.returncode == 0 and text.stdout.startswith("ok: daemon ")
    assert all(n in text.stdout for n in core) and "p99 ms" in text.stdout
    assert max(len(line) for line in text.stdout.splitlines()[1:]) <= 80

    # /metrics: the rendering of the live daemon's record parses and has both families.
    engine = open_db(settings.database_url)
    try:
        loops = live_loop_health(engine)
        assert loops is not None and core <= set(loops)
        families = parse_exposition(render_metrics([], [], loops=loops))
    finally:
        engine.dispose()
    assert families["spotrun_daemon_loop_seconds"]["type"] == "histogram"
    assert families["spotrun_daemon_loop_lag_seconds"]["type"] == "gauge"
    hist = _histograms(families)
    assert core <= set(hist)
    for loop, buckets in hist.items():
        counts = [v for _, v in buckets]
        assert [le for le, _ in buckets] == [repr(b) for b in BUCKETS_S] + ["+Inf"], loop
        assert counts == sorted(counts) and (counts[-1] >= 1 or loop not in core), loop
        total = {n: v for n, lab, v in families["spotrun_daemon_loop_seconds"]["samples"]
                 if lab["loop"] == loop and not n.endswith("_bucket")}
        assert total["spotrun_daemon_loop_seconds_count"] == counts[-1], loop
        assert total["spotrun_daemon_loop_seconds_sum"] >= 0, loop
    lags = {lab["loop"]: v for _, lab, v in families["spotrun_daemon_loop_lag_seconds"]["samples"]}
    assert core <= set(lags) and all(v >= 0 for v in lags.values())

    # The dashboard's /metrics route serves the live daemon's loops.
    server = make_server(settings, port=0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        with urllib.request.urlopen(url, timeout=30) as r:
            served = parse_exposition(r.read().decode())
    finally:
        server.shutdown()
        server.server_close()
    assert core <= {lab["loop"] for _, lab, _ in
                    served["spotrun_daemon_loop_lag_seconds"]["samples"]}

    # SIGTERM: a clean stop takes the record with it; --check names no loops.
    assert daemon.terminate(timeout_s=30) == 0
    out = _check(tmp_home, "--json")
    assert out.returncode == 1 and "loops" not in json.loads(out.stdout)
    engine = open_db(settings.database_url)
    try:
        assert read_health(engine) is None and live_loop_health(engine) is None
    finally:
        engine.dispose()


def test_the_metrics_route_parses_and_declares_the_loop_families(tmp_home: Path):
    server = make_server(load_settings(str(tmp_home)), port=0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        with urllib.request.urlopen(url, timeout=30) as r:
            text = r.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    families = parse_exposition(text)
    assert families["spotrun_daemon_loop_seconds"]["type"] == "histogram"
    assert families["spotrun_daemon_loop_lag_seconds"]["type"] == "gauge"
    assert families["spotrun_jobs"]["type"] == "gauge"   # the existing families still parse


def test_the_strict_parser_refuses_what_prometheus_refuses():
    good = '# TYPE x gauge\nx{a="1"} 2.5\n'
    assert parse_exposition(good)["x"]["samples"] == [("x", {"a": "1"}, 2.5)]
    for bad in ('x 1\n',                                  # a sample before its TYPE
                '# TYPE x gauge\nx{a=1} 2\n',            # an unquoted label value
                '# TYPE x gauge\nx{a="1"} two\n',        # not a number
                '# TYPE x gauge\nx_bucket{le="1"} 2\n',  # a bucket of a gauge
                '# TYPE x gauge\nx 1'):                  # no final newline
        with pytest.raises(AssertionError):
            parse_exposition(bad)

"""A multi-node rig for daemon tests: daemon loops in-process, a real local market process, and
a node stand-in per instance that speaks the MULTINODE.md protocol (nodes.json in, per-node
heartbeat and exit reports out) without torch, so the daemon side is tested on its own."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

from sqlmodel import select

from spotrun import layout
from spotrun.db import Attempt, AttemptNode, Event, Job, attempts_of, nodes_of, session

NODE_STANDIN = r'''
import datetime, json, os, sys, threading, time
from pathlib import Path
from spotrun import layout
from spotrun.store import open_store

ud = json.loads(Path("user-data.json").read_text())
iid = os.environ["SPOTRUN_INSTANCE_ID"]
store = open_store(ud["store_uri"])
job, att = ud["job_id"], ud["attempt"]


def get(key):
    try:
        return json.loads(store.get_bytes(key))
    except Exception:
        return None


step, pause = 0, threading.Event()
while True:
    doc = get(layout.nodes_key(job, att)) or {}
    listed = [n for n in doc.get("nodes", []) if n["instance_id"] == iid]
    if listed:
        step += 1
    if get("jobs/%s/test-silent-%s" % (job, iid)) is not None:
        pause.wait(0.1)   # alive but silent: the daemon must call it lost
        continue
    store.put_bytes(layout.node_heartbeat_key(job, att, iid), json.dumps(
        {"ts": datetime.datetime.now(datetime.timezone.utc).isoformat(), "step": step,
         "phase": "running", "total_steps": 1000,
         "nodes_version": doc.get("version"), "last_checkpoint_step": None}).encode())
    hang = get("jobs/%s/test-finish-hang" % job) is not None
    if listed and (hang or get("jobs/%s/test-finish" % job) is not None):
        store.put_bytes(layout.node_exit_key(job, att, iid), json.dumps(
            {"reason": "completed", "exit_code": 0, "step": step}).encode())
        while hang:   # reported, but the instance lingers (until a reclaim ends it)
            pause.wait(0.1)
        sys.exit(0)
    pause.wait(0.1)
'''

TOML = """
[local]
trace = "{trace}"
time_scale = 60.0
[daemon]
schedule_interval_s = 0.2
reconcile_interval_s = 0.2
heartbeat_interval_s = 0.2
heartbeat_timeout_s = {hb_timeout}
orphan_grace_s = 2.0
"""


@contextmanager
def node_rig(home: Path, tmp: Path, nodes: str, hb_timeout_s: float = 120.0) -> Iterator[Any]:
    """(ctx, runner, job id) for a job of `nodes` ("2", "1-2") on a market with room in two
    zones; each instance runs NODE_STANDIN. Everything is stopped afterwards."""
    from conftest import kill_leftovers, write_trace
    from spotrun.config import load_settings
    from spotrun.daemon.app import build_context, build_runner
    from spotrun.jobs import submit, validate_submission
    from spotrun.providers.local.provider import LocalProvider
    trace = write_trace(tmp / "trace.csv", {"zone-a": [1] * 50, "zone-b": [1] * 50},
                        tick_s=600.0)
    (home / "spotrun.toml").write_text(TOML.format(trace=trace, hb_timeout=hb_timeout_s))
    script = tmp / "node_standin.py"
    script.write_text(NODE_STANDIN)
    code = tmp / "code"
    code.mkdir()
    (code / "train.py").write_text("print('unused: the stand-in runs instead')\n")
    spec = tmp / "job.yaml"
    spec.write_text(f"name: mn\ncommand: python train.py\nworkdir: code\n"
                    f"resources: {{nodes: {nodes if nodes.isdigit() else repr(nodes)}}}\n"
                    "policy: {market: spot}\n"
                    f"work: {{total_steps: 1000}}\n")
    settings = load_settings(str(home))
    provider = LocalProvider.from_settings(settings)
    assert provider.options is not None
    provider.options = replace(provider.options, instance_command=f"{sys.executable} {script}",
                               grace_s=1.0)
    ctx = build_context(settings, provider=provider)
    job = submit(validate_submission(spec, settings), ctx.engine)
    runner = build_runner(ctx)
    try:
        yield ctx, runner, job.id
    finally:
        runner.stop(wait=True)
        kill_leftovers(home / "market")


def ticked(runner: Any, check: Any) -> Any:
    """One pass of every loop, then check() (for wait_for)."""
    runner.run_once()
    return check()


def state(ctx: Any, job_id: str) -> tuple[Job, list[Attempt], dict[int, list[AttemptNode]]]:
    """The job, its attempts and each attempt's node rows."""
    with session(ctx.engine) as s:
        atts = attempts_of(s, job_id)
        return s.get(Job, job_id), atts, {a.id: nodes_of(s, a.id) for a in atts}


def nodes_doc(ctx: Any, job_id: str, attempt: int) -> dict | None:
    """The nodes.json the daemon wrote for an attempt (None if none)."""
    try:
        return json.loads(ctx.store.get_bytes(layout.nodes_key(job_id, attempt)))
    except Exception:
        return None


def listed(ctx: Any, job_id: str, attempt: int) -> dict[int, str]:
    """rank -> instance id in the attempt's nodes.json."""
    doc = nodes_doc(ctx, job_id, attempt) or {}
    return {n["rank"]: n["instance_id"] for n in doc.get("nodes", [])}


def beating(ctx: Any, job_id: str, attempt: int, iid: str) -> bool:
    """True once the node's stand-in reported a step while listed."""
    try:
        beat = json.loads(ctx.store.get_bytes(layout.node_heartbeat_key(job_id, attempt, iid)))
    except Exception:
        return False
    return beat.get("step", 0) > 0


def finish(ctx: Any, job_id: str, *, linger: bool = False) -> None:
    """Tell every stand-in of the job to report completed and exit (or, lingering, to report
    and keep its instance running)."""
    ctx.store.put_bytes(f"jobs/{job_id}/test-finish{'-hang' if linger else ''}", b"{}")


def events(ctx: Any, job_id: str, kind: str) -> list[Event]:
    """The job's events of one kind, oldest first."""
    with session(ctx.engine) as s:
        return list(s.exec(select(Event).where(Event.job_id == job_id, Event.kind == kind)
                           .order_by(Event.id)))

"""Multi-node agents without the daemon: real `spotrun agent` processes on a file:// store,
one IMDS per instance, real torchrun, and nodes.json written by the test as the daemon would."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import uuid
from pathlib import Path
from typing import Any

from spotrun import layout
from spotrun.bundle import make_bundle
from spotrun.providers.local.market import imds as imds_mod
from spotrun.providers.local.market import procs
from spotrun.store import open_store

import agent_helpers
from polling import wait_for

JOB_SCRIPT = Path(__file__).parent / "torch_jobs" / "multinode_gloo.py"
# The command line, unchanged on every provider.
TORCHRUN = ("torchrun --nnodes=$SPOTRUN_NNODES --nproc-per-node=$SPOTRUN_GPUS "
            "--rdzv-backend=c10d --rdzv-endpoint=$SPOTRUN_RDZV_ENDPOINT "
            "--rdzv-id=$SPOTRUN_RDZV_ID train.py")
# Dead peers leave the rendezvous after 5 s instead of 15 s (is_host is the agent's to add);
# a shorter expiry (1 x 2) drops LIVE nodes too: keep-alives are sent only every ~2 intervals.
# An elastic round starts 1 s (not 30 s) after it has its minimum.
JOB_ENV = {"PET_RDZV_CONF": "keep_alive_interval=1,keep_alive_max_attempt=5,join_timeout=120,"
                            "last_call_timeout=1",
           "OMP_NUM_THREADS": "1"}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the daemon's way of picking one locally)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """One multi-node job's store, instances (agent + IMDS) and membership file."""

    def __init__(self, root: Path, job_id: str, *, nodes: int = 2, steps: int = 30,
                 args: str = "", **overrides: Any) -> None:
        self.root, self.job_id, self.nodes = root, job_id, nodes
        root.mkdir(parents=True, exist_ok=True)
        self.store_dir = root / "store"
        work = root / "code"
        work.mkdir()
        (work / "train.py").write_text(JOB_SCRIPT.read_text())
        make_bundle(work, root / "bundle.tar.gz")
        self.store = open_store(self.store_dir.as_uri())
        self.store.put_file(layout.bundle_key(job_id), root / "bundle.tar.gz")
        self.ckpt_uri = (root / "checkpoints").as_uri()
        self.config = agent_helpers.make_config(
            self.store_dir, "http://127.0.0.1:9", job_id=job_id, nodes=nodes,
            command=f"{TORCHRUN} --steps {steps} {args.replace('{root}', str(root))}",
            total_steps=steps,
            checkpoint_uri=self.ckpt_uri, env=dict(JOB_ENV), stop_grace_s=5.0,
            **overrides)
        self.version = 0
        self.agents: dict[str, Any] = {}     # instance name -> Popen
        self.imds: dict[str, Any] = {}
        # Instances are killed by the SPOTRUN_INSTANCE_ID their processes carry (as the market
        # does): a tag per cluster keeps another test's (or another run's) "i-0a" out of reach.
        self.tag = uuid.uuid4().hex[:8]

    def iid(self, name: str) -> str:
        """The instance id behind a test's name for it ("i-0a" -> "i-0a-<tag>")."""
        return f"{name}-{self.tag}"

    def start(self, iid: str) -> Any:
        """Boot an instance: its IMDS, then its agent (the same user data on every node)."""
        server = imds_mod.ImdsServer(self.iid(iid)).start()
        self.imds[iid] = server
        proc, _ = agent_helpers.start_agent(self.root, self.config, name=iid,
                                            env={"SPOTRUN_IMDS_ENDPOINT": server.url})
        self.agents[iid] = proc
        return proc

    def write_nodes(self, ranks: dict[int, str], *, endpoint: str, host_rank: int) -> None:
        """nodes.json as the daemon writes it (version + 1 each time)."""
        self.version += 1
        body = {"version": self.version, "nnodes": self.nodes,
                "nnodes_min": self.config.nodes_min or self.nodes,
                "rdzv_id": self.job_id, "rdzv_endpoint": endpoint, "rdzv_host_rank": host_rank,
                "nodes": [{"rank": r, "instance_id": self.iid(i), "host": "127.0.0.1"}
                          for r, i in sorted(ranks.items())]}
        self.store.put_bytes(layout.nodes_key(self.job_id, 1), json.dumps(body).encode())

    def kill(self, iid: str) -> None:
        """The instance vanishes: SIGKILL to its agent and everything it started."""
        proc = self.agents[iid]
        ticks = procs.start_ticks(proc.pid)
        procs.signal_instance(self.iid(iid), proc.pid, ticks, signal.SIGKILL)
        proc.wait(timeout=30)
        wait_for(lambda: not procs.instance_pids(self.iid(iid), None, None), 30,
                 f"{iid} to be gone")
        self.imds.pop(iid).stop()

    def key(self, fn: Any, iid: str) -> Path:
        """A per-node report's file in the store."""
        return self.store_dir / fn(self.job_id, 1, self.iid(iid))

    def report(self, fn: Any, iid: str) -> dict[str, Any] | None:
        """A per-node report (heartbeat / exit / notice), or None while missing."""
        return agent_helpers.read_json(self.key(fn, iid))

    def job_dir(self, iid: str) -> Path:
        """The instance's job folder (the command's cwd)."""
        return self.root / f"{iid}-instance" / "job"

    def final_sha(self) -> str:
        """The final weights' SHA256, written by global rank 0 on whichever node it ran."""
        found = [p.read_text().strip() for iid in self.agents
                 for p in [self.job_dir(iid) / "final-params.sha256"] if p.exists()]
        assert len(set(found)) == 1, found
        return found[0]

    def wait_exit(self, iid: str, timeout_s: float = 180.0) -> dict[str, Any]:
        """The node's exit report once its agent has ended."""
        proc = self.agents[iid]
        proc.wait(timeout=timeout_s)
        body = self.report(layout.node_exit_key, iid)
        assert body is not None, self.stderr(iid)
        return body

    def stderr(self, iid: str) -> str:
        """The agent's own log (for failure messages)."""
        try:
            return (self.root / f"{iid}-stderr.log").read_text()[-4000:]
        except OSError:
            return ""

    def output(self, iid: str) -> str:
        """What the node's command printed (the log segments in the store, in order)."""
        prefix = self.store_dir / layout.node_log_prefix(self.job_id, 1, self.iid(iid))
        return "".join(p.read_text() for p in sorted(prefix.glob("*.log")))

    def close(self) -> None:
        """Kill whatever still runs (a failed test leaves nothing behind)."""
        for iid, proc in list(self.agents.items()):
            if proc.poll() is None or procs.instance_pids(self.iid(iid), None, None):
                procs.signal_instance(self.iid(iid), proc.pid if proc.poll() is None else None,
                                      None, signal.SIGKILL)
                proc.wait(timeout=30)
        for server in self.imds.values():
            server.stop()


def torchrun_node(node_env: dict[str, str], cwd: Path, args: list[str], log: Path) -> Any:
    """One torchrun node started directly (no agent), in a session of its own."""
    import subprocess
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPOTRUN_", "PET_"))}
    env.update(node_env)
    cwd.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *args],
                                cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)

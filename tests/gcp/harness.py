"""GceHost plays the VMs of the fake Compute Engine: what the guest does on each one.

For every managed VM the fake shows RUNNING it does what the startup script and systemd do:
writes the agent config from the VM's metadata (`spotrun-agent-config`) to the VM's disk and
starts `spotrun agent` with GCE_METADATA_HOST pointing at that VM's own metadata server.
A preemption (the fake's on_preempt hook) is the soft-off: `instance/preempted` turns TRUE and
the agent alone gets SIGTERM (the unit's KillMode=mixed). The guest powering off ends the
window early (the fake stops, and with termination action DELETE deletes, the VM); the
window's end, or a delete, kills every process of the VM, as hard-off does. An agent that
ran its shutdown command (power off) powers its VM off: TERMINATED, as on GCE.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from spotrun.providers.gcp.launch import zone_of
from spotrun.providers.gcp.metadata import HOST_ENV
from spotrun.providers.gcp.startup import agent_json_from_metadata
from spotrun.providers.local.market import procs

from cloud_host import CloudHost

from .compute_state import ComputeState
from .metadata_server import MetadataServer

POWEROFF_FILE = "poweroff"   # on a VM's disk: what its shutdown_command would have run


@dataclass
class Machine:
    """One VM played locally: its agent, metadata server and disk."""

    name: str
    zone: str
    proc: subprocess.Popen
    metadata: MetadataServer
    disk: Path
    ticks: int | None = None
    soft_off_at: float | None = None   # monotonic time of the preemption's SIGTERM
    exited_at: float | None = None     # monotonic time the agent was seen gone
    powered_off: bool = False
    gone: bool = False


class GceHost(CloudHost):
    """Boots an agent per RUNNING managed VM of a ComputeState; plays soft-off and hard-off."""

    thread_name = "gce-host"

    def __init__(self, state: ComputeState, root: Path, env: dict[str, str] | None = None,
                 poll_s: float = 0.1) -> None:
        super().__init__(root, env, poll_s)
        self.state = state

    def start(self) -> "GceHost":
        """Start watching the fake; its preemptions and deletions reach the machines."""
        self.state.on_preempt.append(self._soft_off)
        self.state.on_gone.append(self._kill)
        self._thread.start()
        return self

    def _close(self, machine: Machine) -> None:
        machine.metadata.stop()

    # ------------------------------------------------------------ GCP's hooks

    def _soft_off(self, zone: str, name: str, deadline: float) -> None:
        import time
        m = self.machine(name)
        if m is None or m.gone:
            return
        m.metadata.preempt()
        m.soft_off_at = time.monotonic()
        try:
            m.proc.send_signal(signal.SIGTERM)   # systemd stopping the unit's main process
        except ProcessLookupError:
            pass

    def _tick(self) -> None:
        import time
        running = {i["name"]: i for i in self.state.list_instances(
            None, 'labels.spotrun_managed = "true"') if i["status"] == "RUNNING"}
        for name, inst in running.items():
            if self.machine(name) is None:
                m = self._boot(inst)
                with self._lock:
                    self.machines[name] = m
        with self._lock:
            machines = list(self.machines.values())
        for m in machines:
            if m.gone or m.powered_off or m.proc.poll() is None:
                continue
            m.exited_at = m.exited_at or time.monotonic()
            # The agent is done: the guest halts (it was shutting down already on a
            # preemption; otherwise its shutdown command powered it off).
            if m.soft_off_at is not None or (m.disk / POWEROFF_FILE).exists():
                m.powered_off = True
                self.state.guest_shutdown(m.zone, m.name)

    def _boot(self, inst: dict) -> Machine:
        """What the startup script and the agent unit do on a fresh VM."""
        name = inst["name"]
        zone = zone_of(name) or inst["zone"].rsplit("/", 1)[-1]
        items = inst.get("metadata", {}).get("items", [])
        cfg = json.loads(agent_json_from_metadata(items))
        disk = self.root / name
        (disk / "etc").mkdir(parents=True, exist_ok=True)
        if cfg.get("shutdown_command"):
            cfg["shutdown_command"] = (f"printf '%s\\n' {shlex.quote(cfg['shutdown_command'])} > "
                                       f"{shlex.quote(str(disk / POWEROFF_FILE))}")
        if cfg.get("job_dir"):   # /var/lib/spotrun/job on the VM's own disk
            cfg["job_dir"] = str(disk / cfg["job_dir"].lstrip("/"))
        cfg_path = disk / "etc" / "agent.json"
        cfg_path.write_text(json.dumps(cfg, sort_keys=True))
        os.chmod(cfg_path, 0o600)
        md = MetadataServer(name, zone, self.state.project,
                            {i["key"]: i["value"] for i in items}).start()
        env = {k: v for k, v in os.environ.items()
               if k not in (procs.INSTANCE_ENV, "SPOTRUN_IMDS_ENDPOINT")}
        env.update(self.env)
        env[HOST_ENV] = md.host
        with open(disk / "agent.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "spotrun", "agent", "--user-data", str(cfg_path),
                 "--dir", str(disk / "work")],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return Machine(name, zone, proc, md, disk, procs.start_ticks(proc.pid))

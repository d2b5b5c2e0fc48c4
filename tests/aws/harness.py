"""End-to-end harness pieces: an IMDSv2 server per instance on 127.0.0.1, a local agent
process started from the user data moto holds for an instance, and InstanceHost, which
plays the machines: it boots an agent for every instance moto reports running, and
turns an agent's power-off into the instance's termination."""

from __future__ import annotations

import base64
import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spotrun.providers.local.market import imds as market_imds, procs
from spotrun.providers.aws.userdata import agent_json_from_user_data

from cloud_host import CloudHost

POWEROFF_FILE = "poweroff"   # on an instance's disk: what its shutdown_command would have run


class ImdsServer(market_imds.ImdsServer):
    """One instance's IMDSv2 on 127.0.0.1: the project's one implementation, started."""

    def __init__(self, instance_id: str, user_data: str = "") -> None:
        super().__init__(instance_id, user_data=user_data or None)
        self.start()

    def notice(self, action: str, time_iso: str) -> None:
        """Serve an interruption notice from now on."""
        self.arm_notice(action, time_iso)


def user_data_of(ec2: Any, instance_id: str) -> str:
    """The decoded user data moto holds for an instance."""
    raw = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    return base64.b64decode(raw["UserData"]["Value"]).decode()


def start_agent(ec2: Any, instance_id: str, root: Path, env: dict[str, str]) -> tuple[
        subprocess.Popen, ImdsServer]:
    """Do what cloud-init + systemd do on the instance: write agent.json, run the agent.

    The agent gets its own IMDS server (the test serves notices through it) and the
    caller's env (AWS_ENDPOINT_URL, fake credentials) so its S3 traffic goes to moto.
    Its job directory goes onto that disk; its shutdown_command (power off) becomes a command that writes what it would have
    run to <disk>/poweroff, so a finished agent cannot touch this machine; every process
    carries SPOTRUN_INSTANCE_ID so a reclaim can kill all of them, as a vanished VM would.
    """
    text = user_data_of(ec2, instance_id)
    disk = root / instance_id
    (disk / "etc").mkdir(parents=True, exist_ok=True)
    cfg = json.loads(agent_json_from_user_data(text))
    if cfg.get("shutdown_command"):
        cfg["shutdown_command"] = (f"printf '%s\\n' {shlex.quote(cfg['shutdown_command'])} > "
                                   f"{shlex.quote(str(disk / POWEROFF_FILE))}")
    if cfg.get("job_dir"):   # /var/lib/spotrun/job on the instance's own disk
        cfg["job_dir"] = str(disk / cfg["job_dir"].lstrip("/"))
    cfg_path = disk / "etc" / "agent.json"
    cfg_path.write_text(json.dumps(cfg, sort_keys=True))
    os.chmod(cfg_path, 0o600)
    imds = ImdsServer(instance_id, user_data=text)
    with open(disk / "agent.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "spotrun", "agent", "--user-data", str(cfg_path),
             "--dir", str(disk / "work")],
            env={**os.environ, **env, "SPOTRUN_IMDS_ENDPOINT": imds.url,
                 procs.INSTANCE_ENV: instance_id},
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, imds


@dataclass
class Machine:
    """One instance played locally: its agent, metadata service and disk."""

    instance_id: str
    proc: subprocess.Popen
    imds: ImdsServer
    disk: Path
    ticks: int | None = None          # the agent's start time, so a reused pid is not its
    powered_off: bool = False
    gone: bool = False


class InstanceHost(CloudHost):
    """Boots an agent for each managed instance moto reports running; plays power-off.

    A background thread polls EC2 (moto) every poll_s: a new running instance gets an
    agent; an agent that exited after running its shutdown command has its instance
    terminated as EC2 does (Client.InstanceInitiatedShutdown); an instance that moto
    says is gone has its processes killed. Errors in the thread are kept in `errors`.
    """

    thread_name = "instance-host"

    def __init__(self, ec2: Any, moto: Any, root: Path, env: dict[str, str] | None = None,
                 poll_s: float = 0.1) -> None:
        super().__init__(root, env, poll_s)
        self.ec2 = ec2
        self.moto = moto

    def start(self) -> "InstanceHost":
        """Start watching EC2; a FIS interruption's notice reaches the machine's IMDS."""
        self.moto.layer.on_notice(self._fis_notice)
        self._thread.start()
        return self

    def _fis_notice(self, instance_id: str, time_iso: str) -> None:
        m = self.machine(instance_id)
        if m is not None:
            m.imds.notice("terminate", time_iso)

    def reclaim(self, instance_id: str) -> None:
        """EC2 takes the spot instance back: the machine vanishes, moto says reclaimed."""
        self._kill(instance_id)
        self.moto.reclaim(instance_id)

    def _close(self, machine: Machine) -> None:
        machine.imds.stop()

    # ------------------------------------------------------------ the thread

    def _tick(self) -> None:
        resp = self.ec2.describe_instances(Filters=[
            {"Name": "tag:spotrun:managed", "Values": ["true"]}])
        states = {i["InstanceId"]: i["State"]["Name"]
                  for r in resp["Reservations"] for i in r["Instances"]}
        for iid, state in states.items():
            m = self.machine(iid)
            if m is None and state == "running":
                proc, imds = start_agent(self.ec2, iid, self.root, self.env)
                with self._lock:
                    self.machines[iid] = Machine(iid, proc, imds, self.root / iid,
                                                 procs.start_ticks(proc.pid))
            elif m is not None and not m.gone and state in ("shutting-down", "terminated"):
                self._kill(iid)      # terminated from outside (spotrun, the console)
            elif m is not None and not m.powered_off and m.proc.poll() is not None:
                # The agent is done; if it asked for power-off, EC2 terminates the instance.
                if (m.disk / POWEROFF_FILE).exists() and state == "running":
                    m.powered_off = True
                    self.moto.shutdown_from_inside(iid)

"""The daemon as a system service: the unit files verify and are hardened; SIGTERM stops the
real daemon process cleanly, SIGHUP reloads safe settings, `daemon --check` tells health."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from spotrun.daemon.lease import Lease
from spotrun.db import open_db

from conftest import kill_leftovers, write_trace
from daemon_helpers import DaemonProc, log_events, write_home
from polling import wait_for

REPO = Path(__file__).resolve().parent.parent
UNITS = REPO / "systemd"
AGENT_UNIT_FILE = REPO / "spotrun" / "data" / "systemd" / "spotrun-agent.service"
SPOTRUN_BIN = Path(sys.executable).parent / "spotrun"


def _unit(name: str) -> dict[str, list[str]]:
    """key -> values of a unit file (keys may repeat)."""
    out: dict[str, list[str]] = {}
    for line in (UNITS / name).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "[")) and "=" in line:
            k, v = line.split("=", 1)
            out.setdefault(k, []).append(v)
    return out


def test_daemon_unit_is_hardened():
    u = _unit("spotrun-daemon.service")
    assert u["DynamicUser"] == ["yes"] or u.get("User") == ["spotrun"]
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp"):
        assert u[key] == ["yes"], key
    assert u["ProtectSystem"] == ["strict"]
    assert u["StateDirectory"] == ["spotrun"]
    assert "SPOTRUN_HOME=/var/lib/spotrun" in u["Environment"]
    assert u["KillSignal"] == ["SIGTERM"]
    assert u["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert u["ExecStart"][0].endswith("spotrun daemon")
    # Credentials only from the AWS default chain: no keys in the unit.
    text = (UNITS / "spotrun-daemon.service").read_text()
    assert "AWS_ACCESS_KEY_ID" not in text and "AWS_SECRET_ACCESS_KEY" not in text


# Every key that confines the service, the same in the server's unit as in the daemon's.
HARDENING = ("DynamicUser", "StateDirectory", "StateDirectoryMode", "UMask", "NoNewPrivileges",
             "ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices",
             "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs",
             "ProtectControlGroups", "ProtectClock", "ProtectHostname", "RestrictSUIDSGID",
             "RestrictRealtime", "RestrictNamespaces", "LockPersonality",
             "SystemCallArchitectures", "CapabilityBoundingSet", "AmbientCapabilities",
             "RestrictAddressFamilies", "KillSignal", "KillMode", "ExecReload")


def test_server_unit_runs_the_daemon_inside_as_hardened_as_the_daemons():
    server, daemon = _unit("spotrun-server.service"), _unit("spotrun-daemon.service")
    assert {k: server.get(k) for k in HARDENING} == {k: daemon.get(k) for k in HARDENING}
    assert " server --with-daemon " in server["ExecStart"][0]
    assert "SPOTRUN_HOME=/var/lib/spotrun" in server["Environment"]
    # The database URL (it may carry a password) comes from a file, never the unit.
    assert server["EnvironmentFile"] == ["-/etc/spotrun/server.env"]
    assert "SPOTRUN_DB_URL" not in "".join(server["Environment"])


@pytest.mark.parametrize("unit", [UNITS / "spotrun-daemon.service",
                                  UNITS / "spotrun-server.service", AGENT_UNIT_FILE],
                         ids=lambda p: p.name)
def test_units_pass_systemd_analyze_verify(unit: Path, tmp_path: Path):
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    # verify checks that ExecStart exists: point it at this environment's spotrun.
    text = unit.read_text().replace("/opt/spotrun/bin/spotrun", str(SPOTRUN_BIN))
    (tmp_path / unit.name).write_text(text)
    out = subprocess.run([tool, "verify", str(tmp_path / unit.name)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert unit.name not in out.stderr, out.stderr


def test_every_cloud_installs_the_one_agent_unit():
    # One unit file, packaged; EC2 user data writes it and GCE's startup script cats it,
    # both unchanged, both at the same path.
    from spotrun.providers.agent_unit import AGENT_UNIT, UNIT_PATH
    from spotrun.providers.aws.userdata import render_user_data
    from spotrun.providers.gcp.startup import render_startup_script
    packaged = AGENT_UNIT_FILE.read_text()
    assert AGENT_UNIT == packaged
    user_data = yaml.safe_load(render_user_data('{"job_id": "j"}'))
    in_user_data = {f["path"]: f["content"] for f in user_data["write_files"]}[UNIT_PATH]
    script = render_startup_script()
    heredoc = re.search(rf"cat > {re.escape(UNIT_PATH)} <<'UNIT'\n(.*?)^UNIT$", script,
                        re.S | re.M)
    assert heredoc is not None, script
    assert in_user_data == heredoc.group(1) == packaged
    # Neither cloud's boot-script service orders it: that script starts it and waits for it.
    after = [line for line in packaged.splitlines() if line.startswith("After=")]
    assert after == ["After=network-online.target"]
    assert not (UNITS / "spotrun-agent.service").exists()      # no second copy to drift


def _check(home: Path) -> tuple[int, dict]:
    env = dict(os.environ, SPOTRUN_HOME=str(home))
    env.pop("SPOTRUN_DB_URL", None)
    out = subprocess.run([sys.executable, "-m", "spotrun", "daemon", "--check", "--json"],
                         env=env,
                         capture_output=True, text=True, timeout=60)
    return out.returncode, json.loads(out.stdout)



def test_sigterm_stops_cleanly_sighup_reloads_and_check_reports(tmp_home: Path, tmp_path: Path):
    trace = write_trace(tmp_path / "trace.csv", {"za": [1] * 20}, tick_s=600.0)
    write_home(tmp_home, trace, hb_timeout=30.0, lease_ttl=5.0)
    code, report = _check(tmp_home)
    assert code == 1 and "no database" in report["reason"]
    log = tmp_path / "daemon.log"
    d = DaemonProc(tmp_home, log)
    try:
        wait_for(lambda: log_events(log, "lease_acquired"), 30, "the daemon to take the lease")
        code, report = _check(tmp_home)
        assert code == 0 and report["ok"], report
        assert report["lease"]["pid"] == d.proc.pid

        # SIGHUP: a safe key is applied, a key that needs a restart is reported, not applied.
        toml = (tmp_home / "spotrun.toml").read_text()
        toml = toml.replace("heartbeat_timeout_s = 30.0", "heartbeat_timeout_s = 45.0")
        toml = 'region = "eu-west-1"\n' + toml
        (tmp_home / "spotrun.toml").write_text(toml)
        os.kill(d.proc.pid, signal.SIGHUP)
        rec = wait_for(lambda: log_events(log, "reloaded"), 30, "the reload")[0]
        assert rec["applied"] == ["daemon.heartbeat_timeout_s"]
        assert rec["ignored_need_restart"] == ["region"]
        assert rec["heartbeat_timeout_s"] == 45.0
        assert d.proc.poll() is None

        # SIGTERM: the loops stop after the pass in progress, the lease is released, exit 0.
        assert d.terminate(timeout_s=30) == 0
        assert log_events(log, "daemon_exit")[-1]["reason"] == "stopped"
        engine = open_db(f"sqlite:///{tmp_home / 'spotrun.db'}")
        assert Lease(engine, ttl_s=5).holder() is None
        engine.dispose()
        code, report = _check(tmp_home)
        assert code == 1 and report["reason"] == "no daemon holds the lease"
    finally:
        if d.proc.poll() is None:
            d.kill()
        kill_leftovers(tmp_home / "market")


def test_sigterm_while_waiting_for_the_lease_exits_cleanly(tmp_home: Path, tmp_path: Path):
    trace = write_trace(tmp_path / "trace.csv", {"za": [1] * 20}, tick_s=600.0)
    write_home(tmp_home, trace, lease_ttl=60.0)
    engine = open_db(f"sqlite:///{tmp_home / 'spotrun.db'}")
    other = Lease(engine, ttl_s=60.0, owner="elsewhere")   # this test process, alive
    assert other.try_acquire()
    log = tmp_path / "daemon.log"
    d = DaemonProc(tmp_home, log)
    try:
        wait_for(lambda: log_events(log, "lease_waiting"), 30, "the daemon to wait")
        assert d.terminate(timeout_s=30) == 0
        assert not log_events(log, "lease_acquired")
        assert other.holder().owner == "elsewhere"
    finally:
        if d.proc.poll() is None:
            d.kill()
        engine.dispose()

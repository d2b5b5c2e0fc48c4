"""End-to-end harness pieces: an IMDSv2 server per instance on 127.0.0.1, and a local
agent process started from the user data moto holds for an instance."""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from spotrun.providers.aws_userdata import agent_json_from_user_data


@dataclass
class ImdsState:
    """What one fake instance's metadata service says."""

    instance_id: str
    user_data: str = ""
    instance_action: dict[str, str] | None = None     # None = 404 (no notice)
    rebalance: dict[str, str] | None = None
    tokens: set[str] = field(default_factory=set)
    requests: list[str] = field(default_factory=list)


class ImdsServer:
    """IMDSv2 on 127.0.0.1: PUT /latest/api/token, then GETs with the token header."""

    def __init__(self, state: ImdsState) -> None:
        self.state = state
        handler = _make_handler(state)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def notice(self, action: str, time_iso: str) -> None:
        """Serve an interruption notice from now on."""
        self.state.instance_action = {"action": action, "time": time_iso}

    def stop(self) -> None:
        """Shut the server down."""
        self.httpd.shutdown()
        self.httpd.server_close()


def _make_handler(state: ImdsState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet: tests read state.requests
            pass

        def _send(self, code: int, body: str = "") -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_PUT(self) -> None:  # noqa: N802
            state.requests.append(f"PUT {self.path}")
            if self.path != "/latest/api/token" or not self.headers.get(
                    "X-aws-ec2-metadata-token-ttl-seconds"):
                return self._send(400)
            tok = secrets.token_hex(16)
            state.tokens.add(tok)
            self._send(200, tok)

        def do_GET(self) -> None:  # noqa: N802
            state.requests.append(f"GET {self.path}")
            if self.headers.get("X-aws-ec2-metadata-token") not in state.tokens:
                return self._send(401)
            routes = {
                "/latest/meta-data/instance-id": state.instance_id,
                "/latest/user-data": state.user_data or None,
                "/latest/meta-data/spot/instance-action":
                    json.dumps(state.instance_action) if state.instance_action else None,
                "/latest/meta-data/events/recommendations/rebalance":
                    json.dumps(state.rebalance) if state.rebalance else None,
            }
            body = routes.get(self.path)
            self._send(404) if body is None else self._send(200, body)

    return Handler


def user_data_of(ec2: Any, instance_id: str) -> str:
    """The decoded user data moto holds for an instance."""
    raw = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    return base64.b64decode(raw["UserData"]["Value"]).decode()


def start_agent(ec2: Any, instance_id: str, root: Path, env: dict[str, str]) -> tuple[
        subprocess.Popen, ImdsServer]:
    """Do what cloud-init + systemd do on the instance: write agent.json, run the agent.

    The agent gets its own IMDS server (the test serves notices through it) and the
    caller's env (AWS_ENDPOINT_URL, fake credentials) so its S3 traffic goes to moto.
    """
    text = user_data_of(ec2, instance_id)
    disk = root / instance_id
    (disk / "etc").mkdir(parents=True, exist_ok=True)
    cfg_path = disk / "etc" / "agent.json"
    cfg_path.write_text(agent_json_from_user_data(text))
    os.chmod(cfg_path, 0o600)
    imds = ImdsServer(ImdsState(instance_id=instance_id, user_data=text))
    proc = subprocess.Popen(
        [sys.executable, "-m", "spotrun", "agent", "--user-data", str(cfg_path),
         "--dir", str(disk / "work")],
        env={**os.environ, **env, "SPOTRUN_IMDS_ENDPOINT": imds.url},
        stdout=open(disk / "agent.log", "ab"), stderr=subprocess.STDOUT,
        start_new_session=True)
    return proc, imds

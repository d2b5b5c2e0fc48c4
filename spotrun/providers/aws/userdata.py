"""The instance's user data: cloud-init that installs spotrun and starts the agent.

The agent's config (AgentConfig JSON) travels in the user data and is written to
/etc/spotrun/agent.json (mode 0600); the systemd unit (spotrun.providers.agent_unit, the
same on every cloud) runs
`spotrun agent --user-data /etc/spotrun/agent.json --dir /var/lib/spotrun`. The config
gets `shutdown_command` = power off, so an attempt that ended (for any reason) ends its
instance too (shutdown behaviour terminate). `agent_json_from_user_data` reads the
config back (used by the test harness, and by anyone debugging an instance).
"""

from __future__ import annotations

import base64
import shlex

import yaml

from spotrun.providers.bootconfig import MARKER, with_shutdown_command
from spotrun.errors import ConfigError, ProviderError
from spotrun.providers.agent_unit import (AGENT_CONFIG_PATH, AGENT_UNIT, JOB_DIR,  # noqa: F401
                                          SHUTDOWN_COMMAND, UNIT_NAME, UNIT_PATH, VENV)
from spotrun.yamlload import safe_load

MAX_USER_DATA_BYTES = 16 * 1024     # EC2's limit on raw user data


def render_user_data(agent_json: str, *, spotrun_install: str = "spotrun") -> str:
    """The #cloud-config document for one attempt (the agent powers off when it is done)."""
    if not spotrun_install.strip():
        raise ConfigError("must name a pip requirement", field="aws.spotrun_install",
                          value=spotrun_install)
    agent_json = with_shutdown_command(agent_json, SHUTDOWN_COMMAND)
    doc = {
        "write_files": [
            {"path": AGENT_CONFIG_PATH, "permissions": "0600", "owner": "root:root",
             "content": agent_json},
            {"path": UNIT_PATH, "permissions": "0644", "content": AGENT_UNIT},
        ],
        "runcmd": [
            ["python3", "-m", "venv", VENV],
            ["sh", "-c", f"{VENV}/bin/pip install --quiet {shlex.quote(spotrun_install)}"],
            ["systemctl", "daemon-reload"],
            ["systemctl", "enable", "--now", UNIT_NAME],
        ],
    }
    # The marker comment lets `spotrun agent --user-data-imds` read the config too.
    text = ("#cloud-config\n" + MARKER + agent_json.replace("\n", " ") + "\n"
            + yaml.safe_dump(doc, sort_keys=False, width=1 << 20))
    if len(text.encode()) > MAX_USER_DATA_BYTES:
        raise ProviderError(f"user data is {len(text.encode())} bytes; EC2 allows 16 KiB",
                            field="user_data", hint="pass large env values as secrets")
    return text


def encode_user_data(text: str) -> str:
    """Base64, as launch templates and RunInstances want it."""
    return base64.b64encode(text.encode()).decode()


def agent_json_from_user_data(user_data: str) -> str:
    """The AgentConfig JSON inside user data (plain or base64)."""
    text = user_data
    if not text.lstrip().startswith("#cloud-config"):
        try:
            text = base64.b64decode(user_data, validate=True).decode()
        except (ValueError, UnicodeDecodeError):
            raise ProviderError("user data is not cloud-config", field="user_data") from None
    try:
        doc = safe_load(text)
        for f in doc.get("write_files") or []:
            if f.get("path") == AGENT_CONFIG_PATH:
                return str(f["content"])
    except (yaml.YAMLError, AttributeError, KeyError) as exc:
        raise ProviderError(f"unreadable user data: {exc}", field="user_data") from None
    raise ProviderError("no agent config in user data", field="user_data")

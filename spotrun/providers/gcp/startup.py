"""The instance side's start: the VM's metadata and the startup script that boots the agent.

A Compute Engine VM runs the `startup-script` metadata value as root at boot (the guest
environment's google-startup-scripts service). The agent's config (AgentConfig JSON)
travels in its own metadata key, `spotrun-agent-config`; the script copies it to
/etc/spotrun/agent.json (mode 0600), installs spotrun in a venv and starts the agent unit
(spotrun.providers.agent_unit: the same unit as on EC2).
The config gets `shutdown_command` = power off, so an attempt that ended ends its VM too:
GCE then shows it TERMINATED (stopped), and the provider deletes it on sight (its disk would
bill on). The unit stops the agent alone on a shutdown (KillMode=mixed): on a preemption the
ACPI soft-off reaches it as SIGTERM, which the agent takes as the interruption notice (it
asks the job to save, then stops it) inside GCP's 30 s window.
"""

from __future__ import annotations

import shlex
from typing import Any, Iterable

from spotrun.providers.bootconfig import with_shutdown_command
from spotrun.errors import ConfigError, ProviderError
from spotrun.providers.agent_unit import (AGENT_CONFIG_PATH, AGENT_UNIT, SHUTDOWN_COMMAND,
                                          UNIT_NAME, UNIT_PATH, VENV)

AGENT_CONFIG_KEY = "spotrun-agent-config"     # instance metadata: the AgentConfig JSON
TOKEN_KEY = "spotrun-client-token"            # instance metadata: the attempt's client token
# GCE takes 256 KB per metadata value and 512 KB in all (Compute Engine docs, "About VM
# metadata", limits); the config is far smaller, secrets travel as references.
MAX_METADATA_VALUE_BYTES = 256 * 1024

_SCRIPT = """\
#!/bin/bash
# spotrun: boot the agent of one attempt (run as root by GCE at boot).
set -euo pipefail
MD=http://metadata.google.internal/computeMetadata/v1/instance/attributes
install -d -m 0755 /etc/spotrun
if [ ! -s {config} ]; then
  curl -sSf -H 'Metadata-Flavor: Google' "$MD/{key}" -o {config}.tmp
  chmod 0600 {config}.tmp
  mv {config}.tmp {config}
fi
if [ ! -x {venv}/bin/spotrun ]; then
  python3 -m venv {venv}
  {venv}/bin/pip install --quiet {install}
fi
cat > {unit} <<'UNIT'
{unit_text}UNIT
systemctl daemon-reload
systemctl enable --now {unit_name}
"""


def render_startup_script(*, spotrun_install: str = "spotrun") -> str:
    """The startup script (the same for every attempt: the config is its own metadata key)."""
    if not spotrun_install.strip():
        raise ConfigError("must name a pip requirement", field="gcp.spotrun_install",
                          value=spotrun_install)
    return _SCRIPT.format(config=AGENT_CONFIG_PATH, key=AGENT_CONFIG_KEY, venv=VENV,
                          install=shlex.quote(spotrun_install), unit=UNIT_PATH,
                          unit_text=AGENT_UNIT, unit_name=UNIT_NAME)


def agent_config(agent_json: str) -> str:
    """The agent config with `shutdown_command` = power off unless one is set; checked to fit."""
    agent_json = with_shutdown_command(agent_json, SHUTDOWN_COMMAND)
    if len(agent_json.encode()) > MAX_METADATA_VALUE_BYTES:
        raise ProviderError(f"the agent config is {len(agent_json.encode())} bytes; GCE metadata "
                            "values hold 256 KB", field="user_data",
                            hint="pass large env values as secrets")
    return agent_json


def metadata_value(items: Iterable[Any], key: str) -> str | None:
    """One key's value among an instance's metadata items (dicts or the client's objects)."""
    for item in items:
        k = item.get("key") if isinstance(item, dict) else item.key
        if k == key:
            return str(item.get("value") if isinstance(item, dict) else item.value)
    return None


def agent_json_from_metadata(items: Iterable[Any]) -> str:
    """The AgentConfig JSON a VM's metadata carries (the test harness reads it as the VM)."""
    value = metadata_value(items, AGENT_CONFIG_KEY)
    if value is None:
        raise ProviderError("no agent config in the instance metadata", field="metadata",
                            value=AGENT_CONFIG_KEY)
    return value

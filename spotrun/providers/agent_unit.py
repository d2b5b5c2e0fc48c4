"""The agent on a cloud instance: its systemd unit and paths, the same on every cloud.

The unit is one packaged file (spotrun/data/systemd/spotrun-agent.service). AWS user data
(aws/userdata.py) and the GCE startup script (gcp/startup.py) both install it unchanged at
UNIT_PATH and start it once spotrun is installed in VENV.
"""

from __future__ import annotations

from importlib import resources

AGENT_DIR = "/var/lib/spotrun"      # the agent's --dir on every instance (the unit says it)
JOB_DIR = f"{AGENT_DIR}/job"        # the job's directory: the same path on every instance
AGENT_CONFIG_PATH = "/etc/spotrun/agent.json"
UNIT_NAME = "spotrun-agent.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
VENV = "/opt/spotrun"
# Run by the agent after exit.json: the attempt is over, so is the instance.
SHUTDOWN_COMMAND = "shutdown -h now"

AGENT_UNIT = resources.files("spotrun.data").joinpath("systemd", UNIT_NAME).read_text("utf-8")

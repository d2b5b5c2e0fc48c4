"""The agent's config as an instance's boot carries it: whole, as the user data's JSON, or on
one marked line of a boot script; every cloud adds the command that ends the instance after
the attempt. The agent reads it back with spotrun.agent.userdata."""

from __future__ import annotations

import json

from spotrun.errors import ProviderError

MARKER = "# spotrun-agent-config: "


def with_shutdown_command(agent_json: str, command: str) -> str:
    """The agent config with `shutdown_command` set to command, unless one is set already."""
    try:
        cfg = json.loads(agent_json)
    except ValueError:
        raise ProviderError("the agent config is not JSON", field="user_data") from None
    if not isinstance(cfg, dict):
        raise ProviderError("the agent config is not a JSON object", field="user_data")
    if cfg.get("shutdown_command"):
        return agent_json
    # Without it an agent that finished would leave a paid, idle instance behind.
    cfg["shutdown_command"] = command
    return json.dumps(cfg, sort_keys=True)

"""Find the AgentConfig in user data: plain JSON, or one marked line inside a boot script.

On AWS the user data must be a script that starts the agent at boot, so the
config rides along as a comment line `# spotrun-agent-config: {...}`
(spotrun.providers.bootconfig).
"""

from __future__ import annotations

from spotrun.agent.config import AgentConfig
from spotrun.errors import ConfigError
from spotrun.providers.bootconfig import MARKER


def embed_config(script: str, config: AgentConfig) -> str:
    """A boot script carrying config on a marker line (after the shebang, if any)."""
    line = MARKER + config.to_json()
    lines = script.splitlines()
    if lines and lines[0].startswith("#!"):
        return "\n".join([lines[0], line, *lines[1:]]) + "\n"
    return "\n".join([line, *lines]) + "\n"


def _parse(text: str) -> AgentConfig:
    try:
        return AgentConfig.from_json(text)
    except TypeError as exc:   # a required key is missing
        raise ConfigError(f"incomplete agent config: {exc}", field="user_data") from None


def config_from_user_data(text: str) -> AgentConfig:
    """Parse user data: the whole text as JSON, else the marker line."""
    stripped = text.strip()
    if stripped.startswith("{"):
        return _parse(stripped)
    for line in text.splitlines():
        if line.startswith(MARKER):
            return _parse(line[len(MARKER):])
    raise ConfigError("user data holds no agent config", field="user_data",
                      hint=f"expected JSON or a line starting with {MARKER.strip()!r}")

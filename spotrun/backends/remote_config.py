"""The stored remote: `$XDG_CONFIG_HOME/spotrun/remote.json` (url + token, mode 0600)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from spotrun.errors import ConfigError


@dataclass(frozen=True)
class Remote:
    """A team server and the token to call it with."""

    url: str
    token: str


def remote_path() -> Path:
    """Where `spotrun login` stores the remote."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path("~/.config").expanduser())
    return Path(base) / "spotrun" / "remote.json"


def load_remote() -> Remote | None:
    """The stored remote, or None when there is none."""
    path = remote_path()
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        return Remote(url=str(data["url"]), token=str(data["token"]))
    except (ValueError, KeyError, TypeError):
        raise ConfigError("not a spotrun remote file", field=str(path),
                          hint="run `spotrun logout`, then `spotrun login URL`") from None


def save_remote(remote: Remote) -> Path:
    """Write the remote, readable by its owner only (created 0600, never wider)."""
    path = remote_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": remote.url, "token": remote.token}, f)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def forget_remote() -> bool:
    """Remove the stored remote; whether there was one."""
    path = remote_path()
    if not path.exists():
        return False
    path.unlink()
    return True

"""Helpers for the runtime fault suite: an instance that outlives its agent, a market started
with it, and an in-process daemon on a test home (real market, agents, SQLite, store)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from spotrun import layout
from spotrun.config import load_settings
from spotrun.providers.local.market.client import MarketClient, ensure_market
from spotrun.providers.local.market.options import MarketOptions

# The instance runs the real agent, then stays up (as an AWS instance does between the
# agent's exit report and its shutdown) until the market kills it (a reclaim, a terminate)
# or ./release appears on its disk. It also keeps a record of the agent's exit.
HOLD_SCRIPT = r'''
import os, subprocess, sys, time
rc = subprocess.call([sys.executable, "-m", "spotrun", "agent", "--user-data", "user-data.json"])
with open("agent-exited.tmp", "w") as f:
    f.write(str(rc))
os.replace("agent-exited.tmp", "agent-exited")
while not os.path.exists("release"):
    time.sleep(0.02)
'''


def hold_command(tmp: Path) -> str:
    """An instance_command whose instance outlives its agent (see HOLD_SCRIPT)."""
    script = tmp / "hold_instance.py"
    script.write_text(HOLD_SCRIPT)
    return f"{sys.executable} {script}"


def start_market(home: Path, **overrides: Any) -> MarketClient:
    """The home's market (as the daemon would start it), with option overrides."""
    settings = load_settings(str(home))
    return ensure_market(settings.home_path / "market",
                         MarketOptions.from_settings(settings, **overrides))


def exit_report(home: Path, job_id: str, attempt: int) -> dict | None:
    """The agent's exit.json in the home's file store, or None."""
    path = home / "store" / layout.exit_key(job_id, attempt)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None

"""Zones a provider knows, without starting or calling the provider (for validation)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from spotrun.config import Settings

DEFAULT_AWS_ZONES = {
    "us-east-1": ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1e",
                  "us-east-1f"],
    "us-east-2": ["us-east-2a", "us-east-2b", "us-east-2c"],
    "us-west-2": ["us-west-2a", "us-west-2b", "us-west-2c", "us-west-2d"],
}


def local_trace_path(settings: Settings) -> Path:
    """The availability trace the local market replays (the packaged demo extract by default)."""
    if settings.local.trace:
        return Path(settings.local.trace)
    from spotrun.market.options import DEMO_TRACE
    return Path(str(resources.files("spotrun.data").joinpath("traces", DEMO_TRACE)))


def known_zones(settings: Settings) -> list[str]:
    """Zones the configured provider can launch into."""
    if settings.provider == "local":
        path = local_trace_path(settings)
        try:
            header = path.read_text(encoding="utf-8").splitlines()[0].split(",")
        except (OSError, IndexError):
            return []
        pools = header[2:]
        if settings.local.pools:
            pools = [p for p in pools if p in settings.local.pools]
        return pools
    # Configured subnets ("zone=subnet-id") say where launches can go.
    subnets = [s.split("=", 1)[0].strip() for s in settings.aws.subnets if "=" in s]
    if subnets:
        return sorted(set(subnets))
    return list(DEFAULT_AWS_ZONES.get(settings.region, []))

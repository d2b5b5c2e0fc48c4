"""`[notify]` parsed: webhook names to URLs, and each event's webhooks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from spotrun.errors import ConfigError
from spotrun.notify import EVENTS


@dataclass(frozen=True)
class NotifyConfig:
    """Webhooks by name and the names each event goes to."""

    webhooks: dict[str, str]
    routes: dict[str, tuple[str, ...]]

    def targets(self, event: str) -> tuple[str, ...]:
        """The webhook names an event is sent to."""
        return self.routes.get(event, tuple(self.webhooks))


def parse_notify(settings: Any) -> NotifyConfig:
    """Validate `[notify] webhooks` and `routes`; ConfigError names the bad entry."""
    n = settings.notify
    hooks: dict[str, str] = {}
    for i, entry in enumerate(n.webhooks):
        name, sep, url = entry.partition("=")
        name, url = name.strip(), url.strip()
        parsed = urlparse(url)
        if not sep or not name or parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigError("allowed: \"name=https://host/path\" (http or https)",
                              field=f"notify.webhooks[{i}]", value=entry.split("=", 1)[0])
        if name in hooks:
            raise ConfigError("webhook names must be unique", field=f"notify.webhooks[{i}]",
                              value=name)
        hooks[name] = url
    routes: dict[str, tuple[str, ...]] = {}
    for i, entry in enumerate(n.routes):
        event, sep, names = entry.partition("=")
        event = event.strip()
        if not sep or event not in EVENTS:
            raise ConfigError(f"allowed: \"EVENT=name,...\" with EVENT one of {', '.join(EVENTS)}",
                              field=f"notify.routes[{i}]", value=entry)
        picked = tuple(x.strip() for x in names.split(",") if x.strip())
        unknown = [x for x in picked if x not in hooks]
        if unknown:
            named = ", ".join(hooks) or "none"
            raise ConfigError(f"no webhook named {unknown[0]!r}; named: {named}",
                              field=f"notify.routes[{i}]", value=entry)
        routes[event] = picked
    if not 0 < n.budget_warn_fraction < 1:
        raise ConfigError("must be between 0 and 1", field="notify.budget_warn_fraction",
                          value=n.budget_warn_fraction)
    return NotifyConfig(webhooks=hooks, routes=routes)

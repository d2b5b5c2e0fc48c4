"""The instance side on GCE: the metadata server, as the agent's InstanceMetadata.

- Where: `GCE_METADATA_HOST` (host[:port], the variable google-auth reads), else the agent
  config's `imds_endpoint` (`gcp.metadata_host`, metadata.google.internal by default).
- Every request carries `Metadata-Flavor: Google`, and an answer must carry it back: the
  server refuses requests without it, and a proxy answering in its place would not send it.
- The notice: `instance/preempted` turns TRUE when Compute Engine preempts the VM. The agent
  long-polls it (`?wait_for_change=true&last_etag=...`): the server answers at once when the
  value differs from the ETag it was given, else when it changes or `timeout_sec` passes, so
  the notice is seen within milliseconds and none is missed between polls.
- The guest's shutdown: the same preemption sends an ACPI soft-off, which systemd turns into
  SIGTERM for the agent; 30 s later the VM is hard-off. `soft_off_notice_s` tells the agent
  to take that signal as the notice too (spotrun.agent.attempt).
GCE has no rebalance hint; the instance id is the VM's name (what the provider calls it).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Mapping

from spotrun.errors import ProviderError
from spotrun.providers.gcp import PREEMPTION_WINDOW_S

HOST_ENV = "GCE_METADATA_HOST"
FLAVOR = ("Metadata-Flavor", "Google")
PREEMPTED = "instance/preempted"
NAME = "instance/name"


def _iso(epoch_s: float) -> str:
    from datetime import datetime, timezone
    return datetime.fromtimestamp(epoch_s, timezone.utc).isoformat()


class GceMetadata:
    """GETs to the GCE metadata server (an InstanceMetadata for the agent)."""

    soft_off_notice_s: float | None = PREEMPTION_WINDOW_S
    blocks_until_change = True

    def __init__(self, base_url: str, *, wait_s: int = 30, timeout_s: float = 2.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.base_url = base_url.rstrip("/")
        self.wait_s = max(1, int(wait_s))
        self.timeout_s = timeout_s
        self.clock = clock
        self._etag: str | None = None

    @classmethod
    def for_agent(cls, config: Any, environ: Mapping[str, str],
                  monotonic: Callable[[], float]) -> "GceMetadata":
        """The agent's client: GCE_METADATA_HOST if set, else the configured endpoint."""
        host = environ.get(HOST_ENV) or config.imds_endpoint
        return cls(host if "://" in host else f"http://{host}")

    def _get(self, path: str, params: dict[str, str] | None = None,
             timeout_s: float | None = None) -> tuple[str | None, str | None]:
        """(body, ETag) of GET /computeMetadata/v1/<path>; (None, None) on 404."""
        url = f"{self.base_url}/computeMetadata/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        req = urllib.request.Request(url, headers=dict([FLAVOR]))
        try:
            with urllib.request.urlopen(req, timeout=timeout_s or self.timeout_s) as resp:
                if resp.headers.get(FLAVOR[0]) != FLAVOR[1]:
                    raise ProviderError("the answer is not from the GCE metadata server "
                                        f"(no {FLAVOR[0]}: {FLAVOR[1]})", field="imds",
                                        value=self.base_url)
                return resp.read().decode(), resp.headers.get("ETag")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None, None
            raise ProviderError(f"GCE metadata GET {path}: HTTP {exc.code}", field="imds",
                                value=self.base_url) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ProviderError(f"GCE metadata GET {path} failed: {exc}", field="imds",
                                value=self.base_url) from None

    def interruption(self) -> dict[str, Any] | None:
        """{"action": "preempted", "time": hard-off} once instance/preempted is TRUE.

        The first call reads the value; later ones wait for it to change (wait_s at most).
        """
        if self._etag is None:
            body, etag = self._get(PREEMPTED)
        else:
            body, etag = self._get(PREEMPTED, {"wait_for_change": "true",
                                               "timeout_sec": str(self.wait_s),
                                               "last_etag": self._etag},
                                   timeout_s=self.wait_s + 5.0)
        self._etag = etag or self._etag or ""
        if body is not None and body.strip().upper() == "TRUE":
            return {"action": "preempted", "time": _iso(self.clock() + PREEMPTION_WINDOW_S)}
        return None

    def rebalance(self) -> dict[str, Any] | None:
        """None: GCE sends no earlier hint than the preemption itself."""
        return None

    def instance_id(self) -> str | None:
        """The VM's name; None when the server cannot say."""
        try:
            body, _ = self._get(NAME)
        except ProviderError:
            return None
        return body.strip() if body and body.strip() else None

    def put(self, path: str, body: Mapping[str, object]) -> None:
        """The metadata server takes no reports from the guest."""
        raise ProviderError("the GCE metadata server takes no reports", field="imds",
                            value=path)

"""The agent's view of its instance, and the IMDSv2 client that serves EC2 and the local market.

`InstanceMetadata` is what the agent asks of any instance: the interruption notice (and
the rebalance hint), whether the guest's shutdown signal is itself a notice, and the
instance's id. `open_metadata` gives the one the agent's config names: a provider's own
(`instance_side`, declared in its ProviderFacts.instance_metadata), else IMDSv2.

A small IMDSv2 client: session token by PUT, then GETs carrying it.

AWS serves this at 169.254.169.254; the local market serves the same protocol
on 127.0.0.1 (SPOTRUN_IMDS_ENDPOINT). urllib keeps the agent free of extra deps.

A local market that restarts comes back on a new port, and the instances it
left running must still hear their notices. We chose a discovery file over a
stable port: a freed port can be taken by another process before the market
returns, while the market rewrites its market.json (atomically) at every start.
So when a request cannot connect, the client re-reads the file named by
SPOTRUN_IMDS_DISCOVERY and retries at the address it gives (AWS sets no such
variable: 169.254.169.254 never moves).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from spotrun.errors import ConfigError, ProviderError
from spotrun.providers.facts import FACTS

TOKEN_PATH = "/latest/api/token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
INSTANCE_ACTION = "meta-data/spot/instance-action"
REBALANCE = "meta-data/events/recommendations/rebalance"
USER_DATA = "user-data"
INSTANCE_ID_PATH = "meta-data/instance-id"
PHASE = "spotrun/phase"   # the local market's extension: the job trains / saved on the notice
ENDPOINT_ENV = "SPOTRUN_IMDS_ENDPOINT"
DEFAULT_ENDPOINT = "http://169.254.169.254"
DISCOVERY_ENV = "SPOTRUN_IMDS_DISCOVERY"
INSTANCE_ENV = "SPOTRUN_INSTANCE_ID"

Discover = Callable[[], "str | None"]


class InstanceMetadata(Protocol):
    """What the agent asks of its instance, whatever the cloud."""

    # The guest's shutdown signal (SIGTERM to the agent) is an interruption notice with this
    # many seconds before the instance is gone (GCE's ACPI soft-off); None: it is not one.
    soft_off_notice_s: float | None
    # interruption() waits for a change itself (a long poll): no pause between polls.
    blocks_until_change: bool

    def interruption(self) -> dict[str, Any] | None:
        """The interruption notice ({"action", "time"}) once there is one, else None."""

    def rebalance(self) -> dict[str, Any] | None:
        """An earlier, softer hint that the instance may go ({"noticeTime"}), else None."""

    def instance_id(self) -> str | None:
        """This instance's id as its provider names it, or None when it cannot say."""

    def put(self, path: str, body: Mapping[str, object]) -> None:
        """Report to the metadata service (the local market's phases); ProviderError if it
        takes no reports."""


def parse_notice(body: str) -> dict[str, Any]:
    """A notice body as a mapping ({"raw": ...} when it is not a JSON object)."""
    try:
        obj = json.loads(body)
    except ValueError:
        return {"raw": body[:200]}
    return obj if isinstance(obj, dict) else {"raw": body[:200]}


def open_metadata(config: Any, *, environ: Mapping[str, str],
                  monotonic: Callable[[], float] = time.monotonic) -> InstanceMetadata:
    """The instance side the agent's config names: its provider's, else IMDSv2."""
    side = config.instance_side
    if side:
        facts = FACTS.get(side)
        if facts is None or facts.instance_metadata is None:
            raise ConfigError(f"no instance side for this provider; allowed: "
                              f"{', '.join(n for n, f in FACTS.items() if f.instance_metadata)}",
                              field="user_data.instance_side", value=side)
        return facts.instance_metadata(config, environ, monotonic)
    return ImdsClient(endpoint_for(config.imds_endpoint, environ),
                      token_ttl_s=config.imds_token_ttl_s, monotonic=monotonic,
                      discover=discovery_from_env(environ))


def endpoint_for(configured: str, environ: Mapping[str, str] | None = None) -> str:
    """The IMDS base URL: SPOTRUN_IMDS_ENDPOINT if set, else the configured one."""
    env = os.environ if environ is None else environ
    return (env.get(ENDPOINT_ENV) or configured).rstrip("/")


def discovery_from_env(environ: Mapping[str, str] | None = None) -> Discover | None:
    """A function giving the current IMDS base URL from the discovery file, if one is set."""
    env = os.environ if environ is None else environ
    path, instance_id = env.get(DISCOVERY_ENV), env.get(INSTANCE_ENV)
    if not path or not instance_id:
        return None

    def discover() -> str | None:
        try:
            info = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None   # the market is down or mid-restart: the next failure looks again
        base = info.get("imds_url") if isinstance(info, dict) else None
        return f"{str(base).rstrip('/')}/{instance_id}" if base else None

    return discover


class ImdsClient:
    """IMDSv2 GETs with a token that is refreshed before it expires (an InstanceMetadata)."""

    soft_off_notice_s: float | None = None   # EC2 notices come through IMDS, not a shutdown
    blocks_until_change = False

    def __init__(self, base_url: str, *, token_ttl_s: int = 21600, timeout_s: float = 1.0,
                 monotonic: Callable[[], float] = time.monotonic,
                 discover: Discover | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._discover = discover
        self.rediscoveries = 0
        self.token_ttl_s = max(1, int(token_ttl_s))
        self.timeout_s = timeout_s
        self._monotonic = monotonic
        self._token: str | None = None
        self._token_at = 0.0
        self.tokens_fetched = 0

    def _rediscover(self) -> bool:
        """Look the endpoint up again; True if it moved (then the caller retries)."""
        found = self._discover() if self._discover else None
        if not found or found.rstrip("/") == self.base_url:
            return False
        self.base_url = found.rstrip("/")
        self.rediscoveries += 1
        return True

    def _open(self, build: Callable[[str], urllib.request.Request]) -> str:
        """Send build(base_url); on a connection failure retry once where discovery points."""
        for first in (True, False):
            try:
                with urllib.request.urlopen(build(self.base_url), timeout=self.timeout_s) as resp:
                    return resp.read().decode()
            except urllib.error.HTTPError:
                raise
            except (urllib.error.URLError, OSError):
                if first and self._rediscover():
                    continue
                raise
        raise AssertionError("unreachable")

    def _refresh_due(self) -> bool:
        # Renew well before expiry: a minute early, or halfway for very short TTLs.
        margin = min(60.0, self.token_ttl_s / 2)
        age_s = self._monotonic() - self._token_at
        return self._token is None or age_s >= self.token_ttl_s - margin

    def token(self) -> str:
        """A valid session token, fetched or renewed as needed."""
        if self._refresh_due():
            try:
                self._token = self._open(lambda base: urllib.request.Request(
                    base + TOKEN_PATH, method="PUT",
                    headers={TTL_HEADER: str(self.token_ttl_s)})).strip()
            except (urllib.error.URLError, OSError) as exc:
                raise ProviderError(f"IMDS token request failed: {exc}", field="imds",
                                    value=self.base_url) from None
            self._token_at = self._monotonic()
            self.tokens_fetched += 1
        assert self._token is not None
        return self._token

    def get(self, path: str) -> str | None:
        """GET /latest/<path>; None on 404 (e.g. no notice). One retry on 401 with a new token."""
        for attempt in (1, 2):
            token = self.token()
            try:
                return self._open(lambda base: urllib.request.Request(
                    f"{base}/latest/{path}", headers={TOKEN_HEADER: token}))
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                if exc.code == 401 and attempt == 1:
                    self._token = None   # expired or revoked: fetch a fresh one
                    continue
                raise ProviderError(f"IMDS GET {path}: HTTP {exc.code}", field="imds",
                                    value=self.base_url) from None
            except (urllib.error.URLError, OSError) as exc:
                raise ProviderError(f"IMDS GET {path} failed: {exc}", field="imds",
                                    value=self.base_url) from None
        return None

    def interruption(self) -> dict[str, Any] | None:
        """The spot instance-action, once EC2 (or the local market) has posted one."""
        body = self.get(INSTANCE_ACTION)
        return None if body is None else parse_notice(body)

    def rebalance(self) -> dict[str, Any] | None:
        """The rebalance recommendation, once posted."""
        body = self.get(REBALANCE)
        return None if body is None else parse_notice(body)

    def instance_id(self) -> str | None:
        """meta-data/instance-id; None when IMDS cannot say."""
        try:
            found = self.get(INSTANCE_ID_PATH)
        except ProviderError:
            return None
        return found.strip() if found and found.strip() else None

    def put(self, path: str, body: Mapping[str, object]) -> None:
        """PUT JSON to /latest/<path> with the session token (the local market's phase report)."""
        token = self.token()
        data = json.dumps(dict(body)).encode()
        try:
            self._open(lambda base: urllib.request.Request(
                f"{base}/latest/{path}", data=data, method="PUT",
                headers={TOKEN_HEADER: token, "Content-Type": "application/json"}))
        except (urllib.error.URLError, OSError) as exc:
            raise ProviderError(f"IMDS PUT {path} failed: {exc}", field="imds",
                                value=self.base_url) from None

"""A small IMDSv2 client: session token by PUT, then GETs carrying it.

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
from typing import Callable, Mapping

from spotrun.errors import ProviderError

TOKEN_PATH = "/latest/api/token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
INSTANCE_ACTION = "meta-data/spot/instance-action"
REBALANCE = "meta-data/events/recommendations/rebalance"
USER_DATA = "user-data"
PHASE = "spotrun/phase"   # the local market's extension: the job trains / saved on the notice
ENDPOINT_ENV = "SPOTRUN_IMDS_ENDPOINT"
DEFAULT_ENDPOINT = "http://169.254.169.254"
DISCOVERY_ENV = "SPOTRUN_IMDS_DISCOVERY"
INSTANCE_ENV = "SPOTRUN_INSTANCE_ID"

Discover = Callable[[], "str | None"]


def endpoint_for(configured: str) -> str:
    """The IMDS base URL: SPOTRUN_IMDS_ENDPOINT if set, else the configured one."""
    return (os.environ.get(ENDPOINT_ENV) or configured).rstrip("/")


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
    """IMDSv2 GETs with a token that is refreshed before it expires."""

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

"""A small IMDSv2 client: session token by PUT, then GETs carrying it.

AWS serves this at 169.254.169.254; the local market serves the same protocol
on 127.0.0.1 (SPOTRUN_IMDS_ENDPOINT). urllib keeps the agent free of extra deps.
"""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
from typing import Callable

from spotrun.errors import ProviderError

TOKEN_PATH = "/latest/api/token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
INSTANCE_ACTION = "meta-data/spot/instance-action"
REBALANCE = "meta-data/events/recommendations/rebalance"
USER_DATA = "user-data"
ENDPOINT_ENV = "SPOTRUN_IMDS_ENDPOINT"
DEFAULT_ENDPOINT = "http://169.254.169.254"


def endpoint_for(configured: str) -> str:
    """The IMDS base URL: SPOTRUN_IMDS_ENDPOINT if set, else the configured one."""
    return (os.environ.get(ENDPOINT_ENV) or configured).rstrip("/")


class ImdsClient:
    """IMDSv2 GETs with a token that is refreshed before it expires."""

    def __init__(self, base_url: str, *, token_ttl_s: int = 21600, timeout_s: float = 1.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.base_url = base_url.rstrip("/")
        self.token_ttl_s = max(1, int(token_ttl_s))
        self.timeout_s = timeout_s
        self._monotonic = monotonic
        self._token: str | None = None
        self._token_at = 0.0
        self.tokens_fetched = 0

    def _refresh_due(self) -> bool:
        # Renew well before expiry: a minute early, or halfway for very short TTLs.
        margin = min(60.0, self.token_ttl_s / 2)
        age_s = self._monotonic() - self._token_at
        return self._token is None or age_s >= self.token_ttl_s - margin

    def token(self) -> str:
        """A valid session token, fetched or renewed as needed."""
        if self._refresh_due():
            req = urllib.request.Request(self.base_url + TOKEN_PATH, method="PUT",
                                         headers={TTL_HEADER: str(self.token_ttl_s)})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    self._token = resp.read().decode().strip()
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
            req = urllib.request.Request(f"{self.base_url}/latest/{path}",
                                         headers={TOKEN_HEADER: self.token()})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    return resp.read().decode()
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

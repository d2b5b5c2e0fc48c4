"""boto3 clients built from settings, and the one retry policy every AWS call goes through.

botocore's own retries are switched off so that throttling and 5xx reach tenacity,
which backs off with full jitter; capacity and validation errors are never retried.
`endpoint_url` (or botocore's own `AWS_ENDPOINT_URL`) points everything at moto in tests.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Protocol, TypeVar

from tenacity import (Retrying, retry_if_exception, stop_after_attempt,
                      wait_random_exponential)

from spotrun.errors import ProviderError

log = logging.getLogger(__name__)
T = TypeVar("T")

THROTTLING_CODES = frozenset({
    "RequestLimitExceeded", "Throttling", "ThrottlingException", "RequestThrottled",
    "TooManyRequestsException", "SlowDown", "RequestThrottledException",
    "InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable",
})
CAPACITY_CODES = frozenset({
    "InsufficientInstanceCapacity", "MaxSpotInstanceCountExceeded", "SpotMaxPriceTooLow",
    "InsufficientCapacity", "InsufficientHostCapacity", "InsufficientReservedInstanceCapacity",
    "UnfulfillableCapacity", "InsufficientCapacityOnHost",
})


class BotoClient(Protocol):
    """The part of a boto3 client spotrun relies on (calls are attributes)."""

    meta: Any

    def __getattr__(self, name: str) -> Any: ...


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to back off on throttling / 5xx."""

    attempts: int = 6
    base_s: float = 0.5
    max_s: float = 20.0

    @classmethod
    def from_settings(cls, aws: Any) -> "RetryPolicy":
        """From an AwsSettings."""
        return cls(attempts=max(1, aws.retry_attempts), base_s=aws.retry_base_s,
                   max_s=aws.retry_max_s)


def error_code(exc: BaseException) -> str:
    """The AWS error code of a botocore ClientError, else ''."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def _http_status(exc: BaseException) -> int:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return 0


def is_retryable(exc: BaseException) -> bool:
    """True for throttling, 5xx and dropped connections; never for capacity errors."""
    from botocore.exceptions import ConnectionError as BotoConnectionError

    if isinstance(exc, BotoConnectionError):
        return True
    code = error_code(exc)
    if code in CAPACITY_CODES:
        return False
    return code in THROTTLING_CODES or _http_status(exc) >= 500


def call(policy: RetryPolicy, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """fn(*args, **kwargs), retried with jittered exponential back-off while is_retryable."""
    retrying = Retrying(
        stop=stop_after_attempt(policy.attempts),
        wait=wait_random_exponential(multiplier=policy.base_s, max=policy.max_s),
        retry=retry_if_exception(is_retryable),
        reraise=True,
        before_sleep=lambda rs: log.info("aws retry %s after %s", rs.attempt_number,
                                         error_code(rs.outcome.exception()) or "error"),
    )
    return retrying(fn, *args, **kwargs)


def make_client(service: str, *, region: str, endpoint_url: str = "") -> Any:
    """A boto3 client for service with botocore retries off (tenacity does them)."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:  # pragma: no cover - boto3 is a dependency
        raise ProviderError("boto3 is not installed", hint="pip install boto3") from exc
    custom = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get(
        "AWS_ENDPOINT_URL")
    cfg = Config(region_name=region, retries={"total_max_attempts": 1, "mode": "standard"},
                 connect_timeout=10, read_timeout=60,
                 # A custom endpoint (moto) has no virtual-host bucket DNS.
                 s3={"addressing_style": "path"} if custom else None)
    session = boto3.session.Session()
    return session.client(service, region_name=region, endpoint_url=endpoint_url or None,
                          config=cfg)


def clients_from_settings(settings: Any, *services: str) -> dict[str, Any]:
    """{service: client} for the given services, from Settings (region, aws.endpoint_url)."""
    return {s: make_client(s, region=settings.region, endpoint_url=settings.aws.endpoint_url)
            for s in services}

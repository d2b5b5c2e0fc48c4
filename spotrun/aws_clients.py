"""boto3 clients built from settings, with botocore's standard retries under our limits.

Every client retries throttling, 5xx and dropped connections in botocore itself (standard
mode) with our `RetryPolicy`: tries per call, a jittered exponential back-off between
`base_s` and `max_s`; capacity errors (EC2 answers some with a 500) are never retried, so a
launch moves on to the next pool at once. `endpoint_url` (or botocore's own
`AWS_ENDPOINT_URL`) points everything at moto in tests.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Any, Protocol

from spotrun.errors import ProviderError

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


def use_retries(client: Any, policy: RetryPolicy) -> Any:
    """Put botocore's standard retry handler, with our limits, on a client (also one given)."""
    from botocore.retries import quota, standard

    class Conditions(standard.StandardRetryConditions):
        def is_retryable(self, context: Any) -> bool:
            return context.get_error_code() not in CAPACITY_CODES and super().is_retryable(context)

    class Backoff(standard.BaseRetryBackoff):
        def delay_amount(self, context: Any) -> float:
            return random.random() * min(policy.base_s * 2 ** (context.attempt_number - 1),
                                         policy.max_s)

    checker = standard.RetryQuotaChecker(quota.RetryQuota())
    handler = standard.RetryHandler(
        retry_policy=standard.RetryPolicy(
            retry_checker=Conditions(max_attempts=policy.attempts), retry_backoff=Backoff()),
        retry_event_adapter=standard.RetryEventAdapter(), retry_quota=checker)
    name = client.meta.service_model.service_id.hyphenize()
    events = client.meta.events
    # Same ids as botocore's own registration, so ours replaces it (and a second call, ours).
    for event, fn, uid in ((f"needs-retry.{name}", handler.needs_retry, f"retry-config-{name}"),
                           (f"after-call.{name}", checker.release_retry_quota,
                            f"spotrun-retry-quota-{name}")):
        events.unregister(event, unique_id=uid)
        events.register(event, fn, unique_id=uid)
    return client


def make_client(service: str, *, region: str, endpoint_url: str = "",
                retry: RetryPolicy | None = None) -> Any:
    """A boto3 client for service, retrying in botocore with `retry` (default RetryPolicy())."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:  # pragma: no cover - boto3 is a dependency
        raise ProviderError("boto3 is not installed", hint="pip install boto3") from exc
    custom = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get(
        "AWS_ENDPOINT_URL")
    policy = retry or RetryPolicy()
    cfg = Config(region_name=region,
                 retries={"mode": "standard", "total_max_attempts": policy.attempts},
                 connect_timeout=10, read_timeout=60,
                 # A custom endpoint (moto) has no virtual-host bucket DNS.
                 s3={"addressing_style": "path"} if custom else None)
    session = boto3.session.Session()
    return use_retries(session.client(service, region_name=region,
                                      endpoint_url=endpoint_url or None, config=cfg), policy)

"""The Compute Engine clients (REST transport), zone operations and error codes.

Every mutating Compute Engine call answers with an Operation; spotrun waits on it with
`zoneOperations.wait` (or `regionOperations.wait`), which blocks server-side until the
operation is DONE or about two minutes pass, and reads its `error`: capacity and quota
failures come back there (ZONE_RESOURCE_POOL_EXHAUSTED, QUOTA_EXCEEDED), not as HTTP errors.
Clients are kept one per thread (the daemon's loops call the provider from their own threads,
and a client holds an HTTP session).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from spotrun.errors import ProviderError

# What a pool without room answers: stockouts per zone, and quota (a region's GPU or Spot
# quota spent). Both move the launch on to the next candidate, as EC2's capacity codes do.
STOCKOUT_CODES = frozenset({"ZONE_RESOURCE_POOL_EXHAUSTED",
                            "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
                            "RESOURCE_POOL_EXHAUSTED"})
QUOTA_CODES = frozenset({"QUOTA_EXCEEDED", "quotaExceeded"})
CAPACITY_CODES = STOCKOUT_CODES | QUOTA_CODES


class Clients:
    """compute_v1 clients on one endpoint, made on first use, one set per thread.

    endpoint_url "" is compute.googleapis.com with Application Default Credentials; any other
    (a fake or emulator on 127.0.0.1) is reached with anonymous credentials.
    """

    def __init__(self, endpoint_url: str = "", credentials: Any = None) -> None:
        self.endpoint_url = endpoint_url
        self._credentials = credentials
        self._local = threading.local()

    def _make(self, cls_name: str) -> Any:
        from google.cloud import compute_v1
        kw: dict[str, Any] = {"transport": "rest"}
        if self.endpoint_url:
            from google.auth.credentials import AnonymousCredentials
            kw["client_options"] = {"api_endpoint": self.endpoint_url}
            kw["credentials"] = self._credentials or AnonymousCredentials()
        elif self._credentials is not None:
            kw["credentials"] = self._credentials
        return getattr(compute_v1, cls_name)(**kw)

    def get(self, cls_name: str) -> Any:
        """The calling thread's client of that class (InstancesClient, ...)."""
        cache = self._local.__dict__.setdefault("clients", {})
        if cls_name not in cache:
            cache[cls_name] = self._make(cls_name)
        return cache[cls_name]

    @property
    def instances(self) -> Any:
        """instances.*"""
        return self.get("InstancesClient")

    @property
    def zone_ops(self) -> Any:
        """zoneOperations.*"""
        return self.get("ZoneOperationsClient")

    @property
    def region_ops(self) -> Any:
        """regionOperations.*"""
        return self.get("RegionOperationsClient")

    @property
    def policies(self) -> Any:
        """resourcePolicies.*"""
        return self.get("ResourcePoliciesClient")


def error_code(exc: BaseException) -> str:
    """The Google error reason of a failed call (notFound, alreadyExists, ...), else ''."""
    for err in getattr(exc, "errors", None) or []:
        reason = err.get("reason") if isinstance(err, dict) else getattr(err, "reason", None)
        if reason:
            return str(reason)
    return str(getattr(exc, "reason", "") or "")


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of a failed call, if it had one."""
    code = getattr(exc, "code", None)
    try:
        return int(code) if code is not None else None
    except (TypeError, ValueError):
        return None


def gce_error(exc: BaseException, method: str) -> ProviderError:
    """A failed Compute Engine call as our ProviderError (ProviderErrors pass through)."""
    if isinstance(exc, ProviderError):
        return exc
    code = error_code(exc) or type(exc).__name__
    hint = None
    if code in ("forbidden", "accessNotConfigured", "SERVICE_DISABLED"):
        hint = "enable the Compute Engine API and check the credentials (spotrun doctor)"
    return ProviderError(f"gce {method} failed: {code}: {exc}"[:400], field="gcp", value=code,
                         hint=hint)


def op_error(op: Any) -> tuple[str, str] | None:
    """(code, message) of a DONE operation that failed, else None."""
    errors = list(op.error.errors) if op.error else []
    if not errors:
        return None
    first = errors[0]
    return str(first.code), str(first.message)


def is_done(op: Any) -> bool:
    """The operation has finished (well or not)."""
    from google.cloud import compute_v1
    return op.status == compute_v1.Operation.Status.DONE


def wait_op(clients: Clients, project: str, op: Any, *, zone: str | None = None,
            region: str | None = None, timeout_s: float = 120.0) -> Any:
    """The operation once DONE; ProviderError after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not is_done(op):
        left = deadline - time.monotonic()
        if left <= 0:
            raise ProviderError(f"operation {op.name} still {op.status} after {timeout_s:g} s",
                                field="gcp", value=op.name,
                                hint="reconcile finds the instance by its labels")
        try:
            if zone is not None:
                op = clients.zone_ops.wait(project=project, zone=zone, operation=op.name,
                                           timeout=min(left, 130.0))
            else:
                op = clients.region_ops.wait(project=project, region=region,
                                             operation=op.name, timeout=min(left, 130.0))
        except Exception as exc:  # noqa: BLE001 - a failed wait is a ProviderError
            raise gce_error(exc, "operations.wait") from None
    return op

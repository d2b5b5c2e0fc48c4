"""One error root for everything spotrun raises on purpose.

Each error carries the field it is about, the offending value and a hint, so the
CLI can print one short line and pick the exit code (2 = bad input, 1 = failure).
"""

from __future__ import annotations

from typing import Any

_MISSING = object()


class SpotrunError(Exception):
    """Root of all spotrun errors; exit code 1 unless a subclass says otherwise."""

    exit_code = 1
    http_status = 500     # what the team server answers with (spotrun.server.errors)

    def __init__(self, message: str, *, field: str | None = None, value: Any = _MISSING,
                 hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.value = None if value is _MISSING else value
        self.has_value = value is not _MISSING
        self.hint = hint

    def __str__(self) -> str:
        parts = []
        if self.field:
            parts.append(f"{self.field}: {self.message}")
        else:
            parts.append(self.message)
        if self.hint:
            parts.append(f"({self.hint})")
        return " ".join(parts)


class BadInputError(SpotrunError):
    """Bad user input (job spec, config, CLI argument): exit code 2, nothing written."""

    exit_code = 2
    http_status = 422


class SpecError(BadInputError):
    """A job spec field is missing, unknown, of the wrong type or out of range."""


class ConfigError(BadInputError):
    """A spotrun.toml setting or environment variable is invalid."""


class NotFoundError(BadInputError):
    """A job, attempt or object the user named does not exist."""

    http_status = 404


class AuthError(BadInputError):
    """No, unknown or revoked API token (HTTP 401); never names the token's secret."""

    http_status = 401


class ForbiddenError(BadInputError):
    """The token's user may not do this (role too low, another user's job): HTTP 403."""

    http_status = 403


class TooLargeError(BadInputError):
    """An upload over the server's limit (HTTP 413); the message names the limit's key."""

    http_status = 413


class TooManyAttemptsError(BadInputError):
    """Too many bad tokens from one address lately (HTTP 429 with Retry-After)."""

    http_status = 429

    def __init__(self, message: str, *, retry_after_s: int, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after_s = retry_after_s


class DatabaseError(SpotrunError):
    """The state database cannot be opened, read or written (broken, locked, newer, away)."""


class ProviderError(SpotrunError):
    """A cloud provider call failed in a way that is not about capacity."""


class CapacityError(ProviderError):
    """The pool (type, zone, market) has no capacity now; try another candidate."""

    def __init__(self, message: str, *, instance_type: str = "", zone: str = "",
                 market: str = "", code: str = "InsufficientInstanceCapacity") -> None:
        super().__init__(message, field="pool", value=f"{instance_type}/{zone}/{market}",
                         hint="the launch moves on to the next candidate")
        self.instance_type = instance_type
        self.zone = zone
        self.market = market
        self.code = code


class StoreError(SpotrunError):
    """An object-store operation failed."""


class ObjectNotFound(StoreError):
    """The key does not exist in the store."""


class ChecksumMismatch(StoreError):
    """Data read back does not match its recorded size or SHA256."""


class CheckpointError(SpotrunError):
    """A checkpoint could not be written, verified or restored."""


class SecretError(SpotrunError):
    """A secret reference could not be resolved; names the secret, never its value."""

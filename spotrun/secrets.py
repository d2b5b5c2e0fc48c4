"""Resolve secret references on the instance, and redact their values from shipped logs.

A reference is `env:VAR` (the agent's own environment), `ssm:/path` (SSM
Parameter Store, decrypted) or `secretsmanager:NAME`. Values go only into the
training process's environment; errors name the secret, never its value.
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable, Mapping, Protocol

from spotrun.errors import SecretError

KINDS = ("env", "ssm", "secretsmanager")
REDACTED = b"***"
# A team-server API token (spotrun.server.identity): its id may be shown, its secret never.
API_TOKEN = re.compile(r"spotrun_([0-9a-f]{12})_[A-Za-z0-9_\-]+")


class SsmClient(Protocol):
    """The part of a boto3 SSM client used here."""

    def get_parameter(self, **kwargs: Any) -> dict[str, Any]:
        """boto3 ssm.get_parameter."""


class SecretsManagerClient(Protocol):
    """The part of a boto3 Secrets Manager client used here."""

    def get_secret_value(self, **kwargs: Any) -> dict[str, Any]:
        """boto3 secretsmanager.get_secret_value."""


ClientFactory = Callable[[str], Any]   # service name ("ssm", "secretsmanager") -> client


def boto3_client_factory(region: str, endpoint_url: str | None = None) -> ClientFactory:
    """Clients built on first use, so boto3 is imported only when a secret needs it."""
    cache: dict[str, Any] = {}

    def make(service: str) -> Any:
        if service not in cache:
            from spotrun.aws_clients import make_client   # lazy: start-up cost (boto3)
            cache[service] = make_client(service, region=region, endpoint_url=endpoint_url or "")
        return cache[service]

    return make


def parse_ref(name: str, ref: str) -> tuple[str, str]:
    """Split a reference into (kind, target); SecretError if malformed."""
    kind, sep, target = ref.partition(":")
    if not sep or kind not in KINDS or not target:
        raise SecretError("allowed: env:NAME, ssm:/path or secretsmanager:NAME",
                          field=f"secrets.{name}", value=ref)
    return kind, target


def _error_code(exc: Exception) -> str:
    resp = getattr(exc, "response", None)
    if isinstance(resp, dict):
        return str(resp.get("Error", {}).get("Code") or type(exc).__name__)
    return type(exc).__name__


def resolve_one(name: str, ref: str, *, environ: Mapping[str, str],
                clients: ClientFactory) -> str:
    """The value of one secret; raises SecretError naming it."""
    kind, target = parse_ref(name, ref)
    if kind == "env":
        if target not in environ:
            raise SecretError(f"secret {name}: variable {target} is not set on the instance",
                              field=f"secrets.{name}", value=ref)
        return environ[target]
    try:
        if kind == "ssm":
            resp = clients("ssm").get_parameter(Name=target, WithDecryption=True)
            return str(resp["Parameter"]["Value"])
        resp = clients("secretsmanager").get_secret_value(SecretId=target)
        if resp.get("SecretString") is not None:
            return str(resp["SecretString"])
        return bytes(resp["SecretBinary"]).decode("utf-8")
    except SecretError:
        raise
    except Exception as exc:  # boto errors, missing keys: all mean "cannot resolve"
        raise SecretError(f"secret {name}: {kind} lookup failed ({_error_code(exc)})",
                          field=f"secrets.{name}", value=ref,
                          hint="check the reference and the instance's IAM role") from None


def resolve_secrets(refs: Mapping[str, str], *, environ: Mapping[str, str] | None = None,
                    clients: ClientFactory | None = None,
                    region: str = "us-east-1") -> dict[str, str]:
    """Resolve every reference (NAME -> value); the first failure raises SecretError."""
    env = os.environ if environ is None else environ
    factory = clients or boto3_client_factory(region)
    return {name: resolve_one(name, ref, environ=env, clients=factory)
            for name, ref in sorted(refs.items())}


class Redactor:
    """Streaming replacement of secret values with '***' in byte chunks.

    A value split across two chunks is still caught: `feed` holds back the
    shortest tail that could start a secret, and `finish` releases it.
    """

    def __init__(self, values: list[str] | tuple[str, ...]) -> None:
        # Longest first, so a secret containing another is replaced whole.
        uniq = {v.encode("utf-8") for v in values if v}
        self._needles = sorted(uniq, key=len, reverse=True)
        self._pending = b""

    def _replace(self, data: bytes) -> bytes:
        for needle in self._needles:
            data = data.replace(needle, REDACTED)
        return data

    def _holdback(self, data: bytes) -> int:
        """Length of the longest tail of data that is a proper prefix of some secret."""
        best = 0
        for needle in self._needles:
            for k in range(min(len(needle) - 1, len(data)), best, -1):
                if data.endswith(needle[:k]):
                    best = k
                    break
        return best

    def feed(self, chunk: bytes) -> bytes:
        """Redacted bytes safe to ship now."""
        if not self._needles:
            return chunk
        data = self._replace(self._pending + chunk)
        keep = self._holdback(data)
        self._pending = data[len(data) - keep:] if keep else b""
        return data[:len(data) - keep]

    def finish(self) -> bytes:
        """Whatever is held back (at the end of the stream)."""
        out, self._pending = self._pending, b""
        return self._replace(out)


def redact_tokens(text: str) -> str:
    """text with every API token's secret replaced by '***' (its public id kept)."""
    return API_TOKEN.sub(lambda m: f"spotrun_{m.group(1)}_***", text) if "spotrun_" in text \
        else text

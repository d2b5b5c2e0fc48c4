"""The remote backend: the same verbs through a team server's API (httpx).

The server answers each call with what the local `--json` prints; errors come as
`{"error", "field", "hint"}` and are raised here as the SpotrunError the local verb would
raise, so the CLI prints the same one line and exits 2 (401, 403, 404, 422, 429).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import quote

import httpx

from spotrun.backends import Cancelled
from spotrun.backends.revive import job_audit, revive_times
from spotrun.errors import (AuthError, BadInputError, ForbiddenError, NotFoundError,
                            SpotrunError, TooManyAttemptsError)

API = "/api/v1"
TIMEOUT_S = 30.0
_BY_STATUS: dict[int, type[SpotrunError]] = {401: AuthError, 403: ForbiddenError,
                                             404: NotFoundError, 422: BadInputError,
                                             400: BadInputError}


def error_from(resp: httpx.Response) -> SpotrunError:
    """The SpotrunError an error response stands for (a body that is not ours: its status)."""
    try:
        body = resp.json()
        message, field, hint = str(body["error"]), body.get("field"), body.get("hint")
    except (ValueError, KeyError, TypeError):
        message, field, hint = f"the server answered HTTP {resp.status_code}", "server", None
    if resp.status_code == 429:
        return TooManyAttemptsError(message, field=field, hint=hint,
                                    retry_after_s=int(resp.headers.get("Retry-After", "60")))
    return _BY_STATUS.get(resp.status_code, SpotrunError)(message, field=field, hint=hint)


class RemoteBackend:
    """Calls a team server with a bearer token."""

    def __init__(self, url: str, token: str, *, client: httpx.Client | None = None) -> None:
        self.url = url.rstrip("/")
        self._client = client or httpx.Client(
            base_url=self.url, timeout=TIMEOUT_S,
            headers={"Authorization": f"Bearer {token}", "User-Agent": "spotrun-cli"})

    def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            resp = self._client.request(method, API + path, **kw)
        except httpx.HTTPError as exc:
            # The exception's text names the URL only; the token is in a header, never in it.
            raise SpotrunError(f"cannot reach the server ({type(exc).__name__})",
                               field="remote", value=self.url,
                               hint="check the URL (`spotrun login URL`) or use --local"
                               ) from None
        if resp.status_code >= 400:
            raise error_from(resp)
        return resp

    def _get(self, path: str, **params: Any) -> Any:
        clean = {k: v for k, v in params.items() if v is not None and v != []}
        return self._call("GET", path, params=clean).json()

    def whoami(self) -> dict[str, Any]:
        """Who the token belongs to: {user, role, token_id}."""
        return self._get("/whoami")

    def status(self, ref: str | None, *, events: bool = False) -> Any:
        """`status --json`."""
        path = "/jobs" if ref is None else f"/jobs/{quote(ref, safe='')}"
        return revive_times(self._get(path, events="true" if events else None))

    def cancel(self, ref: str) -> Cancelled:
        """Cancel a job (idempotent)."""
        resp = self._call("POST", f"/jobs/{quote(ref, safe='')}/cancel")
        return Cancelled(job=resp.json(), was=resp.headers.get("X-Spotrun-Was-State") or None)

    def resume(self, ref: str, budget_usd: float | None) -> dict[str, Any]:
        """`resume --json`."""
        return self._call("POST", f"/jobs/{quote(ref, safe='')}/resume", json={"budget_usd": budget_usd}).json()

    def audit(self, refs: list[str], *, since: datetime | None, until: datetime | None,
              hindsight: bool) -> list[Any]:
        """JobAudit per job, rebuilt from the server's JSON."""
        data = self._get("/audit", job=list(refs), since=since.isoformat() if since else None,
                         until=until.isoformat() if until else None,
                         hindsight="true" if hindsight else "false")
        return [job_audit(d) for d in data]

    def budgets(self) -> list[dict[str, Any]]:
        """`budgets --json`."""
        return self._get("/budgets")

    def trail(self, *, user: str | None, since: datetime | None) -> list[dict[str, Any]]:
        """The server's action trail (admins only)."""
        return revive_times(self._get("/trail", user=user,
                                      since=since.isoformat() if since else None))

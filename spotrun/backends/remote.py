"""The remote backend: the same verbs through a team server's API (httpx).

The server answers each call with what the local `--json` prints; errors come as
`{"error", "field", "hint"}` and are raised here as the SpotrunError the local verb would
raise, so the CLI prints the same one line and exits 2 (401, 403, 404, 422, 429).
"""

from __future__ import annotations

import json
import tempfile
from contextlib import closing
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import quote

import httpx

from spotrun.backends.base import Cancelled, Progress, Submitted
from spotrun.backends.revive import job_audit, revive_times
from spotrun.interrupts import Interrupted
from spotrun.errors import (AuthError, BadInputError, ForbiddenError, NotFoundError,
                            SpotrunError, TooLargeError, TooManyAttemptsError)

API = "/api/v1"
TIMEOUT_S = 30.0
_BY_STATUS: dict[int, type[SpotrunError]] = {401: AuthError, 403: ForbiddenError,
                                             404: NotFoundError, 422: BadInputError,
                                             400: BadInputError, 413: TooLargeError}


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

    def _unreachable(self, exc: Exception) -> SpotrunError:
        # The exception's text names the URL only; the token is in a header, never in it.
        return SpotrunError(f"cannot reach the server ({type(exc).__name__})", field="remote",
                            value=self.url,
                            hint="check the URL (`spotrun login URL`) or use --local")

    def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            resp = self._client.request(method, API + path, **kw)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
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

    def submit(self, spec_file: str, *, owner: str | None, dry_run: bool,
               progress: Progress | None = None) -> Submitted:
        """Pack the workdir here and stream it with the spec; the server checks and stores
        it and records the job as the caller's (no cloud credentials needed here)."""
        from spotrun.backends.transfer import packed, submission_body
        from spotrun.backends.wire import SUBMIT_TYPE
        with packed(spec_file) as (spec, bundle):
            body, length = submission_body(spec_file, spec, None if dry_run else bundle,
                                           progress)
            params = {"dry_run": "true" if dry_run else None, "owner": owner}
            resp = self._call("POST", "/jobs", content=body,
                              params={k: v for k, v in params.items() if v is not None},
                              headers={"Content-Type": SUBMIT_TYPE,
                                       "Content-Length": str(length)})
        data = resp.json()
        return Submitted(job=data["plan"] if dry_run else data["job"],
                         warnings=tuple(data.get("warnings") or ()), note=data.get("note"))

    def plan(self, spec_files: list[str], *, zones: list[str], offline: bool) -> list[Any]:
        """`plan --json` (a list, one per file), decided on the server's market."""
        from spotrun.backends.transfer import read_spec
        specs = [{"spec_file": f, "spec": read_spec(f).decode("utf-8", errors="replace")}
                 for f in spec_files]
        return self._call("POST", "/plan", json={"specs": specs, "zones": zones,
                                                  "offline": offline}).json()

    def _stream(self, path: str, params: dict[str, Any]) -> httpx.Response:
        """An open streamed response (the caller closes it), errors raised as _call does;
        no read timeout: a followed job may print nothing for hours."""
        try:
            request = self._client.build_request("GET", API + path, params=params,
                                                 timeout=httpx.Timeout(TIMEOUT_S, read=None))
            resp = self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        if resp.status_code >= 400:
            resp.read()
            resp.close()
            raise error_from(resp)
        return resp

    def logs(self, ref: str, attempt: int | None, *, follow: bool, poll_s: float
             ) -> Iterator[tuple[str, str]]:
        """The server's streamed NDJSON, chunk by chunk (checked before the first)."""
        params = {"follow": "true" if follow else "false", "poll_s": poll_s}
        if attempt is not None:
            params["attempt"] = attempt
        resp = self._stream(f"/jobs/{quote(ref, safe='')}/logs", params)

        def chunks() -> Iterator[tuple[str, str]]:
            with closing(resp):
                try:
                    for line in resp.iter_lines():
                        if line:
                            ((stream, text),) = json.loads(line).items()
                            yield stream, text
                except httpx.HTTPError as exc:
                    raise SpotrunError(f"the server's log stream broke off "
                                       f"({type(exc).__name__})", field="remote",
                                       value=self.url) from None
        return chunks()

    def logs_json(self, ref: str, attempt: int | None) -> list[dict[str, Any]]:
        """`logs --json`."""
        return self._get(f"/jobs/{quote(ref, safe='')}/logs", attempt=attempt,
                         json_out="true")

    def pull(self, ref: str, dest: Path | None, *, checkpoint: bool, show: bool
             ) -> dict[str, Any]:
        """Download the server's pull archive, then extract it here with the bundle's
        path checks (a member that would land outside dest writes nothing)."""
        from spotrun.backends.transfer import extract_pull, peek_summary
        from spotrun.pulls import download_bar
        resp = self._stream(f"/jobs/{quote(ref, safe='')}/pull",
                                 {"checkpoint": "true" if checkpoint else "false"})
        with tempfile.TemporaryDirectory(prefix="spotrun-pull-") as tmp:
            archive = Path(tmp) / "pull.tar.gz"
            total = int(resp.headers.get("Content-Length") or 0)
            with closing(resp), open(archive, "wb") as f, download_bar(show=show) as progress:
                try:
                    for chunk in resp.iter_bytes():
                        f.write(chunk)
                        if progress is not None:
                            progress(f.tell(), total)
                except httpx.HTTPError as exc:
                    raise SpotrunError(f"the download broke off ({type(exc).__name__})",
                                       field="remote", value=self.url) from None
            if dest is None:
                dest = Path.cwd() / str(peek_summary(archive).get("job") or ref)
            if dest.exists() and not dest.is_dir():
                raise BadInputError("must be a folder (it is a file)", field="--to",
                                    value=str(dest))
            return extract_pull(archive, dest)

    def cancel(self, ref: str) -> Cancelled:
        """Cancel a job (idempotent)."""
        resp = self._call("POST", f"/jobs/{quote(ref, safe='')}/cancel")
        return Cancelled(job=resp.json(), was=resp.headers.get("X-Spotrun-Was-State") or None)

    def resume(self, ref: str, budget_usd: float | None) -> dict[str, Any]:
        """`resume --json`."""
        return self._call("POST", f"/jobs/{quote(ref, safe='')}/resume", json={"budget_usd": budget_usd}).json()

    def interrupt(self, ref: str, *, node: int | None, notice_s: float | None) -> Interrupted:
        """Send the provider's interruption (members their own jobs, admins any)."""
        return Interrupted.from_dict(self._call(
            "POST", f"/jobs/{quote(ref, safe='')}/interrupt",
            json={"node": node, "notice_s": notice_s}).json())

    def audit(self, refs: list[str], *, since: datetime | None, until: datetime | None,
              hindsight: bool) -> list[Any]:
        """JobAudit per job, rebuilt from the server's JSON."""
        data = self._get("/audit", job=list(refs), since=since.isoformat() if since else None,
                         until=until.isoformat() if until else None,
                         hindsight="true" if hindsight else "false")
        return [job_audit(d) for d in data]

    def budgets(self) -> list[dict[str, Any]]:
        """`budgets --json`."""
        return revive_times(self._get("/budgets"))

    def set_budget(self, scope: str, name: str, usd: Any, period: Any) -> dict[str, Any]:
        """`budgets set --json`: the server checks every field (admins only)."""
        return revive_times(self._call("PUT", _budget_path(scope, name),
                                       json={"usd": usd, "period": period}).json())

    def remove_budget(self, scope: str, name: str) -> dict[str, Any]:
        """`budgets remove --json` (admins only)."""
        return revive_times(self._call("DELETE", _budget_path(scope, name)).json())

    def trail(self, *, user: str | None, since: datetime | None) -> list[dict[str, Any]]:
        """The server's action trail (admins only)."""
        return revive_times(self._get("/trail", user=user,
                                      since=since.isoformat() if since else None))


def _budget_path(scope: str, name: str) -> str:
    """`/budgets/{scope}/{name}`, each part quoted (the server checks them)."""
    return f"/budgets/{quote(scope, safe='')}/{quote(name, safe='')}"

"""`spotrun ui`: a read-only dashboard and its JSON, served by the standard library.

Why http.server: the dashboard is a handful of GET routes returning JSON that the CLI
already produces, plus static files; a threading stdlib server and a routing table do
that with no new dependency to install on a daemon host. Every JSON route calls the
same view function as the matching CLI --json (spotrun.ui.views).

Routes: `/` and `/job/<id>` (the page), `/static/<file>`, `/api/status[/<id>]`
(= `spotrun status [JOB] --json`), `/api/audit[/<id>]` (= `spotrun audit [JOB] --json`),
`/api/page/<id>` (the job page's data), `/api/budgets` (= `spotrun budgets --json`),
`/metrics` (Prometheus), `/healthz`.
On an address other than loopback a token is required (`Authorization: Bearer T`, or
`?token=T` once, which sets a cookie).
"""

from __future__ import annotations

import hmac
import json
import re
import threading
from http import HTTPStatus
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, Callable
from urllib.parse import parse_qs, urlparse

from spotrun.contracts import json_default
from spotrun.errors import BadInputError, NotFoundError, SpotrunError
from spotrun.ui import views
from spotrun.daemon.health import live_loop_health
from spotrun.ui.metrics import render_metrics
from spotrun.db import iter_jobs, jobs_by_ref, open_db, session

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
STATIC_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                ".html": "text/html; charset=utf-8", ".md": "text/plain; charset=utf-8",
                ".png": "image/png", ".LICENSE": "text/plain; charset=utf-8"}
COOKIE = "spotrun_token"


class Dashboard:
    """The data side of the server: settings, engine, and a cache for finished jobs' audits."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.engine = open_db(settings.database_url)
        self.reports = views.Reports()
        self._lock = threading.Lock()
        self._cache: dict[tuple, Any] = {}

    def _audits(self, job_ids: list[str] | None, hindsight: bool) -> list[Any]:
        """The jobs' audits (None: every job), those not kept audited together in one read;
        a finished job's is kept (its figures no longer change)."""
        with session(self.engine) as s:
            jobs = list(iter_jobs(s)) if job_ids is None else jobs_by_ref(s, job_ids)
        for job_id, job in zip(job_ids or [], jobs):
            if job is None:
                raise NotFoundError("no such job", field="JOB", value=job_id)
        keys = [(j.id, hindsight, j.updated_at, j.state.value) for j in jobs]
        with self._lock:
            todo = [j for j, k in zip(jobs, keys) if k not in self._cache]
            fresh = {a.id: a for a in views.audit_view(
                self.settings, hindsight=hindsight, reports=self.reports, engine=self.engine,
                jobs=todo)} if todo else {}
            out = []
            for j, key in zip(jobs, keys):
                result = self._cache[key] if key in self._cache else fresh[j.id]
                if j.state.is_terminal():
                    self._cache[key] = result
                out.append(result)
            return out

    def _audit(self, job_id: str, hindsight: bool) -> Any:
        """One job's audit (kept once the job is finished)."""
        return self._audits([job_id], hindsight)[0]

    def status(self, ref: str | None = None) -> Any:
        """= `spotrun status [JOB] --json`."""
        return views.status_view(self.settings, ref, reports=self.reports, engine=self.engine)

    def audit(self, ref: str | None = None, hindsight: bool = True) -> list[dict]:
        """= `spotrun audit [JOB] --json`."""
        ids = [self.status(ref)["id"]] if ref else None
        return [a.to_dict() for a in self._audits(ids, hindsight)]

    def budgets(self) -> list[dict]:
        """= `spotrun budgets --json`: spend against each project and owner budget."""
        return views.budgets_view(self.settings, engine=self.engine)

    def page(self, ref: str) -> dict:
        """The job page's data."""
        st = self.status(ref)
        return views.job_page(self.settings, st["id"], reports=self.reports, engine=self.engine,
                              audit=self._audit(st["id"], True))

    def metrics(self) -> str:
        """Prometheus text (of the status and audit figures it shows, nothing more is built)."""
        audits = [{"id": a.id, "actual_usd": a.actual_usd, "saved_usd": a.saved_usd,
                   "baseline_on_demand_usd": a.baseline_on_demand_usd,
                   "time_to_resume": [t.time_to_resume for t in a.attempts if t.time_to_resume]}
                  for a in self._audits(None, False)]
        return render_metrics(views.job_summaries(self.settings, engine=self.engine), audits,
                              self.reports.store, loops=live_loop_health(self.engine))


Route = tuple[re.Pattern, Callable[[Dashboard, re.Match], tuple[str, Any]]]
ROUTES: list[Route] = [
    (re.compile(r"^/api/status/?$"), lambda d, m: ("json", d.status())),
    (re.compile(r"^/api/status/([^/]+)$"), lambda d, m: ("json", d.status(m[1]))),
    (re.compile(r"^/api/audit/?$"), lambda d, m: ("json", d.audit())),
    (re.compile(r"^/api/audit/([^/]+)$"), lambda d, m: ("json", d.audit(m[1]))),
    (re.compile(r"^/api/page/([^/]+)$"), lambda d, m: ("json", d.page(m[1]))),
    (re.compile(r"^/api/budgets/?$"), lambda d, m: ("json", d.budgets())),
    (re.compile(r"^/metrics$"), lambda d, m: ("metrics", d.metrics())),
    (re.compile(r"^/healthz$"), lambda d, m: ("text", "ok\n")),
    (re.compile(r"^/(?:job/[^/]+)?$"), lambda d, m: ("static", "index.html")),
    (re.compile(r"^/static/([A-Za-z0-9_.-]+)$"), lambda d, m: ("static", m[1])),
]


def _static(name: str) -> bytes | None:
    try:
        return resources.files("spotrun.ui").joinpath("static", name).read_bytes()
    except (FileNotFoundError, IsADirectoryError, OSError):
        return None


def make_handler(dash: Dashboard, token: str | None) -> type[BaseHTTPRequestHandler]:
    """A request handler class bound to dash (read-only: GET and HEAD)."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "spotrun-ui"

        def log_message(self, fmt: str, *args: Any) -> None:   # quiet: no access log
            return

        def _authorised(self, query: dict) -> tuple[bool, bool]:
            """(allowed, set the cookie)."""
            if token is None:
                return True, False
            got = self.headers.get("Authorization", "")
            if got.startswith("Bearer ") and hmac.compare_digest(got[7:], token):
                return True, False
            cookie = SimpleCookie(self.headers.get("Cookie", ""))
            if COOKIE in cookie and hmac.compare_digest(cookie[COOKIE].value, token):
                return True, False
            q = (query.get("token") or [""])[0]
            if q and hmac.compare_digest(q, token):
                return True, True
            return False, False

        def _send(self, code: int, body: bytes, ctype: str, cookie: bool = False) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            if cookie:
                self.send_header("Set-Cookie", f"{COOKIE}={token}; HttpOnly; SameSite=Strict; "
                                               "Path=/")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _error(self, code: int, message: str) -> None:
            self._send(code, json.dumps({"error": message}).encode(),
                       "application/json; charset=utf-8")

        def do_HEAD(self) -> None:   # noqa: N802 (http.server's naming)
            """Like GET, without the body."""
            self.do_GET()

        def do_GET(self) -> None:   # noqa: N802
            """Route a read."""
            url = urlparse(self.path)
            allowed, set_cookie = self._authorised(parse_qs(url.query))
            if not allowed:
                self._error(HTTPStatus.UNAUTHORIZED, "a token is required (Authorization: "
                                                     "Bearer TOKEN, or ?token=TOKEN)")
                return
            for pattern, fn in ROUTES:
                m = pattern.match(url.path)
                if m is None:
                    continue
                try:
                    kind, data = fn(dash, m)
                except NotFoundError as exc:
                    self._error(HTTPStatus.NOT_FOUND, str(exc))
                    return
                except Exception as exc:   # one failing view must not take the server down
                    self._error(HTTPStatus.INTERNAL_SERVER_ERROR, str(exc)[:300])
                    return
                if kind == "json":
                    body = json.dumps(data, default=json_default).encode()
                    self._send(200, body, "application/json; charset=utf-8", set_cookie)
                elif kind == "metrics":
                    self._send(200, data.encode(), "text/plain; version=0.0.4; charset=utf-8")
                elif kind == "text":
                    self._send(200, data.encode(), "text/plain; charset=utf-8")
                else:
                    body = _static(data)
                    if body is None:
                        self._error(HTTPStatus.NOT_FOUND, "no such file")
                        return
                    ext = "." + data.rsplit(".", 1)[-1]
                    self._send(200, body, STATIC_TYPES.get(ext, "application/octet-stream"),
                               set_cookie)
                return
            self._error(HTTPStatus.NOT_FOUND, "no such page")

        def _read_only(self) -> None:
            self._error(HTTPStatus.METHOD_NOT_ALLOWED, "the dashboard is read-only")

        do_POST = do_PUT = do_DELETE = do_PATCH = _read_only

    return Handler


def check_bind(host: str, token: str | None) -> None:
    """A non-loopback address needs a token (bad input otherwise)."""
    if host not in LOOPBACK and not token:
        raise BadInputError("serving on an address other than 127.0.0.1 needs --token",
                            field="--host", value=host,
                            hint="add --token SECRET (or keep the default 127.0.0.1)")
    if token is not None and len(token) < 16:
        raise BadInputError("must be at least 16 characters", field="--token", value="***")


def make_server(settings: Any, host: str = "127.0.0.1", port: int = 8765,
                token: str | None = None) -> ThreadingHTTPServer:
    """A bound server (port 0 = any free port); call serve_forever() on it."""
    check_bind(host, token)
    handler = make_handler(Dashboard(settings), token)
    try:
        server = ThreadingHTTPServer((host, port), handler)
    except OSError as exc:   # port taken, address not ours: one line, no traceback
        raise SpotrunError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                           field="--port", value=port,
                           hint="pick another --port (0 = any free one)") from None
    server.daemon_threads = True
    return server

"""`spotrun ui`: a read-only dashboard and its JSON, served by the standard library.

Why http.server: the dashboard is a handful of GET routes returning JSON that the CLI
already produces, plus static files; a threading stdlib server and a routing table do
that with no new dependency to install on a daemon host. Every JSON route calls the
same view function as the matching CLI --json (spotrun.ui.views).

Routes (spotrun.ui.site, the table the team server serves too): `/` and `/job/<id>`
(the page), `/static/<file>`, `/api/status[/<id>]`
(= `spotrun status [JOB] --json`), `/api/audit[/<id>]` (= `spotrun audit [JOB] --json`),
`/api/page/<id>` (the job page's data), `/api/budgets` (= `spotrun budgets --json`),
`/metrics` (Prometheus), `/healthz`.
On an address other than loopback a token is required (`Authorization: Bearer T`, or
`?token=T` once, which sets a cookie).
"""

from __future__ import annotations

import hmac
from http import HTTPStatus
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from spotrun.errors import BadInputError, SpotrunError
from spotrun.ui import site
from spotrun.ui.site import Dashboard, Reply

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
COOKIE = "spotrun_token"


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

        def _send(self, reply: Reply, cookie: bool = False) -> None:
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            if cookie:
                self.send_header("Set-Cookie", f"{COOKIE}={token}; HttpOnly; SameSite=Strict; "
                                               "Path=/")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(reply.body)

        def do_HEAD(self) -> None:   # noqa: N802 (http.server's naming)
            """Like GET, without the body."""
            self.do_GET()

        def do_GET(self) -> None:   # noqa: N802
            """Route a read (spotrun.ui.site's table, the same one the team server uses)."""
            url = urlparse(self.path)
            allowed, set_cookie = self._authorised(parse_qs(url.query))
            if not allowed:
                self._send(site.error_reply(HTTPStatus.UNAUTHORIZED,
                                            "a token is required (Authorization: Bearer "
                                            "TOKEN, or ?token=TOKEN)"))
                return
            found = site.match(url.path)
            if found is None:
                self._send(site.error_reply(HTTPStatus.NOT_FOUND, "no such page"))
                return
            reply = found.reply(dash)
            self._send(reply, set_cookie and reply.status == 200 and found.access != site.HEALTH)

        def _read_only(self) -> None:
            self._send(site.error_reply(HTTPStatus.METHOD_NOT_ALLOWED,
                                        "the dashboard is read-only"))

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

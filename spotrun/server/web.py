"""The dashboard on the team server, behind a login (docs/server.md, "The dashboard").

The pages, their JSON and the vendored assets are spotrun.ui.site's, the same table
`spotrun ui` serves; this module adds who may see them: a session cookie from the login
page (spotrun.server.sessions) or a bearer token. Without one a page sends the browser to
/login and the JSON answers 401. Logins, logouts and refused logins go into the trail;
bad logins count against the same per-address limiter as bad bearer tokens.
"""

from __future__ import annotations

import html
from string import Template
from typing import Any
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from spotrun.errors import AuthError, TooManyAttemptsError
from spotrun.db import trail
from spotrun.server import sessions
from spotrun.server.auth import Caller, Limiter, caller, needs, remote_addr
from spotrun.server.identity import Principal, authenticate
from spotrun.server.sessions import COOKIE, LOGIN_CSRF_COOKIE, WebLogin
from spotrun.ui import site
from spotrun.ui.site import Dashboard, Reply

router = APIRouter()
MAX_FORM_BYTES = 8192          # a login form is a token and two short fields
LOGIN_FORM_TTL_S = 3600        # how long a login page's CSRF cookie stays


def dashboard(request: Request) -> Dashboard:
    """The app's one Dashboard (its audit cache shared by every request)."""
    state = request.app.state
    if getattr(state, "dashboard", None) is None:
        state.dashboard = Dashboard(state.settings, state.engine)
    return state.dashboard


def web_login(request: Request) -> WebLogin | None:
    """The live session behind the request's cookie, if any."""
    return sessions.find(request.app.state.engine, request.cookies.get(COOKIE))


def viewer(request: Request) -> Principal | None:
    """Who is asking: a bearer token (checked, counted and trailed as on the API) or a
    session; None when neither was sent."""
    if request.headers.get("authorization"):
        return caller(request).principal
    login = web_login(request)
    return login.principal if login else None


def _secure(request: Request) -> bool:
    """Cookies are Secure when the page came over TLS (uvicorn's, or a trusted proxy's)."""
    return request.url.scheme == "https"


def _send(reply: Reply) -> Response:
    return Response(reply.body, status_code=reply.status, media_type=reply.content_type,
                    headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})


def _safe_next(target: str | None) -> str:
    """A path on this server to go to after the login (never another site)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _redirect(to: str) -> RedirectResponse:
    return RedirectResponse(to, status_code=303, headers={"Cache-Control": "no-store"})


def login_page(request: Request, *, message: str = "", status: int = 200,
               next_path: str = "/", headers: dict[str, str] | None = None) -> Response:
    """The login form, with a fresh CSRF token in the form and in a cookie (double submit)."""
    csrf = sessions.new_csrf()
    text = site.static_file("login.html").body.decode("utf-8")
    body = Template(text).substitute(message=html.escape(message), csrf=csrf,
                                     next=html.escape(_safe_next(next_path)))
    resp = Response(body, status_code=status, media_type="text/html; charset=utf-8",
                    headers={"Cache-Control": "no-store", **(headers or {})})
    resp.set_cookie(LOGIN_CSRF_COOKIE, csrf, max_age=LOGIN_FORM_TTL_S, path="/login",
                    httponly=True, samesite="strict", secure=_secure(request))
    return resp


def _trail(request: Request, action: str, outcome: str, *, user: str = "", role: str = "",
           detail: str = "") -> None:
    trail.record(request.app.state.engine, user=user, role=role, action=action, target="",
                 remote_addr=remote_addr(request), outcome=outcome, detail=detail)


async def _form(request: Request) -> dict[str, str] | None:
    """The url-encoded form's first values (None when it is too big to be one of ours)."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return None
    fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[0] for k, v in fields.items()}


@router.get("/login")
def login_form(request: Request, next: str = "/") -> Response:   # noqa: A002 (the query's name)
    """The login page (a browser with a live session goes straight on)."""
    if web_login(request) is not None:
        return _redirect(_safe_next(next))
    return login_page(request, next_path=next)


@router.post("/login")
async def login(request: Request) -> Response:
    """Check the pasted token; on success a session cookie and on to the page asked for."""
    form = await _form(request)
    if form is None:
        return login_page(request, message="the form is too large", status=413)
    return await run_in_threadpool(_login, request, form)


def _login(request: Request, form: dict[str, str]) -> Response:
    next_path = _safe_next(form.get("next"))
    addr = remote_addr(request)
    if not sessions.same(request.cookies.get(LOGIN_CSRF_COOKIE), form.get("csrf")):
        _trail(request, "login", "denied", detail="login form without its CSRF token")
        return login_page(request, status=403, next_path=next_path,
                          message="the login form expired or came from another site; "
                                  "paste the token again")
    limiter: Limiter = request.app.state.limiter
    try:
        limiter.check(addr)
        principal = authenticate(request.app.state.engine, form.get("token", "").strip())
    except TooManyAttemptsError as exc:
        _trail(request, "login", "denied", detail=str(exc))
        return login_page(request, status=429, message=exc.message, next_path=next_path,
                          headers={"Retry-After": str(exc.retry_after_s)})
    except AuthError as exc:
        limiter.fail(addr)
        _trail(request, "login", "denied", detail=str(exc))
        return login_page(request, status=401, message=exc.message, next_path=next_path)
    ttl_s = request.app.state.settings.server.session_hours * 3600
    session_id, _ = sessions.start(request.app.state.engine, principal, ttl_s=ttl_s,
                                   remote_addr=addr)
    _trail(request, "login", "ok", user=principal.user, role=principal.role,
           detail=f"dashboard session, token {principal.token_id}")
    resp = _redirect(next_path)
    resp.set_cookie(COOKIE, session_id, max_age=int(ttl_s), path="/", httponly=True,
                    samesite="strict", secure=_secure(request))
    resp.delete_cookie(LOGIN_CSRF_COOKIE, path="/login")
    return resp


@router.post("/logout")
async def logout(request: Request) -> Response:
    """End the session (the form must carry its CSRF token) and go back to the login page."""
    form = await _form(request)
    return await run_in_threadpool(_logout, request, form or {})


def _logout(request: Request, form: dict[str, str]) -> Response:
    login = web_login(request)
    if login is None:
        return _redirect("/login")
    p = login.principal
    if not sessions.same(login.csrf, form.get("csrf")):
        _trail(request, "logout", "denied", user=p.user, role=p.role,
               detail="logout form without its CSRF token")
        return _send(site.error_reply(403, "csrf: the form did not carry this session's "
                                           "CSRF token; log out from the dashboard's button"))
    sessions.end(request.app.state.engine, request.cookies[COOKIE])
    _trail(request, "logout", "ok", user=p.user, role=p.role)
    resp = _redirect("/login")
    resp.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict",
                       secure=_secure(request))
    return resp


def _no_login() -> AuthError:
    return AuthError("no dashboard session", field="session",
                     hint="log in at /login, or send `Authorization: Bearer <token>`")


@router.get("/api/session")
def whoami(request: Request) -> Any:
    """Who the page is for, and the CSRF token its logout form carries (none for a token)."""
    login = None if request.headers.get("authorization") else web_login(request)
    who = login.principal if login else viewer(request)
    if who is None:
        raise _no_login()
    return {"user": who.user, "role": who.role, "csrf": login.csrf if login else None}


@router.get("/api/trail")
def trail_json(request: Request) -> Any:
    """The action trail's newest rows (admins): the dashboard's trail panel."""
    who = viewer(request)
    if who is None:
        raise _no_login()
    needs(request, Caller(principal=who, addr=remote_addr(request)), "admin",
          "reading the trail")
    return trail.trail_view(request.app.state.engine, limit=200)


@router.api_route("/{path:path}", methods=["GET", "HEAD"])
def dashboard_route(request: Request, path: str) -> Response:
    """A page, its JSON or an asset from spotrun.ui.site, behind the login."""
    found = site.match("/" + path)
    if found is None:
        return _send(site.error_reply(404, "no such page"))
    if found.access in (site.ASSET, site.HEALTH):
        return _send(found.reply(dashboard(request)))
    if viewer(request) is None:
        if found.access == site.PAGE:
            return _redirect("/login?next=" + quote("/" + path, safe="/"))
        raise _no_login()
    return _send(found.reply(dashboard(request)))

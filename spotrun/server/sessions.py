"""Dashboard login sessions: a random id in an HttpOnly cookie, the session in the database.

Why a server-side id rather than a signed cookie: logout, revoking the pasted token or
disabling the user end the session at its next request (a signed value stays valid until
it expires unless the server keeps state anyway); no signing key has to be kept secret and
shared; and two servers on one database share the sessions. Only the id's SHA-256 is
stored, like the API tokens: a copy of the database opens no session.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete
from sqlalchemy.engine import Engine

from spotrun.db import session, utcnow
from spotrun.db.identity import ApiToken, TeamUser, WebSession
from spotrun.server.identity import Principal

COOKIE = "spotrun_session"
LOGIN_CSRF_COOKIE = "spotrun_login_csrf"   # the login form's double-submit token


@dataclass(frozen=True)
class WebLogin:
    """A live session: who, and the CSRF token its forms must carry."""

    principal: Principal
    csrf: str
    expires_at: datetime


def new_csrf() -> str:
    """A fresh CSRF token for a form."""
    return secrets.token_urlsafe(24)


def _hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("utf-8")).hexdigest()


def start(engine: Engine, principal: Principal, *, ttl_s: float, remote_addr: str,
          now: datetime | None = None) -> tuple[str, WebLogin]:
    """A new session for principal; returns (the cookie's id, the session). Expired rows go."""
    now = now or utcnow()
    session_id = secrets.token_urlsafe(32)
    row = WebSession(id_sha256=_hash(session_id), user=principal.user,
                     token_id=principal.token_id, csrf=new_csrf(),
                     created_at=now, expires_at=now + timedelta(seconds=ttl_s),
                     remote_addr=remote_addr)
    with session(engine) as s:
        s.exec(delete(WebSession).where(WebSession.expires_at <= now))  # type: ignore[call-overload]
        s.add(row)
        s.commit()
    return session_id, WebLogin(principal, row.csrf, row.expires_at)


def find(engine: Engine, session_id: str | None, now: datetime | None = None
         ) -> WebLogin | None:
    """The live session behind a cookie; None when there is none, it expired, or its token
    was revoked or its user disabled since the login."""
    if not session_id:
        return None
    now = now or utcnow()
    with session(engine) as s:
        row = s.get(WebSession, _hash(session_id))
        if row is None or row.expires_at <= now:
            return None
        token = s.get(ApiToken, row.token_id)
        user = s.get(TeamUser, row.user)
        if token is None or token.revoked_at is not None or user is None or user.disabled:
            return None
        return WebLogin(Principal(user=user.name, role=user.role, token_id=token.id),
                        row.csrf, row.expires_at)


def end(engine: Engine, session_id: str) -> None:
    """Forget a session (logout): its cookie opens nothing from now on."""
    with session(engine) as s:
        s.exec(delete(WebSession).where(  # type: ignore[call-overload]
            WebSession.id_sha256 == _hash(session_id)))
        s.commit()


def same(expected: str | None, got: str | None) -> bool:
    """Whether a CSRF token matches (constant time; a missing one never does)."""
    return bool(expected) and bool(got) and hmac.compare_digest(expected, got)

"""Users, roles and API tokens: created on the server host, checked on every API call.

A token is `spotrun_<id>_<secret>`: the id is public (listed, revoked by), the secret is
shown once at creation and kept only as its SHA-256, compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import select

from spotrun.db import session, utcnow
from spotrun.db.identity import ROLES, ApiToken, TeamUser
from spotrun.errors import AuthError, BadInputError, ForbiddenError, NotFoundError

NAME = re.compile(r"[a-z][a-z0-9_.-]{0,63}")
TOKEN_PREFIX = "spotrun_"
# last_used_at is written at most this often per token: a busy client must not turn every
# read into a database write.
LAST_USED_EVERY_S = 60.0


@dataclass(frozen=True)
class Principal:
    """Who an authenticated call is from."""

    user: str
    role: str
    token_id: str

    def can(self, role: str) -> bool:
        """Whether this user's role is at least role (admin > member > viewer)."""
        return ROLES.index(self.role) <= ROLES.index(role)


def check_role(role: str) -> str:
    """role, if it is one of ROLES; else bad input naming them."""
    if role not in ROLES:
        raise BadInputError(f"allowed: {', '.join(ROLES)}", field="--role", value=role)
    return role


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def _issue(user: str) -> tuple[ApiToken, str]:
    token_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    return (ApiToken(id=token_id, user=user, secret_sha256=_hash(secret)),
            f"{TOKEN_PREFIX}{token_id}_{secret}")


def add_user(engine: Engine, name: str, role: str) -> str:
    """Create a user with a first token; returns the token (the only time it is shown)."""
    if not NAME.fullmatch(name):
        raise BadInputError("allowed: a lower-case letter, then up to 63 of a-z 0-9 _ . -",
                            field="NAME", value=name)
    check_role(role)
    with session(engine) as s:
        if s.get(TeamUser, name) is not None:
            raise BadInputError("user exists", field="NAME", value=name,
                                hint="`spotrun users token NAME` gives it a new token")
        row, token = _issue(name)
        s.add(TeamUser(name=name, role=role))
        s.add(row)
        s.commit()
    return token


def new_token(engine: Engine, name: str) -> str:
    """Another token for an existing user (the old ones stay valid until revoked)."""
    with session(engine) as s:
        user = s.get(TeamUser, name)
        if user is None:
            raise NotFoundError("no such user", field="NAME", value=name,
                                hint="see `spotrun users list`")
        row, token = _issue(name)
        s.add(row)
        s.commit()
    return token


def revoke(engine: Engine, ref: str) -> list[str]:
    """Revoke a user's tokens (ref: a user name) or one token (ref: its id); returns the ids."""
    now = utcnow()
    with session(engine) as s:
        if s.get(TeamUser, ref) is not None:
            rows = list(s.exec(select(ApiToken).where(ApiToken.user == ref)))
        else:
            row = s.get(ApiToken, ref)
            if row is None:
                raise NotFoundError("no such user or token id", field="NAME|TOKEN_ID", value=ref,
                                    hint="see `spotrun users list`")
            rows = [row]
        out = []
        for row in rows:
            if row.revoked_at is None:
                row.revoked_at = now
                s.add(row)
            out.append(row.id)
        s.commit()
    return out


def list_users(engine: Engine) -> list[dict[str, Any]]:
    """`spotrun users list --json`: each user with its tokens (ids and times, no secrets)."""
    with session(engine) as s:
        users = list(s.exec(select(TeamUser).order_by(TeamUser.name)))
        tokens = list(s.exec(select(ApiToken).order_by(ApiToken.created_at)))
    out = []
    for u in users:
        out.append({"name": u.name, "role": u.role, "created_at": u.created_at,
                    "disabled": u.disabled,
                    "tokens": [{"id": t.id, "created_at": t.created_at,
                                "revoked_at": t.revoked_at, "last_used_at": t.last_used_at}
                               for t in tokens if t.user == u.name]})
    return out


def split_token(token: str) -> tuple[str, str] | None:
    """(id, secret) of a well-formed token, else None."""
    if not token.startswith(TOKEN_PREFIX):
        return None
    token_id, sep, secret = token[len(TOKEN_PREFIX):].partition("_")
    if not sep or not re.fullmatch(r"[0-9a-f]{12}", token_id) or not secret:
        return None
    return token_id, secret


def authenticate(engine: Engine, token: str | None, now: datetime | None = None) -> Principal:
    """The principal behind a bearer token; AuthError (never naming the secret) otherwise."""
    if not token:
        raise AuthError("no API token", field="Authorization",
                        hint="send `Authorization: Bearer <token>`; `spotrun login URL` stores one")
    parts = split_token(token)
    unknown = AuthError("unknown or revoked API token", field="Authorization",
                        hint="ask an admin for a token (`spotrun users token NAME`)")
    if parts is None:
        raise unknown
    token_id, secret = parts
    now = now or utcnow()
    with session(engine) as s:
        row = s.get(ApiToken, token_id)
        # Compare a hash even for an unknown id, so timing tells nothing about which ids exist.
        stored = row.secret_sha256 if row is not None else _hash("")
        if not hmac.compare_digest(stored, _hash(secret)) or row is None \
                or row.revoked_at is not None:
            raise unknown
        user = s.get(TeamUser, row.user)
        if user is None or user.disabled:
            raise unknown
        principal = Principal(user=user.name, role=user.role, token_id=row.id)
        if row.last_used_at is None or now - row.last_used_at > \
                timedelta(seconds=LAST_USED_EVERY_S):
            row.last_used_at = now
            s.add(row)
            s.commit()
    return principal


def require(principal: Principal, role: str, action: str) -> None:
    """ForbiddenError unless principal's role is at least role."""
    if not principal.can(role):
        raise ForbiddenError(f"{action} needs role {role}; user {principal.user} is "
                             f"{principal.role}", field="role", value=principal.role)

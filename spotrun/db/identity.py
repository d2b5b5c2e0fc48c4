"""Team-server tables: users, their API tokens (hashed at rest) and the action trail.

Written by `spotrun users ...` on the server host and by the server itself
(spotrun.server); the daemon never reads them.
"""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Field, SQLModel

from spotrun.db.models import UTCDateTime, utcnow

ROLES = ("admin", "member", "viewer")   # highest first


class TeamUser(SQLModel, table=True):
    """A person (or service) the server knows, with one role."""

    __tablename__ = "team_user"   # "user" is reserved in PostgreSQL

    name: str = Field(primary_key=True)
    role: str                                   # one of ROLES
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    disabled: bool = False


class ApiToken(SQLModel, table=True):
    """One API token: only the SHA-256 of its secret is kept; the whole token is shown once."""

    __tablename__ = "api_token"

    id: str = Field(primary_key=True)           # the public part: `spotrun_<id>_<secret>`
    user: str = Field(index=True)
    secret_sha256: str
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    revoked_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    last_used_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class TrailEntry(SQLModel, table=True):
    """One call through the server that changed state, or was denied (`spotrun trail`)."""

    __tablename__ = "action_trail"

    id: int | None = Field(default=None, primary_key=True)
    at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime, index=True)   # wall
    user: str = Field(default="", index=True)   # "" when no token named a user
    role: str = ""
    action: str                                 # e.g. "cancel", "resume", "GET /api/v1/trail"
    target: str = ""                            # a job id, a user name
    remote_addr: str = ""
    outcome: str                                # ok | denied | error
    detail: str = ""                            # never a token (spotrun.server.redact)


class WebSession(SQLModel, table=True):
    """A dashboard login (spotrun.server.sessions): the cookie holds a random id, this row
    only its SHA-256, so reading the database gives no one a session."""

    __tablename__ = "web_session"

    id_sha256: str = Field(primary_key=True)
    user: str = Field(index=True)
    token_id: str                               # the token pasted at login: revoking it ends this
    csrf: str                                   # the token the session's forms carry
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    expires_at: datetime = Field(sa_type=UTCDateTime, index=True)
    remote_addr: str = ""

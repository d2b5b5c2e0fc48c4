"""The team server's FastAPI app: the state database behind token auth (docs/server.md).

Every body is what the matching `spotrun ... --json` prints (the same views build it); an
error is `{"error", "field", "hint"}` with the status its SpotrunError names.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError

from spotrun.backends.local import LocalBackend
from spotrun.config import Settings
from spotrun.db import open_settings_db
from spotrun.db.faults import database_error
from spotrun.errors import BadInputError, SpotrunError, TooManyAttemptsError
from spotrun.secrets import redact_tokens
from spotrun.server.auth import Limiter
from spotrun.server.render import SpotrunJSON
from spotrun.server.routes_jobs import router as jobs_router
from spotrun.server.routes_reads import router as reads_router
from spotrun.server.routes_stream import router as stream_router
from spotrun.server.routes_submit import router as submit_router


def error_response(exc: SpotrunError) -> SpotrunJSON:
    """One clear JSON error (never a token: the text is redacted)."""
    body = {"error": redact_tokens(exc.message), "field": exc.field,
            "hint": redact_tokens(exc.hint) if exc.hint else None}
    headers = {}
    if isinstance(exc, TooManyAttemptsError):
        headers["Retry-After"] = str(exc.retry_after_s)
    if exc.http_status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return SpotrunJSON(body, status_code=exc.http_status, headers=headers)


def create_app(settings: Settings, *, engine: Any = None, limiter: Limiter | None = None
               ) -> FastAPI:
    """The API app over settings' state database."""
    app = FastAPI(title="spotrun", docs_url=None, redoc_url=None, openapi_url=None,
                  default_response_class=SpotrunJSON)
    app.state.settings = settings
    app.state.engine = engine or open_settings_db(settings)
    app.state.backend = LocalBackend(settings, app.state.engine)
    app.state.limiter = limiter or Limiter()

    @app.exception_handler(SpotrunError)
    async def _spotrun_error(_request: Request, exc: SpotrunError) -> SpotrunJSON:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_request: Request, exc: RequestValidationError) -> SpotrunJSON:
        first = (exc.errors() or [{}])[0]
        loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path")]
        return error_response(BadInputError(str(first.get("msg", "invalid")),
                                            field=".".join(loc) or "request"))

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> SpotrunJSON:
        err = database_error(exc)   # a locked or unreachable database: one line, 503
        if err is not None:
            return SpotrunJSON({"error": str(err), "field": "database", "hint": None},
                               status_code=503)
        return SpotrunJSON({"error": f"internal error ({type(exc).__name__})", "field": None,
                            "hint": "see the server's log"}, status_code=500)

    app.include_router(jobs_router, prefix="/api/v1")
    app.include_router(reads_router, prefix="/api/v1")
    app.include_router(submit_router, prefix="/api/v1")
    app.include_router(stream_router, prefix="/api/v1")
    return app

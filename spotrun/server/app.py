"""The team server's FastAPI app: the state database behind token auth (docs/server.md).

The dashboard (spotrun.server.web) is served beside the API, behind a login.
Every body is what the matching `spotrun ... --json` prints (the same views build it); an
error is `{"error", "field", "hint"}` with the status its SpotrunError names.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, AsyncIterator

import anyio

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError

# The decision (numpy, the priors), which the CLI imports lazily for its own start-up: a
# server loads it once as it starts, not in its first submit's time.
import spotrun.decide.from_settings  # noqa: F401
import spotrun.planning.plans  # noqa: F401
from spotrun.backends.local import LocalBackend
from spotrun.config import Settings
from spotrun.costmodel.history import SharedHistory
from spotrun.decide.memo import CheckMemo
from spotrun.db import open_settings_db
from spotrun.db.faults import database_error
from spotrun.errors import BadInputError, SpotrunError, TooManyAttemptsError
from spotrun.secrets import redact_tokens
from spotrun.server.auth import Limiter
from spotrun.server.routes_budgets import router as budgets_router
from spotrun.server.render import SpotrunJSON
from spotrun.server.status_cache import StatusCache
from spotrun.server.routes_jobs import router as jobs_router
from spotrun.server.routes_reads import router as reads_router
from spotrun.server.routes_stream import router as stream_router
from spotrun.server.routes_submit import router as submit_router
from spotrun.server.web import router as web_router

if TYPE_CHECKING:
    from spotrun.daemon.standby import StandbyDaemon


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


def create_app(settings: Settings, *, engine: Any = None, limiter: Limiter | None = None,
               daemon: "StandbyDaemon | None" = None, provider: Any = None) -> FastAPI:
    """The API app over settings' state database (with daemon: started and stopped with it;
    provider: the one `interrupt` uses instead of settings')."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        # Stopped in the server's shutdown, before uvicorn re-raises SIGTERM to end the
        # process: the loops finish their pass and the lease is released.
        if daemon is not None:
            daemon.start()
        _app.state.status.warm()
        try:
            yield
        finally:
            if daemon is not None:
                await anyio.to_thread.run_sync(daemon.stop)

    app = FastAPI(title="spotrun", docs_url=None, redoc_url=None, openapi_url=None,
                  default_response_class=SpotrunJSON, lifespan=lifespan)
    app.state.settings = settings
    app.state.engine = engine or open_settings_db(settings)
    app.state.backend = LocalBackend(settings, app.state.engine, provider)
    app.state.history = SharedHistory(app.state.engine)   # submits' checks share one reading
    app.state.checks = CheckMemo(max_age_s=app.state.history.max_age_s)   # and alike specs
    app.state.status = StatusCache(app.state.backend.status_list, app.state.backend.status_entry,
                                   max_age_s=settings.server.status_max_age_s)
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
    app.include_router(budgets_router, prefix="/api/v1")
    app.include_router(web_router)   # last: its catch-all serves the dashboard's table
    return app

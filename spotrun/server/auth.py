"""Who is calling: the bearer token checked per request, bad tokens slowed per address,
and every denied call written to the action trail."""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Callable

from fastapi import Request

from spotrun.errors import AuthError, ForbiddenError, SpotrunError, TooManyAttemptsError
from spotrun.db import trail
from spotrun.server.identity import Principal, authenticate, require


class Limiter:
    """At most max_failures bad tokens per address in window_s; then 429 until the oldest
    failure leaves the window. In memory: a restart forgets, a second server counts apart."""

    def __init__(self, max_failures: int = 10, window_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self.clock = clock
        self._fails: dict[str, deque[float]] = defaultdict(deque)
        self._lock = threading.Lock()

    def _recent(self, addr: str, now: float) -> deque[float]:
        q = self._fails[addr]
        while q and q[0] <= now - self.window_s:
            q.popleft()
        return q

    def check(self, addr: str) -> None:
        """TooManyAttemptsError while addr has used up its failures."""
        with self._lock:
            now = self.clock()
            q = self._recent(addr, now)
            if len(q) >= self.max_failures:
                wait = max(1, int(q[0] + self.window_s - now + 0.999))
                raise TooManyAttemptsError(
                    f"too many bad tokens from {addr}; retry in {wait} s", field="Authorization",
                    retry_after_s=wait, hint="check the token (`spotrun login URL`)")

    def fail(self, addr: str) -> None:
        """Count one bad token from addr."""
        with self._lock:
            self._recent(addr, self.clock()).append(self.clock())


@dataclass(frozen=True)
class Caller:
    """An authenticated call: the principal and where it came from."""

    principal: Principal
    addr: str


def remote_addr(request: Request) -> str:
    """The peer's address (behind a reverse proxy: uvicorn's --forwarded-allow-ips)."""
    return request.client.host if request.client else ""


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization") or ""
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def denied(request: Request, exc: SpotrunError, *, user: str = "", role: str = "",
           target: str = "") -> None:
    """Write a denied call to the trail."""
    trail.record(request.app.state.engine, user=user, role=role,
                 action=f"{request.method} {request.url.path}", target=target,
                 remote_addr=remote_addr(request), outcome="denied", detail=str(exc))


def caller(request: Request) -> Caller:
    """FastAPI dependency: the authenticated caller, or 401/429 (written to the trail)."""
    addr = remote_addr(request)
    limiter: Limiter = request.app.state.limiter
    try:
        limiter.check(addr)
        principal = authenticate(request.app.state.engine, _bearer(request))
    except AuthError as exc:
        limiter.fail(addr)
        denied(request, exc)
        raise
    except TooManyAttemptsError as exc:
        denied(request, exc)
        raise
    return Caller(principal=principal, addr=addr)


def needs(request: Request, who: Caller, role: str, action: str, target: str = "") -> None:
    """ForbiddenError (trailed) unless the caller's role is at least role."""
    try:
        require(who.principal, role, action)
    except ForbiddenError as exc:
        denied(request, exc, user=who.principal.user, role=who.principal.role, target=target)
        raise

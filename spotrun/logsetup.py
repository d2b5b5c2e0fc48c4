"""One logging setup for every spotrun process: structlog and stdlib records alike.

structlog's ProcessorFormatter renders stdlib records (boto's retries, SQLAlchemy's
warnings) through the same processors as structlog's own events, so a daemon's log is one
stream of JSON objects, and a person at a terminal gets the same events readable.
"""

from __future__ import annotations

import logging
import sys
from typing import IO, Any

import structlog

from spotrun.secrets import redact_tokens


def _no_tokens(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
    """Replace any API token's secret in the event's text values (a token pasted into a
    request path or an error must not reach a log)."""
    for key, value in event.items():
        if isinstance(value, str) and "spotrun_" in value:
            event[key] = redact_tokens(value)
    return event


_SHARED: list[Any] = [structlog.stdlib.add_log_level, structlog.stdlib.add_logger_name,
                      structlog.processors.TimeStamper(fmt="iso", utc=True), _no_tokens]


def configure_logging(*, json: bool = True, level: int = logging.INFO,
                      stream: IO[str] | None = None) -> None:
    """Send structlog and stdlib logging to one handler: JSON lines, or readable lines."""
    renderer: Any = (structlog.processors.JSONRenderer(sort_keys=True) if json
                     else structlog.dev.ConsoleRenderer(colors=False))
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_SHARED,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, renderer])
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    structlog.configure(
        processors=[structlog.stdlib.filter_by_level, *_SHARED,
                    structlog.stdlib.PositionalArgumentsFormatter(),
                    structlog.processors.StackInfoRenderer(),
                    structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False)

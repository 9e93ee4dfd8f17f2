"""Structured logging: structlog configured once per process, JSON or console.

Request, chat, ADK session and message ids are bound with contextvars by the HTTP layer, so every
line written while handling a request (including by the run task it spawns, which copies the
context) carries them. A last processor masks values of keys that look like credentials: the code
does not log secrets, and this keeps a future mistake from leaking one.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any

import structlog
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

__all__ = ["configure_logging", "redact_secrets"]

_SECRET_KEY = re.compile(r"(authorization|cookie|secret|token|password|passwd|api[_-]?key|credential)", re.I)
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def redact_secrets(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
    for key in event:
        if _SECRET_KEY.search(key):
            event[key] = "[redacted]"
    return event


class _ClientFaultFilter(logging.Filter):
    """aiohttp logs a malformed request (bad HTTP, an undecodable body) as an error with a traceback.

    The fault is the client's, not the gateway's: keep the line, as a warning without the traceback,
    so error-level lines and tracebacks keep meaning "a bug here".
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        while exc is not None and not isinstance(exc, (HttpProcessingError, RequestPayloadError)):
            exc = exc.__cause__ or exc.__context__
        if exc is not None:
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg, record.args = "malformed_request: %s", (str(exc).replace("\n", " ").strip(),)
            record.exc_info = record.exc_text = None
        return True


def configure_logging(level: str = "info", fmt: str = "auto") -> None:
    """Configure structlog (and route stdlib logging through the same renderer)."""
    as_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: Any = structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        redact_secrets,
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    # aiohttp and ADK log through stdlib logging; give them the same format.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared, structlog.processors.format_exc_info],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS[level])
    logging.getLogger("aiohttp.server").addFilter(_ClientFaultFilter())
    # One access line per request is already written by our middleware.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)

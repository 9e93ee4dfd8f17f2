"""Structured logging: structlog configured once per process, JSON or console.

Request, chat, ADK session and message ids, and the caller's user id, are bound with contextvars
by the HTTP layer, so every line written while handling a request (including by the run task it
spawns, which copies the context) carries them. Whoever binds the user id, one processor here
rewrites it as `logging.user_id` says (as is, as a keyed hash, or not at all). A last processor
masks values of keys that look like credentials: the code does not log secrets, and this keeps a
future mistake from leaking one.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import sys
from collections.abc import Callable
from typing import Any

import structlog
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

__all__ = ["configure_logging", "redact_secrets", "user_id_digest", "user_id_rewriter"]

Processor = Callable[[Any, str, dict[str, Any]], dict[str, Any]]

_SECRET_KEY = re.compile(r"(authorization|cookie|secret|token|ticket|password|passwd|api[_-]?key|credential)", re.I)
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def redact_secrets(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
    for key in event:
        if _SECRET_KEY.search(key):
            event[key] = "[redacted]"
    return event


def user_id_digest(key: str, user_id: str) -> str:
    """What `logging.user_id: hash` writes for `user_id`: HMAC-SHA256 under `key`, 64 bits in hex
    (enough to tell a deployment's users apart, short enough for every line)."""
    return hmac.new(key.encode(), user_id.encode(), hashlib.sha256).hexdigest()[:16]


def user_id_rewriter(mode: str, key: str | None) -> Processor | None:
    """The processor for `logging.user_id` (None for `plain`: lines keep `user_id` as bound)."""
    if mode == "plain":
        return None
    if mode == "omit":
        def omit(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
            event.pop("user_id", None)
            return event

        return omit
    if mode != "hash":
        raise ValueError(f"unknown logging.user_id {mode!r}")
    if not key:
        raise ValueError("logging.user_id hash needs logging.user_id_key")
    hash_key = key

    def digest(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
        user_id = event.pop("user_id", None)
        if user_id is not None:
            event["user_id_hash"] = user_id_digest(hash_key, str(user_id))
        return event

    return digest


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


def configure_logging(
    level: str = "info", fmt: str = "auto", *, user_ids: str = "plain", user_id_key: str | None = None
) -> None:
    """Configure structlog (and route stdlib logging through the same renderer).

    `user_ids` and `user_id_key` are `logging.user_id` and `logging.user_id_key`."""
    as_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: Any = structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    rewrite = user_id_rewriter(user_ids, user_id_key)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        *([rewrite] if rewrite is not None else []),
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

"""Structured logging: structlog configured once per process, JSON or console.

Request, chat, ADK session and message ids, and the caller's user id, are bound with contextvars
by the HTTP layer, so every line written while handling a request (including by the run task it
spawns, which copies the context) carries them. Whoever binds the user id, one processor here
rewrites it as `logging.user_id` says (as is, as a keyed hash, or not at all). A last processor
masks values of keys that look like credentials: the code does not log secrets, and this keeps a
future mistake from leaking one.

Two more guards cover what the gateway's own code does not write. aiohttp logs a request it cannot
parse with the raw bytes of the offending line (an over-long Cookie, a bearer key followed by a
control byte): a filter on its logger keeps only the error's class and a fixed phrase. And every
rendered line, whoever wrote it, has each configured secret (API keys, the JWT and internal secrets,
the Redis password, ...) and anything shaped like a JWT masked by value (`LogScrubber`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import structlog
from aiohttp.http_exceptions import HttpProcessingError, InvalidURLError
from aiohttp.web_protocol import RequestPayloadError
from pydantic import BaseModel, SecretStr

__all__ = [
    "LogScrubber", "configure_logging", "redact_secrets", "safe_error_summary", "secret_values", "user_id_as_logged",
    "user_id_digest", "user_id_rewriter",
]

Processor = Callable[[Any, str, dict[str, Any]], dict[str, Any]]

_SECRET_KEY = re.compile(r"(authorization|cookie|secret|token|ticket|password|passwd|api[_-]?key|credential)", re.I)
REDACTED = "[redacted]"
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def redact_secrets(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
    for key in event:
        if _SECRET_KEY.search(key):
            event[key] = REDACTED
    return event


def user_id_digest(key: str, user_id: str) -> str:
    """What `logging.user_id: hash` writes for `user_id`: HMAC-SHA256 under `key`, 64 bits in hex
    (enough to tell a deployment's users apart, short enough for every line)."""
    return hmac.new(key.encode(), user_id.encode(), hashlib.sha256).hexdigest()[:16]


def user_id_as_logged(mode: str, key: str | None) -> Callable[[str], str | None]:
    """How `logging.user_id` writes a user id (for what is not a log line: spans): itself, its
    `user_id_hash`, or None (`omit`)."""
    if mode == "hash":
        hash_key = key or ""
        return lambda user_id: user_id_digest(hash_key, user_id)
    return str if mode == "plain" else lambda _user_id: None


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


# Shorter secrets are not masked by value: masking "abc" everywhere would garble every line (and a
# secret that short protects nothing).
_MIN_SECRET = 4
# A JWT, whoever's: header and payload are base64url JSON objects, so both start with "eyJ".
_JWT = r"eyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*"
# The leading phrase of an HTTP parse error's message ("Invalid header value char", "Got more than
# 8190 bytes when reading"): words only, so that no quoted byte, URL or token ever passes.
_PHRASE = re.compile(r"[A-Za-z][A-Za-z0-9,-]*(?: [A-Za-z0-9,-]+){1,11}")


def safe_error_summary(exc: BaseException) -> str:
    """What a log line may say of a malformed request's error: its class and, when the message opens
    with a fixed phrase, that phrase. Never the bytes aiohttp quotes after it (they can hold a
    credential: an over-long Cookie line, a bearer key followed by a control byte)."""
    name = type(exc).__name__
    message = getattr(exc, "message", "") if isinstance(exc, HttpProcessingError) else str(exc)
    head = re.split(r"[:.\n]", str(message), maxsplit=1)[0].strip()
    # An InvalidURLError's message is the request target itself.
    if isinstance(exc, InvalidURLError) or not _PHRASE.fullmatch(head):
        return name
    return f"{name}: {head}"


class _ClientFaultFilter(logging.Filter):
    """aiohttp logs a malformed request (bad HTTP, an undecodable body) as an error with a traceback.

    The fault is the client's, not the gateway's: keep the line, as a warning without the traceback,
    so error-level lines and tracebacks keep meaning "a bug here". The line names the error by class
    and fixed phrase only: aiohttp's own text quotes the raw line it could not parse.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        while exc is not None and not isinstance(exc, (HttpProcessingError, RequestPayloadError)):
            exc = exc.__cause__ or exc.__context__
        if exc is not None:
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg, record.args = "malformed_request: %s", (safe_error_summary(exc),)
            record.exc_info = record.exc_text = None
        return True


def secret_values(config: BaseModel) -> list[str]:
    """Every secret a config holds: each `SecretStr` in it, and the password of one that is a URL."""
    found: list[str] = []
    for value in _walk(config):
        secret = value.get_secret_value()
        found.append(secret)
        if "://" in secret:
            try:
                password = urlsplit(secret).password
            except ValueError:
                password = None
            if password:
                found.append(password)
    return found


def _walk(node: object) -> Iterator[SecretStr]:
    if isinstance(node, SecretStr):
        yield node
    elif isinstance(node, BaseModel):
        for name in type(node).model_fields:
            yield from _walk(getattr(node, name))
    elif isinstance(node, dict):
        for item in node.values():
            yield from _walk(item)
    elif isinstance(node, (list, tuple)):
        for item in node:
            yield from _walk(item)


class LogScrubber:
    """Masks secrets by value in each rendered line: the last guard, behind the code not logging
    them and `redact_secrets` masking them by key.

    `follow` names where the running config is; its secrets are read again whenever that config is
    replaced (a reload adding an API key), so the check per line is one identity test and a
    substring search per secret (a fifth of what rendering an access line costs), plus a regex only
    on a hit.
    """

    def __init__(self) -> None:
        self._current: Callable[[], BaseModel] | None = None
        self._seen: BaseModel | None = None
        # What to look for, and how to mask it: one tuple, swapped whole (a line may be written
        # from another thread while a reload replaces it).
        self._search: tuple[tuple[str, ...], re.Pattern[str]] = (("eyJ",), re.compile(_JWT))

    def follow(self, current: Callable[[], BaseModel]) -> None:
        self._current = current
        self._refresh(current())

    def _refresh(self, config: BaseModel) -> None:
        self._seen = config
        secrets = {value for value in secret_values(config) if len(value) >= _MIN_SECRET}
        # As written into a JSON line, too (a quote or backslash in a secret is escaped there).
        forms = secrets | {json.dumps(value)[1:-1] for value in secrets}
        alternatives = [re.escape(form) for form in sorted(forms, key=len, reverse=True)]
        self._search = ((*sorted(forms), "eyJ"), re.compile("|".join([*alternatives, _JWT])))

    def __call__(self, line: str) -> str:
        if self._current is not None:
            config = self._current()
            if config is not self._seen:
                self._refresh(config)
        needles, pattern = self._search
        for needle in needles:
            if needle in line:
                return pattern.sub(REDACTED, line)
        return line


def configure_logging(
    level: str = "info", fmt: str = "auto", *, user_ids: str = "plain", user_id_key: str | None = None
) -> LogScrubber:
    """Configure structlog (and route stdlib logging through the same renderer).

    `user_ids` and `user_id_key` are `logging.user_id` and `logging.user_id_key`. Returns the
    scrubber every line passes through last: `follow` it to the running config."""
    as_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    render: Any = structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    scrubber = LogScrubber()

    def renderer(logger: Any, name: str, event: dict[str, Any]) -> str:
        return scrubber(render(logger, name, event))

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
    return scrubber

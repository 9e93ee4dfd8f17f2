"""How failures reach an HTTP client: one JSON shape, never a traceback.

Every error answer is `{"error": {"code": "...", "message": "..."}}` with a fitting status. The
middleware turns `HttpError` into that shape and anything unexpected into a logged 500 whose body
says nothing about the gateway's insides.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web

from .limits import Limited

__all__ = ["HttpError", "error_middleware", "json_error", "refusal"]

log = structlog.get_logger("adk_gateway.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HttpError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


def refusal(exc: Exception) -> HttpError | None:
    """The HTTP answer for a request the chat layer refused (None: not a refusal, a bug).

    One table for every transport: SSE answers it as JSON, WebSocket as an `error` frame.
    """
    from .chats import ChatBusy, Forbidden, Gone
    from .cluster.shared import SharedStateDown
    from .messages import InvalidRequest
    from .registry import ChatNotFound
    from .upstream import UpstreamError

    if isinstance(exc, HttpError):
        return exc  # already decided, e.g. by the replica a request was forwarded to
    if isinstance(exc, InvalidRequest):
        return HttpError(400, "invalid_request", str(exc))
    if isinstance(exc, Forbidden):
        return HttpError(403, "forbidden", str(exc))
    if isinstance(exc, ChatNotFound):
        return HttpError(404, "chat_not_found", "no such chat")
    if isinstance(exc, ChatBusy):
        return HttpError(409, "chat_busy", str(exc), {"Retry-After": "1"})
    if isinstance(exc, Gone):
        return HttpError(410, "approval_gone", str(exc))
    if isinstance(exc, Limited):
        return HttpError(exc.status, exc.code, exc.message, {"Retry-After": str(exc.retry_after)} if exc.retry_after else None)
    if isinstance(exc, UpstreamError):
        return HttpError(502, "upstream_unavailable", str(exc))
    if isinstance(exc, SharedStateDown):
        return HttpError(503, "sessions_unavailable", str(exc), {"Retry-After": "1"})
    return None


def json_error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status, headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except HttpError as exc:
        return json_error(exc.status, exc.code, exc.message, exc.headers)
    except Limited as exc:
        headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after else None
        return json_error(exc.status, exc.code, exc.message, headers)
    except web.HTTPException as exc:
        # aiohttp's own 404/405/413: same JSON shape as ours.
        if exc.status < 400:
            raise
        code = exc.reason.lower().replace(" ", "_")
        return json_error(exc.status, code, exc.reason, {k: v for k, v in exc.headers.items() if k == "Allow"})
    except Exception:
        log.exception("handler_crashed", path=request.path)
        return json_error(500, "internal_error", "the gateway failed to handle this request")

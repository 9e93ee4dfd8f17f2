"""How failures reach an HTTP client: one JSON shape, never a traceback.

Every error answer is `{"error": {"code": "...", "message": "..."}}` with a fitting status. Each
kind of refusal is a `Refusal` subclass that carries its own status and code, defined beside the
code that raises it; the middleware turns any of them into that shape and anything unexpected into a logged 500 whose body
says nothing about the gateway's insides.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web

__all__ = ["HttpError", "Refusal", "error_middleware", "json_error", "refusal"]

log = structlog.get_logger("adk_gateway.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Refusal(Exception):
    """A request the gateway refuses for a reason the caller may read.

    Each kind of refusal says how it is answered, as class attributes (or, for a refusal decided
    at run time such as a limit, instance attributes): SSE and plain HTTP answer it as JSON with
    this status and code, a WebSocket as an `error` frame. The module that raises it owns it.
    """

    status: int = 400
    code: str = "invalid_request"
    # Seconds a client should wait before trying again (a Retry-After header), if it should.
    retry_after: int | None = None

    def public_message(self) -> str:
        return str(self)

    def http(self) -> HttpError:
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after else None
        return HttpError(self.status, self.code, self.public_message(), headers)


class HttpError(Refusal):
    """A refusal decided where the request is handled (a route, or the replica it was forwarded to)."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}

    def http(self) -> HttpError:
        return self


def refusal(exc: BaseException) -> HttpError | None:
    """The HTTP answer for a refused request (None: not a refusal, a bug)."""
    return exc.http() if isinstance(exc, Refusal) else None


def json_error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status, headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except Refusal as exc:
        answer = exc.http()
        return json_error(answer.status, answer.code, answer.message, answer.headers)
    except web.HTTPException as exc:
        # aiohttp's own 404/405/413: same JSON shape as ours.
        if exc.status < 400:
            raise
        code = exc.reason.lower().replace(" ", "_")
        return json_error(exc.status, code, exc.reason, {k: v for k, v in exc.headers.items() if k == "Allow"})
    except Exception:
        log.exception("handler_crashed", path=request.path)
        return json_error(500, "internal_error", "the gateway failed to handle this request")

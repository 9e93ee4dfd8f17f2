"""How failures reach an HTTP client: one JSON shape, never a traceback.

Every error answer is `{"error": {"code": "...", "message": "..."}}` with a fitting status. Each
kind of refusal is a `Refusal` subclass (core/refusals.py) that carries its own status and code, defined
beside the code that raises it; the middleware turns any of them into that shape and anything unexpected into a logged 500 whose body
says nothing about the gateway's insides.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web

from ..core.refusals import Refusal

__all__ = ["Handler", "error_answer", "error_middleware", "json_error"]

log = structlog.get_logger("adk_gateway.edge.errors")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status, headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except Exception as exc:
        answer = error_answer(request, exc)
        if answer is None:
            raise
        return answer


def error_answer(request: web.Request, exc: Exception) -> web.Response | None:
    """The JSON answer to what a handler raised, or None for what must propagate (a redirect).

    Called from the `except` that caught `exc` (an unexpected one is logged with its traceback).
    The public app's request middleware calls it itself rather than stacking `error_middleware`:
    a held stream keeps every coroutine frame its request stacks."""
    if isinstance(exc, Refusal):
        answer = exc.http()
        return json_error(answer.status, answer.code, answer.message, answer.headers)
    if isinstance(exc, web.HTTPException):
        # aiohttp's own 404/405/413: same JSON shape as ours.
        if exc.status < 400:
            return None
        code = exc.reason.lower().replace(" ", "_")
        return json_error(exc.status, code, exc.reason, {k: v for k, v in exc.headers.items() if k == "Allow"})
    log.exception("handler_crashed", path=request.path)
    return json_error(500, "internal_error", "the gateway failed to handle this request")

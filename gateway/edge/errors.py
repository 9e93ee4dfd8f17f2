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

__all__ = ["Handler", "error_middleware", "json_error"]

log = structlog.get_logger("adk_gateway.edge.errors")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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

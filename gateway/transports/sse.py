"""The SSE transport: the AI SDK's `DefaultChatTransport` over HTTP.

`POST /api/chat` starts (or continues) a chat turn and streams it; `GET /api/chat/{id}/stream` is
the AI SDK's `resume: true` route: it replays the response still being written and follows it, or
answers 204 when nothing is active. Handlers only parse, admit and follow; chats.py does the rest.
"""

from __future__ import annotations

from typing import Final

import structlog
from aiohttp import web

from ..chats import Attachment, ChatBusy, Forbidden, Gone
from ..errors import HttpError
from ..messages import CHAT_ID_PATTERN, InvalidRequest, parse_chat_request
from ..protocol import DONE_FRAME, SSE_HEADERS, VERSION_HEADER, encode_chunk, sse_frame
from ..runs import FollowerLagged
from ..state import GATEWAY
from ..upstream import UpstreamError

__all__ = ["routes"]

log = structlog.get_logger("adk_gateway.sse")

_TRANSPORT: Final = "sse"


async def post_chat(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    user_id = gateway.auth.user_id(request)
    raw = await request.read()
    try:
        chat_request = parse_chat_request(
            raw, version_header=request.headers.get(VERSION_HEADER), default_version=gateway.config.chat.default_protocol
        )
    except InvalidRequest as exc:
        raise HttpError(400, "invalid_request", str(exc)) from None
    structlog.contextvars.bind_contextvars(chat_id=chat_request.chat_id)
    try:
        attachment = await gateway.chats.submit(user_id, chat_request)
    except InvalidRequest as exc:
        raise HttpError(400, "invalid_request", str(exc)) from None
    except Forbidden as exc:
        raise HttpError(403, "forbidden", str(exc)) from None
    except ChatBusy as exc:
        raise HttpError(409, "chat_busy", str(exc), {"Retry-After": "1"}) from None
    except Gone as exc:
        raise HttpError(410, "approval_gone", str(exc)) from None
    except UpstreamError as exc:
        raise HttpError(502, "upstream_unavailable", str(exc)) from None
    return await _stream(request, attachment)


async def resume_stream(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    user_id = gateway.auth.user_id(request)
    chat_id = request.match_info["chat_id"]
    structlog.contextvars.bind_contextvars(chat_id=chat_id)
    attachment = gateway.chats.resume(user_id, chat_id)
    if attachment is None:
        return web.Response(status=204)
    return await _stream(request, attachment)


async def _stream(request: web.Request, attachment: Attachment) -> web.StreamResponse:
    gauge = request.app[GATEWAY].metrics.active_streams.labels(_TRANSPORT)
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    gauge.inc()
    try:
        async for batch in attachment.response.follow():
            await response.write(b"".join(map(sse_frame, batch)))
        await response.write(DONE_FRAME)
    except FollowerLagged as exc:
        log.warning("follower_lagged", reason=str(exc))
        error = {"type": "error", "errorText": "This response fell too far behind and cannot continue; reload the chat."}
        await response.write(sse_frame(encode_chunk(error)) + DONE_FRAME)
    except ConnectionError:
        # The browser left. The run goes on; the browser may resume it.
        log.info("client_disconnected")
    finally:
        gauge.dec()
    return response


def routes() -> list[web.RouteDef]:
    return [
        web.post("/api/chat", post_chat),
        web.get("/api/chat/{chat_id:" + CHAT_ID_PATTERN.strip("^$") + "}/stream", resume_stream),
    ]

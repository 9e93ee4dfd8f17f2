"""The SSE transport: the AI SDK's `DefaultChatTransport` over HTTP.

`POST /api/chat` starts (or continues) a chat turn and streams it; `GET /api/chat/{id}/stream` is
the AI SDK's `resume: true` route: it replays the whole assistant message the chat's latest
response belongs to (a `Reader` (chat/response.py) of the whole message) and follows it, or answers 204 when there is none. Those are the default agent's; every agent has the same routes
under `/agents/{name}`. Handlers only admit, parse and follow; chat/service.py does the rest.
Responses idle for `chat.keepalive_interval` get a `: keep-alive` comment line, which the AI SDK
ignores and which keeps proxies with idle timeouts from cutting the stream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import structlog
from aiohttp import web

from ..chat.attachment import Attachment
from ..core.refusals import HttpError, refusal
from ..core.limits import Limited
from ..core.chat_request import CHAT_ID_PATTERN, InvalidRequest, parse_chat_request
from ..core.protocol import (
    DONE_FRAME,
    SSE_HEADERS,
    VERSION_HEADER,
    client_version,
    encode_chunk,
    sse_frame,
    sse_frames,
)
from ..chat.response import Feed, FollowerLagged, Reader
from .state import GATEWAY
from .admit import Caller, admit, admit_stream, count_refusal, preflight, read_body
from .limiter import Slot
from .aiohttp_raw import chunk_writer, forget_body, headers_with_first_write

__all__ = ["routes", "stream_ended"]

log = structlog.get_logger("adk_gateway.edge.sse")

_TRANSPORT: Final = "sse"
_PROTOCOL: Final = "ai_sdk"
_KEEPALIVE: Final = b": keep-alive\n\n"


async def post_chat(request: web.Request) -> web.StreamResponse:
    caller, slot = await admit_stream(request)
    try:
        attachment, chat_id = await _submit(request, caller)
    except BaseException:
        slot.release()
        raise
    try:
        return await _stream(request, attachment, caller, chat_id)
    finally:
        slot.release()


async def _submit(request: web.Request, caller: Caller) -> tuple[Attachment, str]:
    """The request's body read and parsed, and submitted to its chat (here or on its owner)."""
    gateway = request.app[GATEWAY]
    user_id = caller.user_id
    raw = await read_body(request)
    try:
        chat_request = parse_chat_request(
            raw, version_header=request.headers.get(VERSION_HEADER), default_version=gateway.config.chat.default_protocol
        )
    except InvalidRequest as exc:
        raise HttpError(400, "invalid_request", str(exc)) from None
    del raw  # a held stream keeps neither the body nor, once submitted, the parsed request
    chat_id = chat_request.chat_id
    structlog.contextvars.bind_contextvars(chat_id=chat_id)
    gateway.tracing.annotate(agent=caller.agent, chat_id=chat_id)
    try:
        attachment = await gateway.cluster.submit(caller.agent, user_id, chat_request, claims=dict(caller.identity.claims))
    except Exception as exc:
        answer = refusal(exc)
        if answer is None:
            raise
        if isinstance(exc, Limited):
            count_refusal(request, exc.code)
        raise answer from None
    finally:
        del chat_request
        forget_body(request)  # nothing reads the body again
    return attachment, chat_id


async def resume_stream(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    caller = await admit(request, new_work=False)
    chat_id = request.match_info["chat_id"]
    structlog.contextvars.bind_contextvars(chat_id=chat_id)
    gateway.tracing.annotate(agent=caller.agent, chat_id=chat_id)
    try:
        version = client_version(request.headers.get(VERSION_HEADER), None, gateway.config.chat.default_protocol)
        attachment = await gateway.cluster.resume(caller.agent, caller.user_id, chat_id, version)
    except Exception as exc:
        answer = refusal(exc)
        if answer is None:
            raise
        raise answer from None
    if attachment is None:
        return web.Response(status=204, headers=gateway.auth.cors_headers(request))
    try:
        slot = await _open_stream(request, caller.user_id)
    except Limited:
        attachment.response.close()
        raise
    try:
        return await _stream(request, attachment, caller, chat_id)
    finally:
        slot.release()


async def _open_stream(request: web.Request, user_id: str) -> Slot:
    try:
        return await request.app[GATEWAY].admission.open_stream(user_id)
    except Limited as exc:
        count_refusal(request, exc.code)
        raise


class _Browser:
    """The request's browser as its follower sees it: one object of two slots, where closures kept
    ~600 bytes on every held stream (docs/performance.md, issue 29)."""

    __slots__ = ("request", "write")

    def __init__(self, request: web.Request) -> None:
        self.request = request
        # A direct write of a chunk (edge/aiohttp_raw.py `chunk_writer`), once the response is prepared.
        self.write: Callable[[bytes], bool] | None = None

    def connected(self) -> bool:
        """Whether the browser is still there: aiohttp drops the transport when the connection is
        lost, which a write would only notice at the next chunk (a tool call may be minutes away)."""
        transport = self.request.transport
        return transport is not None and not transport.is_closing()

    def write_frames(self, frames: list[bytes]) -> bool:
        assert self.write is not None
        return self.write(sse_frames(frames))


async def _stream(request: web.Request, attachment: Attachment, caller: Caller, chat_id: str) -> web.StreamResponse:
    # One coroutine, not a wrapper around another: a held stream keeps every frame it stacks.
    feed: Feed = attachment.response
    # A chat whose response nobody reads takes the person's next message (chat/service.py).
    browser = _Browser(request)
    feed.watch(browser)
    gateway = request.app[GATEWAY]
    gauge = gateway.metrics.active_streams.labels(_TRANSPORT)
    request_id = structlog.contextvars.get_contextvars().get("request_id", "")
    try:
        response = web.StreamResponse(
            headers={**SSE_HEADERS, **gateway.auth.cors_headers(request), "X-Request-Id": request_id}
        )
        if isinstance(feed, Reader):
            # A local run's log holds its first chunks already (the run's `start`): the headers leave
            # with them, one send fewer a turn. A relay's first chunks cross to another replica first.
            headers_with_first_write(response)
        await response.prepare(request)
    except BaseException:
        feed.close()
        raise
    gauge.inc()
    completed, outcome = False, "disconnected"
    idle = gateway.config.chat.keepalive_interval
    browser.write = chunk_writer(response) if isinstance(feed, Reader) else None
    try:
        if isinstance(feed, Reader) and browser.write is not None:
            batches = feed.follow_direct(browser.write_frames, idle=idle, timers=gateway.timers)
        else:
            batches = feed.follow(idle=idle, timers=gateway.timers)
        async for batch in batches:
            await response.write(sse_frames(batch) if batch else _KEEPALIVE)
        # With the body's end: one send instead of two, per response (and so per turn).
        await response.write_eof(DONE_FRAME)
        completed, outcome = True, "completed"
    except FollowerLagged as exc:
        log.warning("follower_lagged", reason=str(exc))
        error = {"type": "error", "errorText": "This response fell too far behind and cannot continue; reload the chat."}
        await response.write_eof(sse_frame(encode_chunk(error)) + DONE_FRAME)
        completed, outcome = True, "failed"
    except ConnectionError:
        log.info("client_disconnected")
    except Exception:
        # Headers are gone already: no JSON 500 can follow. End the stream as the AI SDK expects.
        log.exception("stream_failed")
        outcome = "failed"
        error = {"type": "error", "errorText": "The gateway failed while streaming this response."}
        try:
            await response.write_eof(sse_frame(encode_chunk(error)) + DONE_FRAME)
        except ConnectionError:
            pass
    finally:
        gauge.dec()
        gateway.metrics.browser_runs.labels(caller.agent, _PROTOCOL, outcome).inc()
        await stream_ended(request, caller, chat_id, feed, completed=completed)
    return response


async def stream_ended(request: web.Request, caller: Caller, chat_id: str, feed: Feed, *, completed: bool) -> None:
    """What an HTTP stream of a chat's response does when it stops (this one, and AG-UI's): a
    response the browser did not read to its end is aborted under `chat.on_disconnect: cancel`,
    and the feed is closed whatever happened."""
    gateway = request.app[GATEWAY]
    try:
        if not completed and gateway.config.chat.on_disconnect == "cancel":
            await gateway.cluster.abort(caller.agent, caller.user_id, chat_id)
    finally:
        feed.close()


def routes() -> list[web.RouteDef]:
    stream_path = "/api/chat/{chat_id:" + CHAT_ID_PATTERN.strip("^$") + "}/stream"
    out = []
    # `/api/chat` is the default agent's; each agent also has its own base path.
    for base in ("", "/agents/{agent}"):
        out += [
            web.post(base + "/api/chat", post_chat),
            web.options(base + "/api/chat", preflight),
            web.get(base + stream_path, resume_stream),
            web.options(base + stream_path, preflight),
        ]
    return out

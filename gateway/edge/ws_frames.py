"""What each frame a browser sends on the WebSocket does: `send`, `resume`, `abort` and `audio`.

`HANDLERS` maps each frame type to its handler; `Connection.on_text` (ws.py) checks the frame's
envelope and admits the request before it calls one. A frame the gateway cannot act on raises
`FrameError`, whose text goes back in an `error` frame; a refused request is answered with the
same reasons SSE answers with (`refused`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from typing import Any, Protocol

import structlog

from ..chat.response import Feed
from ..chat.attachment import Attachment
from ..core.chat_request import InvalidRequest, is_chat_id, parse_chat_body
from ..core.limits import Limited
from ..core.protocol import VERSION_HEADER, ClientVersion, client_version
from ..core.refusals import refusal
from .state import Gateway

__all__ = ["HANDLERS", "FrameError", "refused"]

_AUDIO_MIME_PREFIX = "audio/pcm"


class Connection(Protocol):
    """What a frame's handler uses of the socket the frame came on (ws.py's `Connection`): its
    caller, its requests in flight, and how it sends and follows a response."""

    gateway: Gateway
    user_id: str
    agent: str
    default_version: ClientVersion
    requests: dict[str, asyncio.Task[None]]
    request_chats: dict[str, str]
    aborted: set[str]
    chats: set[str]

    async def send(self, frame: dict[str, Any]) -> None: ...

    async def start_request(self, request_id: str, work: Any) -> None: ...

    def watch(self, request_id: str, feed: Feed) -> None: ...

    async def pump(self, request_id: str, attachment: Attachment, *, first_sequence: int = 0) -> None: ...


class FrameError(Exception):
    """A frame the gateway cannot act on; the text is sent back in an `error` frame."""


async def _on_send(conn: Connection, request_id: str, frame: dict[str, Any]) -> None:
    extras = frame.get("body") if isinstance(frame.get("body"), dict) else {}
    body = {**extras, "id": frame.get("id"), "messages": frame.get("messages"), "trigger": frame.get("trigger", "submit-message")}
    if frame.get("messageId") is not None:
        body["messageId"] = frame["messageId"]
    try:
        chat_request = parse_chat_body(
            body, version_header=_version_header(frame), default_version=conn.default_version
        )
    except InvalidRequest as exc:
        raise FrameError(str(exc)) from None
    await conn.start_request(request_id, _run_send(conn, request_id, chat_request))


async def _run_send(conn: Connection, request_id: str, chat_request: Any) -> None:
    structlog.contextvars.bind_contextvars(chat_id=chat_request.chat_id, ws_request_id=request_id)
    tracing = conn.gateway.tracing
    if not tracing.enabled:
        return await _send(conn, request_id, chat_request)
    # A span per `send`, as an SSE POST has (the socket's upgrade request would last for hours).
    span = tracing.server_span({}, "WS", "send", "/api/chat/ws", agent=conn.agent, chat_id=chat_request.chat_id)
    status = 500
    try:
        await _send(conn, request_id, chat_request)
        status = 200
    finally:
        tracing.end_server(span, status)


async def _send(conn: Connection, request_id: str, chat_request: Any) -> None:
    try:
        attachment = await conn.gateway.cluster.submit(conn.agent, conn.user_id, chat_request, claims=conn.claims)
    except Exception as exc:
        raise refused(conn, exc) from None
    conn.chats.add(chat_request.chat_id)
    conn.request_chats[request_id] = chat_request.chat_id
    await conn.pump(request_id, attachment)


def refused(conn: Connection, exc: Exception) -> Exception:
    """The `error` frame for a refused request (the same table SSE answers with), or the bug itself."""
    answer = refusal(exc)
    if answer is None:
        return exc
    if isinstance(exc, Limited):
        conn.gateway.metrics.limited.labels(exc.code).inc()
    return FrameError(answer.message)


async def _on_resume(conn: Connection, request_id: str, frame: dict[str, Any]) -> None:
    chat_id = frame.get("id")
    if not isinstance(chat_id, str) or not is_chat_id(chat_id):
        raise FrameError("id: a chat id is 1-128 letters, digits, '_' or '-'")
    last = frame.get("lastSequence")
    if last is not None and (not isinstance(last, int) or isinstance(last, bool) or last < -1):
        raise FrameError("lastSequence: a non-negative integer, or absent to replay from the start")
    version = client_version(_version_header(frame), None, conn.default_version)
    await conn.start_request(request_id, _run_resume(conn, request_id, chat_id, -1 if last is None else last, version))


async def _run_resume(conn: Connection, request_id: str, chat_id: str, last: int, version: ClientVersion) -> None:
    structlog.contextvars.bind_contextvars(chat_id=chat_id, ws_request_id=request_id)
    try:
        attachment = await conn.gateway.cluster.resume(conn.agent, conn.user_id, chat_id, version)
    except Exception as exc:
        raise refused(conn, exc) from None
    # This socket now follows the chat: its close tells the chat, as a `send`'s does (a live
    # session kept for a turn the browser resumed is closed once that socket goes too).
    conn.chats.add(chat_id)
    if attachment is None:
        await conn.send({"type": "no-active", "requestId": request_id})
        return
    conn.watch(request_id, attachment.response)
    await conn.send({"type": "start", "requestId": request_id})
    await conn.pump(request_id, attachment, first_sequence=last + 1)


async def _on_abort(conn: Connection, request_id: str, frame: dict[str, Any]) -> None:
    task = conn.requests.get(request_id)
    if task is None:
        return  # already over: nothing to abort
    chat_id = conn.request_chats.get(request_id)
    # No frame goes out for it from now on (the AI SDK forgot the request when it sent the abort):
    # not the chunks the run writes as it ends, not `end`.
    conn.aborted.add(request_id)
    task.cancel()
    if chat_id is not None:
        # The browser stopped the answer: stop the agent run behind it too, it is what costs money.
        await conn.gateway.cluster.abort(conn.agent, conn.user_id, chat_id)


async def _on_audio(conn: Connection, request_id: str, frame: dict[str, Any]) -> None:
    chat_id = frame.get("id")
    if not isinstance(chat_id, str) or not is_chat_id(chat_id):
        raise FrameError("id: a chat id is 1-128 letters, digits, '_' or '-'")
    mime = frame.get("mimeType")
    if not isinstance(mime, str) or not mime.startswith(_AUDIO_MIME_PREFIX):
        raise FrameError(f"mimeType: audio must be {_AUDIO_MIME_PREFIX} (e.g. audio/pcm;rate=16000)")
    data = frame.get("data")
    try:
        raw = base64.b64decode(data, validate=True) if isinstance(data, str) else None
    except (binascii.Error, ValueError):
        raw = None
    if not raw:
        raise FrameError("data: base64-encoded audio is required")
    version = client_version(_version_header(frame), None, conn.default_version)
    try:
        attachment = await conn.gateway.cluster.send_audio(conn.agent, conn.user_id, chat_id, mime, data, version)
    except Exception as exc:
        raise refused(conn, exc) from None
    conn.gateway.metrics.audio_bytes.labels("in").inc(len(raw))
    conn.chats.add(chat_id)
    if attachment is not None:
        # This audio started a turn: its answer streams back under this frame's requestId.
        conn.request_chats[request_id] = chat_id
        conn.watch(request_id, attachment.response)
        try:
            await conn.start_request(request_id, conn.pump(request_id, attachment))
        except FrameError:
            attachment.response.close()
            raise


def _version_header(frame: dict[str, Any]) -> str | None:
    """The client's `x-ai-sdk-version`, which the WebSocket transport carries in the frame's headers."""
    headers = frame.get("headers")
    if not isinstance(headers, dict):
        return None
    return next((str(v) for k, v in headers.items() if k.lower() == VERSION_HEADER), None)


HANDLERS = {"send": _on_send, "resume": _on_resume, "abort": _on_abort, "audio": _on_audio}

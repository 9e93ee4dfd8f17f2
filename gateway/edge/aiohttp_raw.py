"""Every use of aiohttp's private attributes, in one place: writes aiohttp has no public call for.

Each one is kept because it was measured to pay (docs/performance.md has the runs). Each declines
(None, or False with nothing written) when aiohttp's objects are not as expected, and the caller
then takes aiohttp's public path. A decline costs only speed, so it would go unseen:
tests/unit/test_aiohttp_raw.py checks every attribute named here on real aiohttp objects, and that
what is written here decodes exactly as aiohttp's own writes do; pyproject.toml pins aiohttp to the
releases that test passed on.

What is used, and what it buys:

- `WebSocketResponse._writer` (aiohttp's `WebSocketWriter`), its `compress`, `use_mask`,
  `_closing`, `_output_size` and `_limit`, and its protocol's `_paused` and `_drain_helper()`
  (`send_frame`'s flow control):
  - `send_text_frames`: a batch of text frames in one transport write, where aiohttp writes each
    frame on its own. With batching per upstream read, WebSocket CPU at 50 streams went from 30-32
    to 15.8-16.0 us per event (round 1 of issue 8).
  - `write_text_frames_now`: the same write, synchronous, from the task that publishes the chunks
    (`Response.follow_direct`) while the request's task is parked and the socket has no backlog:
    one task hop less per isolated event. Issue 14, interleaved, 30 repetitions: the gateway's
    added latency p50 at 1 stream, +251 -> +204 us (paired, ~11% less); nothing at saturation.
- `StreamResponse._payload_writer` (aiohttp's `StreamWriter`), its `chunked`, `length`,
  `on_body_write`, `_compress`, `_on_chunk_sent`, `_headers_buf` and `output_size`, and the
  response's `_eof_sent`:
  - `chunk_writer`: the same direct write for an SSE response (`Response.follow_direct`). Issue 14,
    interleaved, 50 repetitions: added latency p50 at 1 stream +227 -> +197 us (paired, ~11%
    less; the target ratio 1.51x -> 1.34x); nothing at saturation.
- `StreamResponse._send_headers_immediately` (a class attribute; aiohttp's `Response` sets it false):
  - `headers_with_first_write`: a streamed response's headers wait in the writer until its first
    write and leave in the same send (aiohttp's `_send_headers_with_payload`), instead of a send
    of their own at `prepare`. An SSE turn's first write (its `start` chunk) follows `prepare` at
    once, so the browser waits for nothing; it saves a send (a syscall, a TCP segment) per turn:
    `strace -c` over 200 new-chat turns, `write` 6.3 -> 5.3 a turn (issue 29).
- `BaseRequest._read_bytes`, aiohttp's cached copy of a request body:
  - `forget_body`: a held SSE stream does not keep the body (the browser sends the chat's whole
    history every turn, so it grows with the chat). Round 2 of issue 8, with the other things a held
    stream stopped keeping: 33.2 -> 32.4 KiB per held stream on the benchmark's one-message body.

And two things aiohttp's HTTP/1 server does not offer at all, for safety rather than speed (so a
mismatch here raises rather than declining):

- `GuardedAppRunner`, an `AppRunner` whose connections are `GuardedRequestHandler`s: it overrides
  `AppRunner._make_server` and reads the server's `_loop` and `_kwargs` to build each connection's
  protocol as `Server.__call__` does. The protocol reads `RequestHandler._request_count`,
  `_waiter`, `_force_close`, `_close` and `transport`:
  - a bound on reading a request's head (request line and headers): aiohttp has none, so one
    header line every few seconds held a connection for as long as the client liked;
  - an answer to a request aiohttp cannot parse that names the error without quoting the bytes it
    could not parse (aiohttp echoes them, and they can hold the caller's credential).
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Final

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.http import WebSocketWriter

from ..ops.coarse_timers import CoarseTimers

__all__ = ["chunk_writer", "forget_body", "frame_writer", "send_text_frames", "text_frames", "write_text_frames_now"]

_FRAME_LEN2: Final = struct.Struct("!BBH").pack
_FRAME_LEN3: Final = struct.Struct("!BBQ").pack


def frame_writer(ws: web.WebSocketResponse) -> WebSocketWriter | None:
    """aiohttp's frame writer, when frames may be written to its transport as plain bytes (no
    compression, no mask, not closing); None otherwise, or when its internals look different."""
    try:
        writer = ws._writer
        if writer is None or writer.compress or writer.use_mask or writer._closing:
            return None
        # Everything the writes below read, read once here: they cannot then fail half done.
        writer.transport, writer._output_size, writer._limit, writer.protocol._paused  # noqa: B018
    except AttributeError:
        return None
    return writer


def text_frames(payloads: list[bytes]) -> bytes:
    """Unmasked, uncompressed server text frames, back to back (RFC 6455 section 5.2)."""
    parts: list[bytes] = []
    for payload in payloads:
        size = len(payload)
        if size < 126:
            parts.append(bytes((0x81, size)))  # FIN + text opcode, unmasked
        elif size < 65536:
            parts.append(_FRAME_LEN2(0x81, 126, size))
        else:
            parts.append(_FRAME_LEN3(0x81, 127, size))
        parts.append(payload)
    return b"".join(parts)


async def send_text_frames(ws: web.WebSocketResponse, payloads: list[bytes]) -> bool:
    """Several text frames in one transport write, with the flow control of aiohttp's `send_frame`.

    False, with nothing sent, when aiohttp's writer is not as expected (compression on, another
    aiohttp): the caller then sends frame by frame. A closing transport raises as `send_frame` does.
    """
    writer = frame_writer(ws)
    if writer is None:
        return False
    if writer.transport.is_closing():
        raise ConnectionResetError("Cannot write to closing transport")
    if _write(writer, payloads) and writer.protocol._paused:
        await writer.protocol._drain_helper()
    return True


def write_text_frames_now(ws: web.WebSocketResponse, payloads: list[bytes]) -> bool:
    """`send_text_frames` without waiting: only when the transport's buffer is empty, so no drain
    can be owed. False, with nothing written, otherwise; never raises (it runs in the task that
    publishes chunks to every follower, and the request's own next send will see any failure)."""
    try:
        writer = frame_writer(ws)
        if writer is None:
            return False
        transport = writer.transport
        if transport.is_closing() or transport.get_write_buffer_size():
            return False
        _write(writer, payloads)  # the buffer was empty: a drain due now would return at once
    except Exception:  # noqa: BLE001  # never into the publishing task (see the docstring)
        return False
    return True


def _write(writer: WebSocketWriter, payloads: list[bytes]) -> bool:
    """Write the frames and count them as `send_frame` does; True when a drain is due."""
    data = text_frames(payloads)
    writer.transport.write(data)
    output_size = writer._output_size + len(data)
    if output_size > writer._limit:
        writer._output_size = 0
        return True
    writer._output_size = output_size
    return False


def chunk_writer(response: web.StreamResponse) -> Callable[[bytes], bool] | None:
    """A synchronous `response.write(data)` for a prepared, plain chunked body (no compression, no
    declared length, no send callbacks), or None when the response is not one or aiohttp's writer
    looks different.

    The function it returns writes `data` as one HTTP chunk and returns True only once the headers
    are out and the transport has no backlog (so aiohttp's flow control owes nothing); otherwise it
    returns False having written nothing, and never raises: it runs in the task that publishes
    chunks to every follower, and the request's own next write will see any failure.
    """
    try:
        writer = response._payload_writer
        plain = (
            writer is not None and writer.chunked and writer._compress is None and writer.length is None
            and writer._on_chunk_sent is None and writer.on_body_write is None
        )
        writer.output_size, writer._headers_buf, response._eof_sent  # noqa: B018  # read below
    except AttributeError:
        return None
    if not plain:
        return None
    return _ChunkWriter(writer, response)


class _ChunkWriter:
    """`chunk_writer`'s function: an object of two slots, not a closure (a held stream keeps it)."""

    __slots__ = ("_response", "_writer")

    def __init__(self, writer: Any, response: web.StreamResponse) -> None:
        self._writer = writer
        self._response = response

    def __call__(self, data: bytes) -> bool:
        writer = self._writer
        try:
            if writer._headers_buf or self._response._eof_sent:
                return False  # headers still buffered (nothing written yet): aiohttp's write sends them
            transport = writer.transport
            if transport is None or transport.is_closing() or transport.get_write_buffer_size():
                return False
            chunk = b"%x\r\n%b\r\n" % (len(data), data)
            transport.write(chunk)
            writer.output_size += len(chunk)
        except Exception:  # noqa: BLE001  # never into the publishing task (see chunk_writer)
            return False
        return True


def headers_with_first_write(response: web.StreamResponse) -> bool:
    """Before `prepare`: hold the response's headers until its first write (or its end) and send
    them with it. False, changing nothing, when aiohttp has no such switch (headers then go at
    `prepare`, as before). `chunk_writer`'s writes decline while the headers wait, so the first
    write is always aiohttp's own."""
    if not isinstance(getattr(type(response), "_send_headers_immediately", None), bool):
        return False
    response._send_headers_immediately = False  # type: ignore[misc]
    return True


def forget_body(request: web.BaseRequest) -> None:
    """Drop aiohttp's cached copy of a request body that nothing will read again."""
    request._read_bytes = None


@dataclass(frozen=True)
class HeadGuard:
    """How long a request's head may take to arrive, and who hears of one that took longer;
    `timers`: where aiohttp's keep-alive check of each connection goes (None: the loop)."""

    timeout: float
    on_timeout: Callable[[], None]
    timers: CoarseTimers | None = None


# How long a connection answered 408 stays open, swallowing what the client still sends, before
# it is closed (bounded: a client that never stops is closed all the same).
_LINGER = 2.0
_HEAD_TIMEOUT_BODY = json.dumps({"error": {
    "code": "header_timeout", "message": "the request line and headers did not arrive in time",
}}).encode()
_HEAD_TIMEOUT_ANSWER = (
    b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
    b"Connection: close\r\n\r\n%s" % (len(_HEAD_TIMEOUT_BODY), _HEAD_TIMEOUT_BODY)
)


class GuardedRequestHandler(RequestHandler):
    """aiohttp's HTTP/1 protocol, with a bound on reading each request's head and an answer to a
    malformed request that does not echo it.

    The head's clock runs from the connection's start, and from the first byte of each later
    request (a keep-alive connection idling between requests is aiohttp's `keepalive_timeout`'s
    business); it stops when the head is parsed. Past `timeout` the connection is answered 408
    (closed without an answer when nothing at all arrived) and closed. Bodies, streamed responses
    and WebSockets are not timed here: the head is parsed by then.
    """

    __slots__ = ("_guard", "_head_timer", "_head_from", "_head_bytes", "_lingering")

    def __init__(self, manager: web.Server, *, guard: HeadGuard, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_from = 0  # requests parsed when the clock started
        self._head_bytes = False
        self._lingering = False  # answered 408: what still arrives is swallowed until the close

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._start_head_clock(received=False)
        handle, timers = self._keepalive_handle, self._guard.timers
        if handle is not None and timers is not None:
            # aiohttp arms it for every connection (`keepalive_timeout`, 75 s), a held stream's
            # too: on the shared timer, not a loop timer of its own (~400 bytes on uvloop).
            handle.cancel()
            self._keepalive_handle = timers.call_at(self._next_keepalive_close_time, self._process_keepalive)  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return
        # Waiting for the next request (aiohttp's start() parked on its waiter): these bytes open a head.
        waiting = self._waiter is not None and not self._waiter.done()
        parsed = self._request_count
        super().data_received(data)
        if self._request_count != parsed:
            self._stop_head_clock()
        elif data and self._head_timer is not None:
            self._head_bytes = True
        elif data and waiting:
            self._start_head_clock(received=True)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_head_clock()
        super().connection_lost(exc)

    def handle_error(
        self, request: BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        answer = super().handle_error(request, status, exc, message)  # logs it; raises once the answer began
        if not isinstance(exc, HttpProcessingError):
            return answer
        # aiohttp's message quotes the line it could not parse: name the error, never the bytes.
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = "Error"
        safe = web.json_response(
            {"error": {"code": "malformed_request", "message": f"{status} {phrase}: the request is not valid HTTP ({type(exc).__name__})"}},
            status=status,
        )
        safe.force_close()
        return safe

    def _start_head_clock(self, *, received: bool) -> None:
        self._stop_head_clock()
        self._head_from = self._request_count
        self._head_bytes = received
        self._head_timer = self._loop.call_later(self._guard.timeout, self._head_expired)

    def _stop_head_clock(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_expired(self) -> None:
        self._head_timer = None
        transport = self.transport
        if transport is None or self._force_close or self._close or self._request_count != self._head_from:
            return
        self._guard.on_timeout()
        if not self._head_bytes or not transport.can_write_eof():
            self.force_close()  # closes the transport once what was written is flushed
            return
        transport.write(_HEAD_TIMEOUT_ANSWER)
        # A lingering close (RFC 9112, 9.6): closed while the client still sends its head, the
        # kernel answers its next bytes with a reset, and a reset discards the 408 the client has
        # not read yet. So: the answer and a half-close, what still arrives swallowed, then the close.
        transport.write_eof()
        self._lingering = True
        self._loop.call_later(_LINGER, self.force_close)


class _GuardedServer(web.Server):
    """aiohttp's `Server` (the protocol factory a site listens with), making guarded connections."""

    guard: HeadGuard

    def __call__(self) -> RequestHandler:
        return GuardedRequestHandler(self, guard=self.guard, loop=self._loop, **self._kwargs)


class GuardedAppRunner(web.AppRunner):
    """`web.AppRunner` whose connections are `GuardedRequestHandler`s under `guard`."""

    __slots__ = ("_guard",)

    def __init__(self, app: web.Application, *, guard: HeadGuard, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._guard = guard

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        if type(server) is not web.Server:
            raise TypeError(f"aiohttp made a {type(server).__qualname__}, not the web.Server GuardedAppRunner extends")
        # The same object, built by aiohttp as usual, with the one method that makes connections replaced.
        server.__class__ = _GuardedServer
        server.guard = self._guard  # type: ignore[attr-defined]
        return server

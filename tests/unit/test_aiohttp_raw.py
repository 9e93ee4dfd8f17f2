"""aiohttp's private attributes that gateway/edge/aiohttp_raw.py relies on, checked on real
aiohttp objects: when an aiohttp release changes them, this fails, naming what changed, instead of
the gateway silently taking the slow path (or writing bad frames).

On failure: read what changed in that aiohttp, mend aiohttp_raw.py (or drop the trick and its
figure in docs/performance.md), and move the aiohttp pin in pyproject.toml.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType, web
from aiohttp.base_protocol import BaseProtocol
from aiohttp.http import StreamWriter, WebSocketWriter
from aiohttp.test_utils import TestClient, TestServer

from gateway.edge import aiohttp_raw
from gateway.ops.coarse_timers import CoarseTimers

AIOHTTP = f"aiohttp {aiohttp.__version__}"

# One frame of each length encoding (7-bit, 16-bit, 64-bit), and non-ASCII text.
PAYLOADS = [b'{"a":1}', b"x" * 125, b"y" * 126, ('{"t":"' + "\u00e9\u6f22" * 300 + '"}').encode(), b"z" * 65536]

Handler = Callable[[web.WebSocketResponse], Awaitable[None]]  # a check run inside the server


def attribute(owner: object, name: str, kind: type | tuple[type, ...]) -> Any:
    where = f"{type(owner).__module__}.{type(owner).__qualname__}.{name}"
    assert hasattr(owner, name), f"{AIOHTTP} has no {where}, which gateway/edge/aiohttp_raw.py uses"
    value = getattr(owner, name)
    assert isinstance(value, kind), f"{AIOHTTP}: {where} is a {type(value).__name__} now, not {kind}"
    return value


async def outcome_of(handler: Callable[[Any], Awaitable[None]], target: Any, outcome: asyncio.Future[None]) -> None:
    """Run a server-side check, keeping its failure for the test to raise (not as a server error)."""
    try:
        await handler(target)
    except Exception as exc:  # noqa: BLE001  # any failure of the check, raised by the test
        outcome.set_exception(exc)
    else:
        outcome.set_result(None)


@asynccontextmanager
async def served(method: str, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> AsyncIterator[TestClient]:
    """A client of a real aiohttp server whose one route, `/`, is `handler`."""
    app = web.Application()
    app.router.add_route(method, "/", handler)
    async with TestClient(TestServer(app)) as client:
        yield client


@asynccontextmanager
async def socket_pair(
    handler: Handler, *, compress: bool = False
) -> AsyncIterator[tuple[aiohttp.ClientWebSocketResponse, asyncio.Future[None]]]:
    """A real server-side WebSocketResponse, handed to `handler`; the client end of it, and how the
    handler ended."""
    outcome: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def serve(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(compress=compress)
        await ws.prepare(request)
        await outcome_of(handler, ws, outcome)
        await ws.close()
        return ws

    async with served("GET", serve) as client, client.ws_connect("/", compress=15 if compress else 0, max_msg_size=0) as ws:
        yield ws, outcome


async def received(pair: tuple[aiohttp.ClientWebSocketResponse, asyncio.Future[None]]) -> list[tuple[WSMsgType, str]]:
    """The text frames the server sent, once it closed; its handler's failure, if it failed."""
    ws, outcome = pair
    got = []
    while (msg := await asyncio.wait_for(ws.receive(), 10)).type is WSMsgType.TEXT:
        got.append((msg.type, msg.data))
    await outcome
    assert msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSED), msg
    return got


async def test_the_websocket_writer_internals_are_there() -> None:
    async def check(ws: web.WebSocketResponse) -> None:
        writer = attribute(ws, "_writer", WebSocketWriter)
        assert attribute(writer, "compress", int) == 0 and attribute(writer, "use_mask", bool) is False
        assert attribute(writer, "_closing", bool) is False
        attribute(writer, "_limit", int)
        attribute(writer, "_output_size", int)
        # Any transport with what aiohttp_raw calls: uvloop's are not asyncio.Transport subclasses.
        transport = attribute(writer, "transport", object)
        for method in ("write", "is_closing", "get_write_buffer_size"):
            assert callable(getattr(transport, method, None)), f"the transport {type(transport).__name__} has no {method}()"
        protocol = attribute(writer, "protocol", asyncio.Protocol)
        attribute(protocol, "_paused", bool)
        drain = attribute(protocol, "_drain_helper", object)
        assert inspect.iscoroutinefunction(drain), f"{AIOHTTP}: BaseProtocol._drain_helper is no coroutine function"
        # The flow-control count aiohttp keeps: each frame adds its header and payload, as _write does.
        writer._output_size = 0
        await ws.send_frame(b"x" * 200, WSMsgType.TEXT)
        assert writer._output_size == 4 + 200, f"{AIOHTTP}: WebSocketWriter._output_size counts differently"
        assert aiohttp_raw.frame_writer(ws) is writer
        assert transport.get_write_buffer_size() >= 0

    async with socket_pair(check) as pair:
        assert len(await received(pair)) == 1


async def test_frames_written_the_fast_ways_decode_as_send_str_ones() -> None:
    async def send_all_ways(ws: web.WebSocketResponse) -> None:
        for payload in PAYLOADS:
            await ws.send_str(payload.decode())
        assert await aiohttp_raw.send_text_frames(ws, PAYLOADS)
        while ws._writer.transport.get_write_buffer_size():  # type: ignore[union-attr]
            await asyncio.sleep(0.001)  # the synchronous write declines while there is a backlog
        assert aiohttp_raw.write_text_frames_now(ws, PAYLOADS)

    async with socket_pair(send_all_ways) as pair:
        got = await received(pair)
    n = len(PAYLOADS)
    assert len(got) == 3 * n
    assert got[n : 2 * n] == got[:n] and got[2 * n :] == got[:n]
    assert got[:n] == [(WSMsgType.TEXT, payload.decode()) for payload in PAYLOADS]


async def test_the_frame_bytes_are_what_aiohttp_writes() -> None:
    written: list[bytes] = []

    class Transport(asyncio.Transport):
        def write(self, data: Any) -> None:
            written.append(bytes(data))

        def is_closing(self) -> bool:
            return False

    writer = WebSocketWriter(BaseProtocol(asyncio.get_running_loop()), Transport())
    for payload in PAYLOADS:
        await writer.send_frame(payload, WSMsgType.TEXT)
    assert b"".join(written) == aiohttp_raw.text_frames(PAYLOADS)


async def test_a_compressed_socket_is_left_to_aiohttp() -> None:
    async def check(ws: web.WebSocketResponse) -> None:
        assert ws.compress, "permessage-deflate was not negotiated"
        assert aiohttp_raw.frame_writer(ws) is None
        assert await aiohttp_raw.send_text_frames(ws, PAYLOADS[:1]) is False
        assert aiohttp_raw.write_text_frames_now(ws, PAYLOADS[:1]) is False
        await ws.send_str("sent by aiohttp")

    async with socket_pair(check, compress=True) as pair:
        assert await received(pair) == [(WSMsgType.TEXT, "sent by aiohttp")]


async def test_a_request_body_copy_can_be_dropped() -> None:
    body = b'{"messages": []}'

    async def handler(request: web.Request) -> web.Response:
        assert await request.read() == body
        assert attribute(request, "_read_bytes", bytes) == body, f"{AIOHTTP} no longer caches the body in _read_bytes"
        aiohttp_raw.forget_body(request)
        assert request._read_bytes is None
        return web.Response(text="ok")

    async with served("POST", handler) as client:
        response = await client.post("/", data=body)
        assert response.status == 200, await response.text()


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536])
def test_length_encodings(size: int) -> None:
    frame = aiohttp_raw.text_frames([b"a" * size])
    header = len(frame) - size
    assert header == (2 if size < 126 else 4 if size < 65536 else 10)
    assert frame[0] == 0x81 and frame[header:] == b"a" * size


@asynccontextmanager
async def streamed(handler: Callable[[web.StreamResponse], Awaitable[None]], *, compress: bool = False) -> AsyncIterator[bytes]:
    """A real server-side StreamResponse, prepared and handed to `handler`; the body the client read."""
    outcome: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def serve(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        if compress:
            response.enable_compression()
        await response.prepare(request)
        await outcome_of(handler, response, outcome)
        await response.write_eof()
        return response

    async with served("GET", serve) as client:
        reply = await client.get("/", headers={"Accept-Encoding": "deflate"} if compress else {})
        try:
            body = await reply.read()
        except aiohttp.ClientPayloadError:
            body = None
        await outcome  # the handler's own failure says more than a cut body
        assert reply.status == 200 and body is not None, reply
        yield body


async def test_the_stream_writer_internals_are_there() -> None:
    async def check(response: web.StreamResponse) -> None:
        attribute(response, "_eof_sent", bool)
        writer = attribute(response, "_payload_writer", StreamWriter)
        assert attribute(writer, "chunked", bool) is True
        for name in ("_compress", "length", "_on_chunk_sent", "on_body_write"):
            assert attribute(writer, name, object) is None, f"{AIOHTTP}: a plain response's StreamWriter.{name} is set"
        # Headers not sent yet wait in _headers_buf (a StreamResponse sends them at prepare).
        assert attribute(writer, "_headers_buf", (bytes, type(None))) is None, f"{AIOHTTP}: headers held after prepare"
        await response.write(b"data: 1\n\n")
        before = attribute(writer, "output_size", int)
        await response.write(b"data: 2\n\n")
        assert writer.output_size == before + len(b"9\r\ndata: 2\n\n\r\n"), f"{AIOHTTP}: StreamWriter.output_size counts differently"

    async with streamed(check) as body:
        assert body == b"data: 1\n\ndata: 2\n\n"


async def test_a_chunk_written_the_fast_way_reads_as_a_write_does() -> None:
    async def send_both_ways(response: web.StreamResponse) -> None:
        write_now = aiohttp_raw.chunk_writer(response)
        assert write_now is not None, f"{AIOHTTP}: chunk_writer declines a plain chunked StreamResponse"
        await response.write(b"data: 1\n\n")
        for payload in PAYLOADS:
            while response._payload_writer.transport.get_write_buffer_size():  # type: ignore[union-attr]
                await asyncio.sleep(0.001)  # it declines while there is a backlog
            assert write_now(payload)
            await response.write(payload)

    async with streamed(send_both_ways) as body:
        assert body == b"data: 1\n\n" + b"".join(payload + payload for payload in PAYLOADS)


async def test_held_headers_leave_with_the_first_write_in_one_send() -> None:
    sends: list[bytes] = []
    outcome: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def serve(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        assert aiohttp_raw.headers_with_first_write(response), f"{AIOHTTP}: StreamResponse._send_headers_immediately is gone"
        await response.prepare(request)
        transport = request.transport
        assert transport is not None
        real = transport.write

        def write(data: Any) -> None:
            sends.append(bytes(data))
            real(data)

        transport.write = write  # type: ignore[method-assign]
        try:
            write_now = aiohttp_raw.chunk_writer(response)
            assert write_now is not None and not write_now(b"data: 0\n\n"), "a direct write went out before the headers"
            await response.write(b"data: 1\n\n")
            assert len(sends) == 1 and sends[0].startswith(b"HTTP/1.1 200") and sends[0].endswith(b"data: 1\n\n\r\n"), sends
            assert write_now(b"data: 2\n\n")
            outcome.set_result(None)
        except Exception as exc:  # noqa: BLE001  # raised by the test
            outcome.set_exception(exc)
        await response.write_eof()
        return response

    async with served("GET", serve) as client:
        reply = await client.get("/")
        assert await reply.read() == b"data: 1\n\ndata: 2\n\n"
        await outcome
    assert len(sends) == 3  # headers with the first chunk, the direct chunk, the end


async def test_a_compressed_stream_is_left_to_aiohttp() -> None:
    async def check(response: web.StreamResponse) -> None:
        assert aiohttp_raw.chunk_writer(response) is None
        await response.write(b"data: 1\n\n")

    async with streamed(check, compress=True) as body:
        assert body == b"data: 1\n\n"


# ---- the guarded listener: a bounded request head, a malformed request not echoed ----------------

HEAD_TIMEOUT = 0.5


@asynccontextmanager
async def guarded(app: web.Application) -> AsyncIterator[tuple[int, list[float]]]:
    """`app` served by a GuardedAppRunner on a free port; the port, and when each head timed out."""
    loop = asyncio.get_running_loop()
    timeouts: list[float] = []
    runner = aiohttp_raw.GuardedAppRunner(
        app, guard=aiohttp_raw.HeadGuard(HEAD_TIMEOUT, lambda: timeouts.append(loop.time())), access_log=None
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield runner.addresses[0][1], timeouts
    finally:
        await runner.cleanup()


def guarded_app() -> web.Application:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text=f"hello {len(await request.read())}")

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(6):
            await response.write(f"data: {i}\n\n".encode())
            await asyncio.sleep(HEAD_TIMEOUT / 2)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_route("*", "/", hello)
    app.router.add_get("/stream", stream)
    return app


async def read_all(reader: asyncio.StreamReader, within: float) -> bytes:
    return await asyncio.wait_for(reader.read(), within)


async def test_the_guarded_connection_internals_are_there() -> None:
    async with guarded(guarded_app()) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await reader.readuntil(b"hello 0")).startswith(b"HTTP/1.1 200")
        writer.close()
    server = web.Server(lambda request: None)  # type: ignore[arg-type,return-value]
    attribute(server, "_loop", asyncio.AbstractEventLoop)
    attribute(server, "_kwargs", dict)
    protocol = server()
    for name, kind in (("_request_count", int), ("_force_close", bool), ("_close", bool), ("_waiter", type(None))):
        attribute(protocol, name, kind)
    assert attribute(protocol, "transport", type(None)) is None
    assert inspect.iscoroutinefunction(web.AppRunner._make_server), f"{AIOHTTP}: AppRunner._make_server changed"


async def test_a_trickled_head_is_cut_at_the_bound_and_answered_408() -> None:
    async with guarded(guarded_app()) as (port, timeouts):
        loop = asyncio.get_running_loop()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        started = loop.time()
        writer.write(b"GET / HTTP/1.1\r\n")

        async def trickle() -> None:
            for i in range(50):
                await asyncio.sleep(HEAD_TIMEOUT / 5)
                writer.write(b"X-Line-%d: 1\r\n" % i)

        trickling = asyncio.create_task(trickle())
        try:
            answer = await read_all(reader, 5)
        finally:
            trickling.cancel()
        closed = loop.time() - started
        assert answer.startswith(b"HTTP/1.1 408 ") and b'"code": "header_timeout"' in answer, answer
        assert HEAD_TIMEOUT * 0.9 <= closed < HEAD_TIMEOUT + 0.5, closed
        assert len(timeouts) == 1
        writer.close()


async def test_a_silent_connection_is_closed_at_the_bound_without_an_answer() -> None:
    async with guarded(guarded_app()) as (port, timeouts):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await read_all(reader, HEAD_TIMEOUT + 1) == b""
        assert len(timeouts) == 1
        writer.close()


async def test_keepalive_slow_bodies_and_long_streams_are_not_cut() -> None:
    async with guarded(guarded_app()) as (port, timeouts):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await reader.readuntil(b"hello 0")
        # Idle between requests for three bounds: keep-alive's business, not the head's.
        await asyncio.sleep(HEAD_TIMEOUT * 3)
        # A body trickled over three bounds, after a head that came at once.
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\n")
        for _ in range(6):
            await asyncio.sleep(HEAD_TIMEOUT / 2)
            writer.write(b"x")
        assert (await reader.readuntil(b"hello 6")).startswith(b"HTTP/1.1 200")
        # A response streamed for three bounds.
        writer.write(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"data: 5\n\n" in await reader.readuntil(b"0\r\n\r\n")
        # The next head, trickled after an idle spell, is timed from its first byte.
        await asyncio.sleep(HEAD_TIMEOUT * 2)
        writer.write(b"GET / HTTP/1.1\r\n")
        assert timeouts == []
        assert (await read_all(reader, HEAD_TIMEOUT + 1)).startswith(b"HTTP/1.1 408 ")
        assert len(timeouts) == 1
        writer.close()


async def test_a_websocket_outlives_the_head_bound() -> None:
    async def echo(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for msg in ws:
            await ws.send_str(msg.data)
        return ws

    app = web.Application()
    app.router.add_get("/ws", echo)
    async with guarded(app) as (port, timeouts), aiohttp.ClientSession() as session:
        async with session.ws_connect(f"http://127.0.0.1:{port}/ws") as ws:
            await asyncio.sleep(HEAD_TIMEOUT * 3)
            await ws.send_str("still here")
            assert (await ws.receive(timeout=2)).data == "still here"
        assert timeouts == []


async def test_a_malformed_request_is_answered_without_its_bytes() -> None:
    secret = b"sk-live-0a1b2c3d4e5f6a7b"
    async with guarded(guarded_app()) as (port, _):
        for head in (
            b"GET / HTTP/1.1\r\nAuthorization: Bearer " + secret + b"\x01\r\n\r\n",
            b"GET / HTTP/1.1\r\nCookie: s=" + secret + b"a" * 9000 + b"\r\n\r\n",
            b"G\x01T /" + secret + b" HTTP/1.1\r\n\r\n",
        ):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(head)
            answer = await read_all(reader, 5)
            writer.close()
            assert answer.startswith(b"HTTP/1.") and b" 400 " in answer.split(b"\r\n")[0], answer
            assert secret not in answer and b'"code": "malformed_request"' in answer, answer


async def test_a_connection_s_keepalive_check_goes_on_the_guard_s_shared_timers() -> None:
    # aiohttp arms it at every connection's start; a held stream kept a loop timer for it
    # (~400 bytes on uvloop: docs/performance.md, issue 29).
    timers = CoarseTimers()
    runner = aiohttp_raw.GuardedAppRunner(
        guarded_app(), guard=aiohttp_raw.HeadGuard(HEAD_TIMEOUT, lambda: None, timers), access_log=None,
        keepalive_timeout=30,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", runner.addresses[0][1])
        writer.write(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await reader.readuntil(b"data: 0")).startswith(b"HTTP/1.1 200")
        assert len(timers) == 1
        writer.close()
        for _ in range(100):
            if not len(timers):
                break
            await asyncio.sleep(0.02)
        assert len(timers) == 0  # the connection's end took it out
    finally:
        await runner.cleanup()

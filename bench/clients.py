"""Load clients: conversations over SSE and WebSocket through each path, measured as bytes arrive.

A `Route` is one way to reach the fake upstream's stream:

- `adk-sse`: POST /run_sse as ADK's own clients do (straight to the fake, or via nginx / the bare
  passthrough, which forward the bytes unchanged);
- `gw-sse`: POST /api/chat as the AI SDK's `DefaultChatTransport` does (through the gateway);
- `adk-ws`: ADK's /run_live WebSocket (straight, via nginx, via the passthrough);
- `gw-ws`: /api/chat/ws with the frames of ai 7's `WebSocketChatTransport` (through the gateway).

A `Conversation` is one browser: one chat (one ADK session), turns one after another, over a pooled
HTTP connection or one WebSocket. A `Sink` takes what arrives: it counts frames and bytes cheaply
(no parsing), and for paced streams reads each event's send time to compute its latency.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from .events import MARK_PATTERN, StreamSpec
from .procs import Proc

APP = "demo_agent"
USER = "bench"
_JSON = {"Content-Type": "application/json"}
_MARK = re.compile(MARK_PATTERN)
_MARK_STR = re.compile(MARK_PATTERN.decode())


@dataclass
class Route:
    name: str  # direct, nginx, passthrough, gateway
    kind: str  # adk-sse, gw-sse, adk-ws, gw-ws
    base: str
    proc: Proc  # the process whose CPU and RSS this route costs (the fake itself for direct)
    # WebSocket: offer permessage-deflate as browsers do (15: their window bits); 0 offers nothing.
    compress: int = 0

    def conversation(self, http: aiohttp.ClientSession, chat_id: str) -> Conversation:
        return _KINDS[self.kind](self, http, chat_id)


class Sink:
    """What one turn received."""

    __slots__ = ("bytes", "errors", "first_ns", "frames", "latencies", "seen", "t0", "want", "window", "_tail")

    def __init__(self, want: bytes | None = None, window: tuple[int, int] = (0, 1 << 62)) -> None:
        self.frames = 0
        self.bytes = 0
        self.errors = 0
        self.t0 = 0
        self.first_ns = 0  # first byte (burst) or first marked event (paced)
        self.latencies: list[int] = []
        # Only events sent within this window (CLOCK_MONOTONIC ns) count towards latency.
        self.window = window
        self.want = want
        self.seen: asyncio.Event | None = asyncio.Event() if want else None
        self._tail = b""

    def sse(self, data: bytes, now: int, marks: bool) -> None:
        buf = self._tail + data
        self.frames += buf.count(b"data: ")
        self._tail = buf[-5:]
        self.bytes += len(data)
        if b'"type":"error"' in data:
            self.errors += 1
        if marks:
            lo, hi = self.window
            for match in _MARK.finditer(data):
                sent = int(match.group(1))
                if lo <= sent <= hi:
                    self.latencies.append(now - sent)
                if not self.first_ns:
                    self.first_ns = now
        elif not self.first_ns:
            self.first_ns = now
        if self.seen is not None and not self.seen.is_set() and self.want in buf:  # type: ignore[operator]
            self.seen.set()

    def frame(self, data: str, now: int, marks: bool) -> None:
        self.frames += 1
        self.bytes += len(data)
        if marks:
            match = _MARK_STR.search(data)
            if match:
                sent = int(match.group(1))
                if self.window[0] <= sent <= self.window[1]:
                    self.latencies.append(now - sent)
                if not self.first_ns:
                    self.first_ns = now
        elif not self.first_ns:
            self.first_ns = now
        if self.seen is not None and not self.seen.is_set() and self.want.decode() in data:  # type: ignore[union-attr]
            self.seen.set()


def _user_message(spec: StreamSpec) -> dict[str, Any]:
    return {"role": "user", "parts": [{"text": spec.text()}]}


def _ui_message(spec: StreamSpec, n: int) -> dict[str, Any]:
    return {"id": f"u{n}", "role": "user", "parts": [{"type": "text", "text": spec.text()}]}


class Conversation:
    def __init__(self, route: Route, http: aiohttp.ClientSession, chat_id: str) -> None:
        self.route = route
        self.http = http
        self.chat_id = chat_id
        self.turns = 0

    async def open(self) -> None:
        pass

    async def turn(self, spec: StreamSpec, sink: Sink) -> bool:
        raise NotImplementedError

    async def close(self) -> None:
        pass

    async def hold(self) -> None:
        """After a turn: stay connected and keep reading (what an idle browser does)."""
        await asyncio.Event().wait()


class SseConversation(Conversation):
    def _request(self, spec: StreamSpec) -> tuple[str, bytes]:
        raise NotImplementedError

    async def turn(self, spec: StreamSpec, sink: Sink) -> bool:
        url, body = self._request(spec)
        self.turns += 1
        marks = spec.mode == "paced"
        clock = time.monotonic_ns
        sink.t0 = clock()
        async with self.http.post(url, data=body, headers=_JSON) as resp:
            if resp.status != 200:
                sink.errors += 1
                await resp.read()
                return False
            async for data in resp.content.iter_any():
                sink.sse(data, clock(), marks)
        return sink.errors == 0


class AdkSse(SseConversation):
    def _request(self, spec: StreamSpec) -> tuple[str, bytes]:
        body = {"appName": APP, "userId": USER, "sessionId": self.chat_id, "newMessage": _user_message(spec), "streaming": True}
        return self.route.base + "/run_sse", orjson.dumps(body)


class GatewaySse(SseConversation):
    def _request(self, spec: StreamSpec) -> tuple[str, bytes]:
        body = {"id": self.chat_id, "messages": [_ui_message(spec, self.turns)], "trigger": "submit-message"}
        return self.route.base + "/api/chat", orjson.dumps(body)


class WsConversation(Conversation):
    ws: aiohttp.ClientWebSocketResponse

    def _url(self) -> str:
        raise NotImplementedError

    async def open(self) -> None:
        self.ws = await self.http.ws_connect(self._url(), max_msg_size=0, autoclose=False, compress=self.route.compress)

    async def close(self) -> None:
        await self.ws.close()

    async def hold(self) -> None:
        async for _msg in self.ws:
            pass

    def _frame(self, spec: StreamSpec) -> bytes:
        raise NotImplementedError

    def _done(self, data: str, sink: Sink) -> bool:
        raise NotImplementedError

    async def turn(self, spec: StreamSpec, sink: Sink) -> bool:
        marks = spec.mode == "paced"
        clock = time.monotonic_ns
        frame = self._frame(spec).decode()
        self.turns += 1
        sink.t0 = clock()
        await self.ws.send_str(frame)
        while True:
            msg = await self.ws.receive()
            if msg.type is not aiohttp.WSMsgType.TEXT:
                sink.errors += 1
                return False
            data = msg.data
            if self._done(data, sink):
                return sink.errors == 0
            sink.frame(data, clock(), marks)


class AdkWs(WsConversation):
    def _url(self) -> str:
        base = self.route.base.replace("http", "ws", 1)
        return f"{base}/run_live?app_name={APP}&user_id={USER}&session_id={self.chat_id}&modalities=TEXT"

    def _frame(self, spec: StreamSpec) -> bytes:
        return orjson.dumps({"content": _user_message(spec)})

    def _done(self, data: str, sink: Sink) -> bool:
        if '"turnComplete":true' in data:
            sink.frame(data, time.monotonic_ns(), False)
            return True
        return False


class GatewayWs(WsConversation):
    def _url(self) -> str:
        return self.route.base.replace("http", "ws", 1) + "/api/chat/ws"

    def _frame(self, spec: StreamSpec) -> bytes:
        return orjson.dumps(
            {
                "type": "send", "requestId": f"r{self.turns}", "id": self.chat_id, "trigger": "submit-message",
                "messages": [_ui_message(spec, self.turns)], "headers": {}, "body": {},
            }
        )

    def _done(self, data: str, sink: Sink) -> bool:
        if data.startswith('{"type":"chunk"'):
            return False
        if not data.startswith('{"type":"end"'):
            sink.errors += 1  # an error frame: the request failed
        return True


_KINDS: dict[str, type[Conversation]] = {"adk-sse": AdkSse, "gw-sse": GatewaySse, "adk-ws": AdkWs, "gw-ws": GatewayWs}


def client_session(limit: int = 0) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, force_close=False),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
    )


@dataclass
class Totals:
    streams: int = 0
    failed: int = 0
    frames: int = 0
    bytes: int = 0
    errors: int = 0
    latencies: list[int] = field(default_factory=list)
    first: list[int] = field(default_factory=list)

    def add(self, sink: Sink, ok: bool) -> None:
        self.streams += ok
        self.failed += not ok
        self.frames += sink.frames
        self.bytes += sink.bytes
        self.errors += sink.errors
        self.latencies += sink.latencies
        if sink.first_ns:
            self.first.append(sink.first_ns - sink.t0)

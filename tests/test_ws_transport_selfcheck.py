"""Self-check of the WebSocket chat transports against a scripted aiohttp stub, for ai 6 and ai 7.

ai 7 runs its own `WebSocketChatTransport`; ai 6 runs gateway/static/ws-transport.js, which must speak the same
frames, so one server serves both. The stub plays the approval round trip of tests/test_jsdriver_selfcheck.py over
WebSocket frames. A chat's latest run stays replayable (it outlives the socket that started it, as in the gateway)
until the next `send` or an `abort` replaces it; `resume` answers `no-active` without one, else `start`, a replay from
lastSequence + 1 and the live rest. A failure here points at the
driver or the transports, not at the gateway.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from aiohttp import WSMsgType, web

from tests.jsdriver import assert_clean, check_ws_transport_parity, run_chats
from tests.test_jsdriver_selfcheck import continuation, first_turn

pytestmark = pytest.mark.js

SLOW_CHUNK_SECONDS = 0.03  # variant "slow": a resume after a drop usually finds the run still producing
STALL_AFTER = 3  # variant "stall": the run never gets past this many chunks, so only an abort ends it


@dataclass
class Run:
    """One response, buffered so that a later `resume` can replay it."""

    chunks: list[dict] = field(default_factory=list)
    done: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def append(self, chunk: dict | None) -> None:
        if chunk is None:
            self.done = True
        else:
            self.chunks.append(chunk)
        self.changed.set()


class WsStub:
    def __init__(self) -> None:
        self.frames: list[dict] = []  # every client frame, with "conn" and "variant" added
        self.closes: dict[int, int | None] = {}  # conn -> close code seen by the server
        self.runs: dict[str, Run] = {}  # chat id -> its latest run, replayable
        self._conns = itertools.count()
        self._tasks: set[asyncio.Task] = set()
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/chat/ws", self.handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def produce(self, run: Run, chunks: list[dict], variant: str) -> None:
        for chunk in chunks[:STALL_AFTER] if variant == "stall" else chunks:
            if variant == "slow":
                await asyncio.sleep(SLOW_CHUNK_SECONDS)
            run.append(chunk)
        if variant != "stall":
            run.append(None)

    async def stream(self, ws: web.WebSocketResponse, request_id: str, run: Run, start: int, variant: str) -> None:
        index = sequence = start
        while True:
            if index < len(run.chunks):
                if variant == "gap" and sequence == 2:
                    sequence += 1  # the bug under test: a sequence number is skipped
                await ws.send_json({"type": "chunk", "requestId": request_id, "sequence": sequence,
                                    "chunk": run.chunks[index]})
                index += 1
                sequence += 1
            elif run.done:
                break
            else:
                run.changed.clear()
                await run.changed.wait()
        await ws.send_json({"type": "end", "requestId": request_id})

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        conn = next(self._conns)
        variant = request.query.get("variant", "")
        streams: dict[str, tuple[asyncio.Task, str]] = {}  # requestId -> (stream task, chat id)
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue
            frame = json.loads(msg.data)
            self.frames.append({**frame, "conn": conn, "variant": variant})
            request_id = frame["requestId"]
            if frame["type"] == "send" and variant == "server-error":
                await ws.send_json({"type": "error", "requestId": request_id, "errorText": "agent unavailable"})
            elif frame["type"] == "send":
                last = frame["messages"][-1]
                if last["role"] == "user":
                    chunks = first_turn("")
                else:
                    chunks = continuation("", next(p for p in last["parts"] if p.get("toolCallId") == "c1"))
                run = self.runs[frame["id"]] = Run()
                self.spawn(self.produce(run, chunks, variant))
                streams[request_id] = self.spawn(self.stream(ws, request_id, run, 0, variant)), frame["id"]
            elif frame["type"] == "resume":
                run = self.runs.get(frame["id"])
                if run is None:
                    await ws.send_json({"type": "no-active", "requestId": request_id})
                    continue
                await ws.send_json({"type": "start", "requestId": request_id})
                start = (frame.get("lastSequence") if frame.get("lastSequence") is not None else -1) + 1
                task = self.spawn(self.stream(ws, request_id, run, start, variant))
                streams[request_id] = task, frame["id"]
            elif frame["type"] == "abort" and request_id in streams:
                task, chat_id = streams.pop(request_id)
                task.cancel()
                self.runs.pop(chat_id, None)  # stopped by the user: nothing left to resume
        for task, _ in streams.values():
            task.cancel()  # the socket is gone; the run stays replayable
        self.closes[conn] = ws.close_code
        return ws


@pytest.fixture(scope="module")
def stub() -> Iterator[WsStub]:
    server = WsStub()
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(server.start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10), "stub did not start"
    yield server
    asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


HEADERS = {"X-Test": "yes"}
BODY = {"aiSdkVersion": 6, "extra": 1}

SCENARIOS = {
    "approve": ("", [{"send": "pay 50 to Hanako", "approvals": ["approve"]}]),
    "deny": ("", [{"send": "pay 50 to Hanako", "approvals": "deny"}]),
    "gap": ("gap", [{"send": "pay 50 to Hanako", "approvals": "approve"}]),
    "server-error": ("server-error", [{"send": "pay 50 to Hanako"}]),
    "resume-none": ("", [{"resume": True}]),
    "drop": ("slow", [{"send": "pay 50 to Hanako", "approvals": "approve", "dropSocketAfterChunks": 2}]),
    "abort": ("stall", [{"send": "pay 50 to Hanako", "abortAfterChunks": 2}]),
}


@pytest.fixture(scope="module")
def results(stub: WsStub) -> dict[tuple[str, int], dict]:
    keys = [(name, version) for name in SCENARIOS for version in (6, 7)]
    url = f"ws://127.0.0.1:{stub.port}/api/chat/ws"
    runs = [
        {
            "version": v,
            "api": f"{url}?variant={SCENARIOS[name][0]}",
            "transport": "ws",
            "steps": SCENARIOS[name][1],
            "chat_id": f"{name}-{v}",
            "headers": HEADERS,
            "body": BODY,
        }
        for name, v in keys
    ]
    return dict(zip(keys, run_chats(runs, timeout=10)))


def tool_part(result: dict) -> dict:
    return next(p for p in result["messages"][-1]["parts"] if p.get("toolCallId") == "c1")


def server_frames(stub: WsStub, chat_id: str) -> list[dict]:
    ids = {f["requestId"] for f in stub.frames if f.get("id") == chat_id}
    return [f for f in stub.frames if f["requestId"] in ids]


def close_code(stub: WsStub, conn: int) -> int | None:
    """The close code the server saw on `conn`, once it has noticed (node has exited by now)."""
    deadline = time.monotonic() + 3
    while conn not in stub.closes and time.monotonic() < deadline:
        time.sleep(0.01)
    return stub.closes[conn]


@pytest.mark.parametrize("version", [6, 7])
@pytest.mark.parametrize("decision", ["approve", "deny"])
def test_approval_round_trip(results: dict, version: int, decision: str) -> None:
    result = results[decision, version]
    assert_clean(result)
    first, second = (r["body"] for r in result["requests"])
    assert first["type"] == "send" and first["trigger"] == "submit-message" and first["id"] == f"{decision}-{version}"
    assert second["trigger"] == "submit-message" and second["messageId"] == "m1"
    # Transport headers arrive lower-cased inside every frame, body fields under "body", not merged into the frame.
    assert first["headers"] == {"x-test": "yes"} and first["body"] == BODY
    sent = second["messages"][-1]["parts"][1]
    assert sent["state"] == "approval-responded"
    assert sent["approval"] == {"id": "a1", "approved": decision == "approve"}
    assert [m["id"] for m in result["messages"] if m["role"] == "assistant"] == ["m1"]
    assert tool_part(result)["state"] == ("output-available" if decision == "approve" else "output-denied")
    assert result["messages"][-1]["parts"][-1] == {"type": "text", "text": "Paid", "state": "done"}
    assert result["terminals"] == ["end", "end"]
    assert all(r["gapless"] and r["firstSequence"] == 0 for r in result["requests"])
    assert [r["chunkFrames"] for r in result["requests"]] == [7, 10]
    assert len(result["sockets"]) == 1  # both requests share one persistent socket
    assert result["frames"] == {"in": 19, "out": 2}


@pytest.mark.parametrize("version", [6, 7])
def test_sequence_gap_is_an_error(results: dict, stub: WsStub, version: int) -> None:
    result = results["gap", version]
    assert not result["ok"] and result["status"] == "error"
    assert "Out-of-order" in result["error"]
    assert result["sequenceErrors"] == [
        {"request": 0, "requestId": result["requests"][0]["requestId"], "error": "expected sequence 2, got 3"}
    ]
    assert result["requests"][0]["gapless"] is False
    with pytest.raises(AssertionError, match="frame protocol errors"):
        assert_clean({**result, "ok": True})
    # Ours closes the socket (4000); ai 7 calls close(1011), which the WebSocket API refuses from a client
    # (InvalidAccessError, swallowed), so its socket stays open, detached, until the process goes away (1006).
    (send,) = server_frames(stub, f"gap-{version}")
    assert close_code(stub, send["conn"]) == (4000 if version == 6 else 1006)


@pytest.mark.parametrize("version", [6, 7])
def test_error_frame_fails_the_request(results: dict, version: int) -> None:
    result = results["server-error", version]
    assert not result["ok"] and result["status"] == "error" and result["error"] == "agent unavailable"
    assert result["terminals"] == ["error"] and not result["sequenceErrors"]
    with pytest.raises(AssertionError, match="ended with 'error' \\(agent unavailable\\)"):
        assert_clean({**result, "ok": True})


@pytest.mark.parametrize("version", [6, 7])
def test_resume_without_active_run_is_no_active(results: dict, stub: WsStub, version: int) -> None:
    result = results["resume-none", version]
    assert_clean(result)
    assert result["status"] == "ready" and result["messages"] == []
    assert result["terminals"] == ["no-active"]
    (frame,) = server_frames(stub, f"resume-none-{version}")
    assert frame["type"] == "resume" and "lastSequence" not in frame
    assert frame["headers"] == {"x-test": "yes"} and frame["body"] == BODY


@pytest.mark.parametrize("version", [6, 7])
def test_dropped_socket_resumes_with_a_full_replay(results: dict, stub: WsStub, version: int) -> None:
    result = results["drop", version]
    assert_clean(result)
    dropped, resumed, answer = result["requests"]
    assert dropped["dropped"] and dropped["terminal"] is None and dropped["chunkFrames"] == 2
    # The stock transport asks for everything again (no lastSequence) and the Chat resets the message on `start`.
    assert resumed["type"] == "resume" and "lastSequence" not in resumed["body"]
    assert resumed["started"] and resumed["firstSequence"] == 0 and resumed["terminal"] == "end"
    assert resumed["socket"] == 1 and answer["socket"] == 1 and len(result["sockets"]) == 2
    assert result["sockets"][0]["droppedByDriver"]
    assert answer["body"]["messageId"] == "m1" and answer["terminal"] == "end"
    assert [m["id"] for m in result["messages"] if m["role"] == "assistant"] == ["m1"]
    assert tool_part(result)["state"] == "output-available"
    assert [f["type"] for f in server_frames(stub, f"drop-{version}")] == ["send", "resume", "send"]


@pytest.mark.parametrize("version", [6, 7])
def test_stop_sends_abort(results: dict, stub: WsStub, version: int) -> None:
    result = results["abort", version]
    assert_clean(result)
    assert result["status"] == "ready"
    (request,) = result["requests"]
    assert request["aborted"] and request["terminal"] is None
    frames = server_frames(stub, f"abort-{version}")
    assert [f["type"] for f in frames] == ["send", "abort"]
    assert frames[1] == {"type": "abort", "requestId": request["requestId"], "conn": frames[0]["conn"],
                         "variant": "stall"}


@pytest.fixture(scope="module")
def parity() -> dict:
    return check_ws_transport_parity()


def test_ours_behaves_like_ai7_over_a_scripted_socket(parity: dict) -> None:
    ours, stock = parity["6"], parity["7"]
    crashed = {k: v for side in (ours, stock) for k, v in side.items() if isinstance(v, dict) and "crashed" in v}
    assert not crashed, crashed
    expected_differences = {"gap", "invalidChunk"}
    assert ours.keys() == stock.keys()
    different = {k for k in ours if ours[k] != stock[k]}
    assert different <= expected_differences, {k: (ours[k], stock[k]) for k in different - expected_differences}
    # A gap fails every request on the socket and the next request opens a new one, in both. ai 7 tries
    # close(1011), which a browser refuses from a client; ours closes with 4000.
    for side, code in ((ours, 4000), (stock, 1011)):
        gap = side["gap"]
        assert gap["a"]["chunks"] == ["0"] and gap["a"]["error"]["message"].startswith("Out-of-order")
        assert gap["b"]["error"]["message"].startswith("Out-of-order") and gap["next"]["done"]
        assert [s["closeCalls"] for s in gap["sockets"]] == [[code], []]
    assert stock["invalidChunk"]["read"]["error"] is not None
    assert ours["invalidChunk"]["read"] == {"chunks": ["tool-progress"], "done": True, "error": None}
    # facts a server relies on
    assert ours["resumeStreamIsReplay"] is True
    assert ours["resume"]["frame"] == {"type": "resume", "id": "c1", "headers": {"h": "v"}, "body": {"b": 1}}
    assert ours["abort"]["sent"] == ["send", "abort", "send", "abort", "resume", "abort"]
    assert ours["serverClose"]["second"]["error"] == {
        "name": "TypeError", "typeError": True, "message": "WebSocket chat network connection closed (code 1001)."
    }

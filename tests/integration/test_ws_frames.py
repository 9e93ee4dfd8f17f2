"""The WebSocket transport at the frame level: bad frames, limits, heartbeats, abort, resume.

Stock-client behaviour over WebSocket is covered in test_ws_clients.py; these cases need control
over the socket that a stock client does not give.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.chatflow import new_chat, user
from tests.integration.conftest import SharedAgents, plugin_agent
from tests.procs import PluginStack, gateway_process, metric_value, plugin_stack

pytestmark = pytest.mark.integration

LIMITS = """
websocket:
  heartbeat: 1s
  max_frame_bytes: 64KiB
  idle_timeout: 3s
  max_requests: 4
"""


@pytest.fixture(scope="module")
def slow_stack(tmp_path_factory: pytest.TempPathFactory, shared_agents: SharedAgents) -> Iterator[PluginStack]:
    # Streamed chunks 0.1 s apart, so a test can act in the middle of a response.
    agent = plugin_agent(shared_agents, chunk_delay="0.1")
    with plugin_stack(tmp_path_factory.mktemp("ws"), extra=LIMITS, agent=agent) as stack:
        yield stack


def ws_url(stack: PluginStack) -> str:
    return stack.gateway.base + "/api/chat/ws"


def send_frame(request_id: str, chat_id: str, messages: list[dict[str, Any]], **extra: Any) -> str:
    return json.dumps({
        "type": "send", "requestId": request_id, "id": chat_id, "trigger": "submit-message",
        "messages": messages, "headers": {}, "body": {}, **extra,
    })


async def until_terminal(ws: aiohttp.ClientWebSocketResponse, request_id: str) -> list[dict[str, Any]]:
    frames = []
    while True:
        frame = json.loads(await asyncio.wait_for(ws.receive_str(), 20))
        if frame.get("requestId") != request_id:
            continue
        frames.append(frame)
        if frame["type"] not in ("chunk", "start"):
            return frames


async def test_malformed_frames_get_error_frames_and_the_socket_survives(slow_stack: PluginStack) -> None:
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(slow_stack)) as ws:
        cases = [
            ("not json", "", "not valid JSON"),
            (json.dumps([1, 2]), "", "requestId"),
            (json.dumps({"type": "send"}), "", "requestId"),
            (json.dumps({"type": "dance", "requestId": "r1"}), "r1", "unknown frame type"),
            (json.dumps({"type": "send", "requestId": "r2", "id": "c1", "messages": "hi"}), "r2", "messages"),
            (json.dumps({"type": "resume", "requestId": "r3", "id": "../x"}), "r3", "chat id"),
            (json.dumps({"type": "resume", "requestId": "r4", "id": "c1", "lastSequence": "x"}), "r4", "lastSequence"),
            (json.dumps({"type": "audio", "requestId": "r5", "id": "c1", "mimeType": "audio/pcm", "data": "!!"}), "r5", "base64"),
            (json.dumps({"type": "audio", "requestId": "r6", "id": "c1", "mimeType": "audio/pcm", "data": "AAAA"}), "r6", "live mode"),
        ]
        for text, request_id, needle in cases:
            await ws.send_str(text)
            frame = json.loads(await asyncio.wait_for(ws.receive_str(), 10))
            assert frame == {"type": "error", "requestId": request_id, "errorText": frame["errorText"]}
            assert needle in frame["errorText"], (text, frame)
        await ws.send_bytes(b"\x00\x01")
        assert "binary" in json.loads(await ws.receive_str())["errorText"]
        # Still serving.
        chat = new_chat()
        await ws.send_str(send_frame("ok", chat, [user("hello there")]))
        frames = await until_terminal(ws, "ok")
        assert frames[-1]["type"] == "end"
        assert [f["sequence"] for f in frames[:-1]] == list(range(len(frames) - 1))
    assert metric_value(slow_stack.gateway.base, "adk_gateway_ws_frames_total", {"direction": "in", "type": "invalid"}) >= 4


async def test_many_requests_on_one_socket_are_multiplexed(slow_stack: PluginStack) -> None:
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(slow_stack)) as ws:
        ids = {f"r{i}": new_chat() for i in range(3)}
        for request_id, chat in ids.items():
            await ws.send_str(send_frame(request_id, chat, [user(f"hello {request_id}")]))
        seen: dict[str, list[dict[str, Any]]] = {r: [] for r in ids}
        done: set[str] = set()
        while done != set(ids):
            frame = json.loads(await asyncio.wait_for(ws.receive_str(), 20))
            seen[frame["requestId"]].append(frame)
            if frame["type"] != "chunk":
                done.add(frame["requestId"])
        for request_id, frames in seen.items():
            assert frames[-1]["type"] == "end"
            assert [f["sequence"] for f in frames[:-1]] == list(range(len(frames) - 1))
            text = "".join(f["chunk"].get("delta", "") for f in frames[:-1])
            assert f"hello {request_id}" in text
        # A duplicate requestId while in flight is refused.
        chat = new_chat()
        await ws.send_str(send_frame("dup", chat, [user("hello there")]))
        await ws.send_str(send_frame("dup", new_chat(), [user("hello there")]))
        frames = []
        while not frames or frames[-1]["type"] == "chunk":
            frame = json.loads(await asyncio.wait_for(ws.receive_str(), 20))
            if frame["type"] == "error":
                assert "already in flight" in frame["errorText"]
                break
        await until_terminal(ws, "dup")


async def test_oversized_frame_closes_with_1009(slow_stack: PluginStack) -> None:
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(slow_stack)) as ws:
        await ws.send_str(send_frame("big", new_chat(), [user("x" * 100_000)]))
        msg = await asyncio.wait_for(ws.receive(), 10)
        assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING)
        assert ws.close_code == 1009


async def test_a_peer_that_stops_answering_pings_is_closed(slow_stack: PluginStack) -> None:
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(ws_url(slow_stack), autoping=False)
        # Never answer pings; read raw frames until the server gives up on us.
        closed = False
        for _ in range(20):
            msg = await asyncio.wait_for(ws.receive(), 10)
            if msg.type is aiohttp.WSMsgType.PING:
                continue
            closed = msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING)
            break
        assert closed, "the server kept a dead peer"
        await ws.close()


async def test_idle_socket_is_closed_going_away(slow_stack: PluginStack) -> None:
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(slow_stack)) as ws:
        msg = await asyncio.wait_for(ws.receive(), 10)
        assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        assert ws.close_code == 1001


async def test_abort_stops_the_request_and_the_run(slow_stack: PluginStack) -> None:
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(slow_stack)) as ws:
        chat = new_chat()
        await ws.send_str(send_frame("r1", chat, [user("tell me a long story please")]))
        first = json.loads(await ws.receive_str())
        assert first["type"] == "chunk" and first["sequence"] == 0
        await ws.send_str(json.dumps({"type": "abort", "requestId": "r1"}))
        # The run stops; a resume shows it ended with `abort`, and the chat takes the next message.
        await asyncio.sleep(0.5)
        await ws.send_str(json.dumps({"type": "resume", "requestId": "r2", "id": chat, "lastSequence": 0, "headers": {}, "body": {}}))
        frames = await until_terminal(ws, "r2")
        assert frames[0]["type"] == "start", frames
        chunks = [f["chunk"]["type"] for f in frames if f["type"] == "chunk"]
        assert chunks and chunks[-1] == "abort" and "finish" not in chunks, frames
        assert frames[1]["sequence"] == 1  # resumed after the sequence we said we had
        await ws.send_str(send_frame("r3", chat, [user("hello there")]))
        assert (await until_terminal(ws, "r3"))[-1]["type"] == "end"


async def test_resume_after_a_dropped_socket_replays_from_the_last_sequence(slow_stack: PluginStack) -> None:
    chat = new_chat()
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(slow_stack)) as ws:
            await ws.send_str(send_frame("r1", chat, [user("hello there")]))
            got = [json.loads(await ws.receive_str()) for _ in range(3)]
            assert [f["sequence"] for f in got] == [0, 1, 2]
        # The socket dropped mid-response; the run went on.
        async with http.ws_connect(ws_url(slow_stack)) as ws:
            await ws.send_str(json.dumps({"type": "resume", "requestId": "r2", "id": chat, "lastSequence": 2, "headers": {}, "body": {}}))
            frames = await until_terminal(ws, "r2")
            assert frames[0] == {"type": "start", "requestId": "r2"}
            assert frames[-1]["type"] == "end"
            sequences = [f["sequence"] for f in frames if f["type"] == "chunk"]
            assert sequences == list(range(3, 3 + len(sequences)))
            text = "".join(f["chunk"].get("delta", "") for f in frames if f["type"] == "chunk")
            assert "hello there" in text


async def test_compressed_socket_gets_every_chunk_frame_in_order(adk_base: str, tmp: Path) -> None:
    # With permessage-deflate on, the raw batch and direct writes step aside (aiohttp's writer
    # compresses); frames still arrive whole, in sequence, then `end`.
    with gateway_process(tmp, adk_base, config="websocket:\n  compress: true\n") as gateway:
        async with aiohttp.ClientSession() as http, http.ws_connect(gateway.base + "/api/chat/ws", compress=15) as ws:
            assert ws.compress == 15  # negotiated
            await ws.send_str(send_frame("z", new_chat(), [user("hello there")]))
            frames = await until_terminal(ws, "z")
    assert frames[-1]["type"] == "end"
    assert [f["sequence"] for f in frames[:-1]] == list(range(len(frames) - 1))
    text = "".join(f["chunk"].get("delta", "") for f in frames[:-1] if f["chunk"]["type"] == "text-delta")
    assert text.startswith('You said: "hello there".')

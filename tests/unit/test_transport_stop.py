"""Stop, then the next message, through the real app (aiohttp's test server, ADK scripted in-process).

The AI SDK's `stop()` drops the request over SSE (the run goes on, `chat.on_disconnect: continue`)
and sends `abort` over WebSocket; the person's next message must then be taken, not refused with
409 `chat_busy` until the abandoned run ends, while a response another request still reads keeps
its chat busy (issue 24, defect 10). Over WebSocket, an aborted request gets no frame after the
abort (docs/websocket.md).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gateway.edge.app import create_app
from gateway.config.schema import parse_config
from gateway.edge.state import GATEWAY
from gateway.edge import ws as ws_transport
from tests.support.waiting import until
from tests.support.adk import ScriptedAdk
from tests.support.chat import text_events

CONFIG = """
auth:
  mode: none
"""
USER = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "tell me a long story"}]}
NEXT = {"id": "u2", "role": "user", "parts": [{"type": "text", "text": "shorter, please"}]}


@pytest.fixture
async def adk() -> ScriptedAdk:
    return ScriptedAdk()


@pytest.fixture
async def client(adk: ScriptedAdk) -> AsyncIterator[TestClient]:
    app = create_app(parse_config(CONFIG, env={}))
    for agent in app[GATEWAY].agents:
        agent.client = adk  # type: ignore[assignment]
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


def chat_body(*messages: dict[str, Any], chat_id: str = "chat-1") -> dict[str, Any]:
    return {"id": chat_id, "messages": list(messages), "trigger": "submit-message"}


def sse_chunks(text: str) -> list[Any]:
    out = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def runs(client: TestClient, outcome: str) -> float:
    registry = client.app[GATEWAY].metrics.registry  # type: ignore[index]
    return registry.get_sample_value("adk_gateway_runs_total", {"agent": "demo_agent", "outcome": outcome}) or 0.0


# ---- SSE --------------------------------------------------------------------------------------


async def test_a_message_right_after_a_stopped_sse_response_is_taken_and_streams_whole(client: TestClient, adk: ScriptedAdk) -> None:
    first = await client.post("/api/chat", json=chat_body(USER))
    assert first.status == 200
    adk.says("Once ", "upon ")
    assert b"text-delta" in await first.content.readuntil(b"text-delta")
    first.close()  # stop(): the browser aborts the fetch, its connection goes

    second = await client.post("/api/chat", json=chat_body(USER, NEXT))
    assert second.status == 200, await second.text()
    adk.says("Short.")
    adk.ends()
    chunks = sse_chunks(await second.text())
    assert chunks[-1] == "[DONE]" and chunks[-2]["type"] == "finish" and chunks[-2]["finishReason"] == "stop"
    assert "".join(c.get("delta", "") for c in chunks[:-1]) == "Short."
    assert runs(client, "cancelled") == 1 and runs(client, "completed") == 1


async def test_a_message_while_another_request_reads_the_sse_response_is_busy(client: TestClient, adk: ScriptedAdk) -> None:
    first = await client.post("/api/chat", json=chat_body(USER))
    adk.says("Once ", "upon ")
    await first.content.readuntil(b"text-delta")
    other_tab = await client.get("/api/chat/chat-1/stream")
    assert other_tab.status == 200
    await other_tab.content.readuntil(b"text-delta")
    first.close()  # this tab stopped; the other one still reads

    refused = await client.post("/api/chat", json=chat_body(USER, NEXT))
    assert refused.status == 409 and (await refused.json())["error"]["code"] == "chat_busy"
    adk.ends()
    chunks = sse_chunks(await other_tab.text())
    assert chunks[-1] == "[DONE]" and chunks[-2]["type"] == "finish"
    assert runs(client, "cancelled") == 0


# ---- WebSocket --------------------------------------------------------------------------------


def send_frame(request_id: str, *messages: dict[str, Any]) -> str:
    return json.dumps({
        "type": "send", "requestId": request_id, "id": "chat-1", "trigger": "submit-message",
        "messages": list(messages), "headers": {}, "body": {},
    })


async def test_an_aborted_ws_request_gets_no_frame_after_the_abort_and_the_next_send_streams(
    client: TestClient, adk: ScriptedAdk, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_abort = ws_transport._HANDLERS["abort"]

    async def abort_as_adk_reads(conn: Any, request_id: str, frame: dict[str, Any]) -> None:
        # ADK's next read lands in the same loop turn as the abort frame: the run's task is due to
        # step before the request's task learns it was cancelled.
        adk.says("and ", "then")
        await real_abort(conn, request_id, frame)

    monkeypatch.setitem(ws_transport._HANDLERS, "abort", abort_as_adk_reads)
    async with client.ws_connect("/api/chat/ws") as ws:
        await ws.send_str(send_frame("r1", USER))
        for event in text_events("Once ", "upon ")[:-1]:  # the model is mid-sentence
            adk.reads.put_nowait([event])
        while True:
            frame = json.loads(await asyncio.wait_for(ws.receive_str(), 5))
            if frame["type"] == "chunk" and frame["chunk"].get("delta") == "upon ":
                break  # all ADK sent so far has arrived
        await ws.send_str(json.dumps({"type": "abort", "requestId": "r1"}))
        await until(lambda: runs(client, "cancelled") == 1)
        while not adk.reads.empty():  # what the stopped run never read is no part of the next one
            adk.reads.get_nowait()

        await ws.send_str(send_frame("r2", USER, NEXT))
        adk.says("Short.")
        adk.ends()
        after: list[dict[str, Any]] = []
        while True:
            frame = json.loads(await asyncio.wait_for(ws.receive_str(), 5))
            after.append(frame)
            if frame["requestId"] == "r2" and frame["type"] != "chunk":
                break
    stray = [f for f in after if f["requestId"] == "r1"]
    assert stray == [], stray
    assert after[-1] == {"type": "end", "requestId": "r2"}
    assert "".join(f["chunk"].get("delta", "") for f in after if f["type"] == "chunk") == "Short."

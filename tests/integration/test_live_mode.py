"""Live upstream mode: one ADK `/run_live` session per chat (the scripted live model), with the
gateway's approvals and browser tools through its plugin, audio both ways, over both transports,
and a turn that outlives the browser's socket (mid-reply, or while an approval waits)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from tests.chatflow import assistant_message, new_chat, post, types, user
from tests.demo_rows import RULE_SCENARIOS, SCENARIOS, check_rows, check_rule_rows, said, tool_states
from tests.jsdriver import assert_clean, run_chats
from tests.ops.stack import Replicas, replicas
from tests.integration.conftest import SharedAgents, plugin_agent
from tests.procs import PluginStack, metric_value, plugin_stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def live_stack(tmp_path_factory: pytest.TempPathFactory, shared_agents: SharedAgents) -> Iterator[PluginStack]:
    models = "metrics:\n  models: [demo-scripted]\n"
    agent = plugin_agent(shared_agents)
    with plugin_stack(tmp_path_factory.mktemp("live"), upstream_mode="live", extra=models, agent=agent) as stack:
        yield stack


@pytest.fixture(scope="module")
def slow_live_stack(tmp_path_factory: pytest.TempPathFactory, shared_agents: SharedAgents) -> Iterator[PluginStack]:
    # Streamed chunks 0.1 s apart, so a socket can drop in the middle of a reply.
    agent = plugin_agent(shared_agents, chunk_delay="0.1")
    with plugin_stack(tmp_path_factory.mktemp("slow-live"), upstream_mode="live", agent=agent) as stack:
        yield stack


def ws_url(stack: PluginStack) -> str:
    return stack.gateway.base.replace("http", "ws") + "/api/chat/ws"


@pytest.mark.js
@pytest.mark.parametrize("version", [6, 7])
def test_rules_decide_a_live_agents_calls_too(live_stack: PluginStack, version: int) -> None:
    """Live mode's plugin blocks on every gated call: the rules answer it at once, nobody asked."""
    names = list(RULE_SCENARIOS)
    api = f"{ws_url(live_stack)}?aiSdkVersion={version}"
    runs = [{"version": version, "api": api, "transport": "ws", "steps": RULE_SCENARIOS[n]} for n in names]
    check_rule_rows(dict(zip(names, run_chats(runs, timeout=40))), version)
    assert metric_value(live_stack.gateway.base, "adk_gateway_plugin_requests_total", {"result": "rule"}) >= 2


@pytest.mark.js
@pytest.mark.parametrize("version", [6, 7])
def test_every_demo_row_over_websocket_with_a_live_agent(live_stack: PluginStack, version: int) -> None:
    names = list(SCENARIOS)
    runs = [{"version": version, "api": ws_url(live_stack), "transport": "ws", "steps": SCENARIOS[n]} for n in names]
    check_rows(dict(zip(names, run_chats(runs, timeout=40))))
    assert metric_value(live_stack.gateway.base, "adk_gateway_plugin_requests_total", {"result": "run"}) >= 2


def test_interrupted_turn_ends_with_the_right_reason(live_stack: PluginStack) -> None:
    gw = live_stack.gateway
    v6 = post(gw, new_chat(), [user("interrupt me")])
    assert v6.chunks[-1]["finishReason"] == "other"
    v7 = post(gw, new_chat(), [user("interrupt me")], aiSdkVersion=7)
    assert v7.chunks[-1]["finishReason"] == "interrupted"
    assert "text-delta" in types(v7)


def test_tokens_and_time_to_first_token_are_counted_per_live_turn(live_stack: PluginStack) -> None:
    gw = live_stack.gateway
    labels = {"model": "demo-scripted", "kind": "input"}
    before = metric_value(gw.base, "adk_gateway_tokens_total", labels)
    timed = metric_value(gw.base, "adk_gateway_first_token_seconds_count")
    reply = post(gw, new_chat(), [user("hello there")])
    metadata = reply.chunks[-1]["messageMetadata"]
    assert metadata["model"] == "demo-scripted" and metadata["usage"]["inputTokens"] == 16
    assert metric_value(gw.base, "adk_gateway_tokens_total", labels) == before + 16
    assert metric_value(gw.base, "adk_gateway_first_token_seconds_count") == timed + 1
    post(gw, new_chat(), [user("hello again")])
    assert metric_value(gw.base, "adk_gateway_tokens_total", labels) == before + 32
    assert metric_value(gw.base, "adk_gateway_first_token_seconds_count") == timed + 2


async def test_audio_round_trip_and_socket_close_ends_the_live_session(live_stack: PluginStack) -> None:
    gw = live_stack.gateway.base
    spoken_tokens = metric_value(gw, "adk_gateway_tokens_total", {"model": "demo-scripted", "kind": "output"})
    chat = new_chat()
    audio = base64.b64encode(bytes(3200)).decode()
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(live_stack)) as ws:
        await ws.send_str(json.dumps({"type": "audio", "requestId": "a1", "id": chat, "mimeType": "audio/pcm;rate=16000", "data": audio}))
        frames = []
        while True:
            frame = json.loads(await asyncio.wait_for(ws.receive_str(), 20))
            frames.append(frame)
            if frame["type"] != "chunk":
                break
        assert frames[-1] == {"type": "end", "requestId": "a1"}
        chunks = [f["chunk"] for f in frames[:-1]]
        pcm = [c for c in chunks if c["type"] == "data-pcm"]
        assert pcm and base64.b64decode(pcm[0]["data"]["data"])
        heard = [c for c in chunks if c["type"] == "data-transcription"]
        assert heard[-1]["data"]["text"] == "(heard 3200 bytes of audio)"
        assert "3200 bytes" in "".join(c.get("delta", "") for c in chunks)
        open_sessions = metric_value(gw, "adk_gateway_live_sessions")
        assert open_sessions >= 1
        assert metric_value(gw, "adk_gateway_audio_bytes_total", {"direction": "in"}) >= 3200
        assert metric_value(gw, "adk_gateway_audio_bytes_total", {"direction": "out"}) > 0
        # A spoken turn's tokens count as a typed one's do.
        assert metric_value(gw, "adk_gateway_tokens_total", {"model": "demo-scripted", "kind": "output"}) > spoken_tokens
    # The browser socket closed: the gateway closes the chat's live session with ADK. (Chats
    # driven over SSE keep theirs until chat.idle_chat_ttl, as there is no socket to watch.)
    for _ in range(50):
        if metric_value(gw, "adk_gateway_live_sessions") == open_sessions - 1:
            break
        await asyncio.sleep(0.1)
    assert metric_value(gw, "adk_gateway_live_sessions") == open_sessions - 1


# ---- a dropped browser socket does not end the live turn ----------------------------------------


def send_frame(request_id: str, chat_id: str, messages: list[dict[str, Any]], **extra: Any) -> str:
    return json.dumps({
        "type": "send", "requestId": request_id, "id": chat_id, "trigger": "submit-message",
        "messages": messages, "headers": {}, "body": {}, **extra,
    })


def resume_frame(request_id: str, chat_id: str, **extra: Any) -> str:
    return json.dumps({"type": "resume", "requestId": request_id, "id": chat_id, "headers": {}, "body": {}, **extra})


async def until_terminal(ws: aiohttp.ClientWebSocketResponse, request_id: str) -> list[dict[str, Any]]:
    frames = []
    while True:
        frame = json.loads(await asyncio.wait_for(ws.receive_str(), 20))
        if frame.get("requestId") != request_id:
            continue
        frames.append(frame)
        if frame["type"] not in ("chunk", "start"):
            return frames


def chunks_of(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f["chunk"] for f in frames if f["type"] == "chunk"]


def text_of(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["delta"] for c in chunks if c["type"] == "text-delta")


async def live_sessions_become(base: str, count: float) -> None:
    for _ in range(50):
        if metric_value(base, "adk_gateway_live_sessions") == count:
            return
        await asyncio.sleep(0.1)
    assert metric_value(base, "adk_gateway_live_sessions") == count


async def test_a_socket_dropped_mid_reply_leaves_the_live_turn_to_a_resume_on_a_new_socket(slow_live_stack: PluginStack) -> None:
    base = slow_live_stack.gateway.base
    url = ws_url(slow_live_stack)
    prompt = "tell me a long story please"
    async with aiohttp.ClientSession() as http:
        # The reply an unbroken socket reads, to compare with.
        async with http.ws_connect(url) as ws:
            await ws.send_str(send_frame("r0", new_chat(), [user(prompt)]))
            unbroken = chunks_of(await until_terminal(ws, "r0"))
        await live_sessions_become(base, 0)

        chat = new_chat()
        async with http.ws_connect(url) as ws:
            await ws.send_str(send_frame("r1", chat, [user(prompt)]))
            got = [json.loads(await asyncio.wait_for(ws.receive_str(), 20)) for _ in range(4)]
            assert [f["sequence"] for f in got] == [0, 1, 2, 3]
        # The socket dropped mid-reply; a stock client reconnects and resumes from what it has.
        async with http.ws_connect(url) as ws:
            await ws.send_str(resume_frame("r2", chat, lastSequence=3))
            frames = await until_terminal(ws, "r2")
            assert frames[0] == {"type": "start", "requestId": "r2"} and frames[-1] == {"type": "end", "requestId": "r2"}
            assert [f["sequence"] for f in frames[1:-1]] == list(range(4, len(frames) + 2))
            chunks = chunks_of(got) + chunks_of(frames)
            assert "error" not in types_of(chunks), chunks
            assert types_of(chunks) == types_of(unbroken) and text_of(chunks) == text_of(unbroken)
            assert chunks[-1]["type"] == "finish" and chunks[-1]["finishReason"] == "stop"
            # The browser came back before the turn ended: the session stays for its next turn.
            assert metric_value(base, "adk_gateway_live_sessions") == 1
        # The socket that only resumed closed between turns: the session goes with it.
        await live_sessions_become(base, 0)


async def test_a_socket_dropped_while_an_approval_waits_keeps_the_live_turn_and_the_payment_runs_once(slow_live_stack: PluginStack) -> None:
    base = slow_live_stack.gateway.base
    url = ws_url(slow_live_stack)
    approved_before = metric_value(base, "adk_gateway_approval_wait_seconds_count", {"tool": "process_payment", "outcome": "approved"})
    chat, first_message = new_chat(), user("pay 50 to Hanako")
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(url) as ws:
            await ws.send_str(send_frame("r1", chat, [first_message]))
            asked = chunks_of(await until_terminal(ws, "r1"))
            assert types_of(asked)[-3:] == ["tool-approval-request", "finish-step", "finish"]
        # The socket dropped while the person decides; the turn waits on, its session open.
        await asyncio.sleep(0.5)
        assert metric_value(base, "adk_gateway_live_sessions") == 1
        async with http.ws_connect(url) as ws:
            await ws.send_str(resume_frame("r2", chat))  # what a stock client sends on reconnect
            replay = await until_terminal(ws, "r2")
            assert replay[-1]["type"] == "end" and "error" not in types_of(chunks_of(replay)), replay
            answer = assistant_message(asked, [True])
            await ws.send_str(send_frame("r3", chat, [first_message, answer], messageId=answer["id"]))
            frames = await until_terminal(ws, "r3")
            assert frames[-1] == {"type": "end", "requestId": "r3"}
            chunks = chunks_of(frames)
            assert "error" not in types_of(chunks), chunks
            outputs = [c for c in chunks if c["type"] == "tool-output-available"]
            assert len(outputs) == 1 and outputs[0]["output"]["success"] is True
            assert "Hanako" in text_of(chunks) and chunks[-1]["finishReason"] == "stop"
    approved = metric_value(base, "adk_gateway_approval_wait_seconds_count", {"tool": "process_payment", "outcome": "approved"})
    assert approved == approved_before + 1
    await live_sessions_become(base, 0)


@pytest.mark.js
@pytest.mark.parametrize("version", [6, 7])
def test_stock_clients_resume_a_live_turn_after_a_dropped_socket(slow_live_stack: PluginStack, version: int) -> None:
    """What the issue saw with `make run-live`: the stock Chat drops its socket mid-reply, or mid
    approval request, or while the approval waits, then resumes on a new socket (and approves)."""
    url = ws_url(slow_live_stack)
    steps = [
        [{"send": "hello there, this is a longer message", "dropSocketAfterChunks": 3}],
        [{"send": "pay 50 to Hanako", "approvals": "approve", "dropSocketAfterChunks": 2}],
        [{"send": "pay 50 to Hanako", "approvals": "approve", "dropSocketAfterChunks": 7}],
    ]
    results = run_chats([{"version": version, "api": url, "transport": "ws", "steps": s} for s in steps], timeout=60)
    for result in results:
        assert_clean(result)
        assert [m["role"] for m in result["messages"]] == ["user", "assistant"]
        assert "error" not in [chunk["type"] for _, chunk in result["chunks"]], result["chunks"]
        assert [s["droppedByDriver"] for s in result["sockets"]][:2] == [True, False], result["sockets"]
    dropped, *approvals = results
    # The last one dropped with the whole approval request read: while the approval waits.
    asked = [chunk["type"] for request, chunk in approvals[-1]["chunks"] if request == 0]
    assert asked[-3:] == ["tool-approval-request", "finish-step", "finish"], asked
    assert "longer message" in said(dropped)
    for approval in approvals:
        assert tool_states(approval) == ["output-available"]
        assert "Hanako" in said(approval)


@pytest.fixture(scope="module")
def live_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    with replicas(tmp_path_factory.mktemp("live-replicas"), upstream_mode="live", adk_env={"DEMO_CHUNK_DELAY": "0.1"}) as pair:
        yield pair


async def test_across_replicas_a_socket_on_b_dropped_mid_reply_leaves_the_live_turn_on_a(live_pair: Replicas) -> None:
    a, b = live_pair.a, live_pair.b
    # The chat is A's: its first turn, over SSE on A, opens its live session there.
    chat, hello = new_chat(), user("hello there")
    first = post(a, chat, [hello])
    assert first.status == 200 and first.chunks[-1]["type"] == "finish", first.body
    assert metric_value(a.base, "adk_gateway_live_sessions") == 1
    story = user("tell me a long story please")
    history = [hello, assistant_message(first.chunks), story]
    url = b.base.replace("http", "ws") + "/api/chat/ws"
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(url) as ws:
            await ws.send_str(send_frame("r1", chat, history))
            got = [json.loads(await asyncio.wait_for(ws.receive_str(), 20)) for _ in range(4)]
            assert [f["sequence"] for f in got] == [0, 1, 2, 3]
        # B told A the socket closed; the turn goes on there and a new socket on B resumes it.
        async with http.ws_connect(url) as ws:
            await ws.send_str(resume_frame("r2", chat, lastSequence=3))
            frames = await until_terminal(ws, "r2")
            assert frames[0] == {"type": "start", "requestId": "r2"} and frames[-1] == {"type": "end", "requestId": "r2"}
            chunks = chunks_of(got) + chunks_of(frames)
            assert "error" not in types_of(chunks), chunks
            assert chunks[-1]["type"] == "finish" and chunks[-1]["finishReason"] == "stop"
            assert "story" in text_of(chunks)
            assert metric_value(a.base, "adk_gateway_live_sessions") == 1
    # That socket closed between turns: B tells A, which closes the session.
    await live_sessions_become(a.base, 0)
    assert metric_value(b.base, "adk_gateway_live_sessions") == 0


def types_of(chunks: list[dict[str, Any]]) -> list[str]:
    return [c["type"] for c in chunks]

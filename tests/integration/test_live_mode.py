"""Live upstream mode: one ADK `/run_live` session per chat (the scripted live model), with the
gateway's approvals and browser tools through its plugin, audio both ways, over both transports."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator

import aiohttp
import pytest

from tests.chatflow import new_chat, post, types, user
from tests.demo_rows import SCENARIOS, check_rows
from tests.jsdriver import assert_clean, run_chats
from tests.procs import PluginStack, metric_value, plugin_stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def live_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PluginStack]:
    with plugin_stack(tmp_path_factory.mktemp("live"), upstream_mode="live") as stack:
        yield stack


def ws_url(stack: PluginStack) -> str:
    return stack.gateway.base.replace("http", "ws") + "/api/chat/ws"


@pytest.mark.js
@pytest.mark.parametrize("version", [6, 7])
def test_every_demo_row_over_websocket_with_a_live_agent(live_stack: PluginStack, version: int) -> None:
    names = list(SCENARIOS)
    runs = [{"version": version, "api": ws_url(live_stack), "transport": "ws", "steps": SCENARIOS[n]} for n in names]
    check_rows(dict(zip(names, run_chats(runs, timeout=40))))
    assert metric_value(live_stack.gateway.base, "adk_gateway_plugin_requests_total", {"result": "run"}) >= 2


@pytest.mark.js
def test_sse_transport_with_a_live_agent(live_stack: PluginStack) -> None:
    api = f"{live_stack.gateway.base}/api/chat"
    runs = [
        {"version": 6, "api": api, "steps": [{"send": "pay 50 to Hanako", "approvals": "approve"}]},
        {"version": 7, "api": api, "steps": [{"send": "hello there"}, {"send": "weather in Tokyo"}]},
    ]
    for result in run_chats(runs, timeout=40):
        assert_clean(result)
        assert result["status"] == "ready"


def test_interrupted_turn_ends_with_the_right_reason(live_stack: PluginStack) -> None:
    gw = live_stack.gateway
    v6 = post(gw, new_chat(), [user("interrupt me")])
    assert v6.chunks[-1]["finishReason"] == "other"
    v7 = post(gw, new_chat(), [user("interrupt me")], aiSdkVersion=7)
    assert v7.chunks[-1]["finishReason"] == "interrupted"
    assert "text-delta" in types(v7)


async def test_audio_round_trip_and_socket_close_ends_the_live_session(live_stack: PluginStack) -> None:
    gw = live_stack.gateway.base
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
    # The browser socket closed: the gateway closes the chat's live session with ADK. (Chats
    # driven over SSE keep theirs until chat.idle_chat_ttl, as there is no socket to watch.)
    for _ in range(50):
        if metric_value(gw, "adk_gateway_live_sessions") == open_sessions - 1:
            break
        await asyncio.sleep(0.1)
    assert metric_value(gw, "adk_gateway_live_sessions") == open_sessions - 1

"""Stock AI SDK Chats over the WebSocket transport: ai 7's WebSocketChatTransport and, for ai 6,
the module the gateway ships (gateway/static/ws-transport.js), against the real ADK server."""

from __future__ import annotations

import pytest

from tests.demo_rows import SCENARIOS, check_rows, said, tool_states
from tests.jsdriver import assert_clean, run_chats
from tests.procs import PluginStack, metric_value, request

pytestmark = [pytest.mark.integration, pytest.mark.js]

@pytest.mark.parametrize("version", [6, 7])
def test_every_demo_row_over_websocket(stack: PluginStack, version: int) -> None:
    ws_url = stack.gateway.base.replace("http", "ws") + "/api/chat/ws"
    names = list(SCENARIOS)
    runs = [{"version": version, "api": ws_url, "transport": "ws", "steps": SCENARIOS[n]} for n in names]
    check_rows(dict(zip(names, run_chats(runs, timeout=40))))
    assert metric_value(stack.gateway.base, "adk_gateway_ws_frames_total", {"direction": "in", "type": "send"}) >= len(names)


@pytest.mark.parametrize("version", [6, 7])
def test_resume_after_a_dropped_socket_and_abort(stack: PluginStack, version: int) -> None:
    ws_url = stack.gateway.base.replace("http", "ws") + "/api/chat/ws"
    runs = [
        {"version": version, "api": ws_url, "transport": "ws",
         "steps": [{"send": "hello there, this is a longer message", "dropSocketAfterChunks": 3}]},
        {"version": version, "api": ws_url, "transport": "ws",
         "steps": [{"send": "pay 50 to Hanako", "approvals": "approve", "dropSocketAfterChunks": 2}]},
    ]
    dropped, approval = run_chats(runs, timeout=40)
    for result in (dropped, approval):
        assert_clean(result)
        assert [m["role"] for m in result["messages"]] == ["user", "assistant"]
    assert "longer message" in said(dropped)
    assert tool_states(approval) == ["output-available"]


def test_ai6_transport_module_is_served(stack: PluginStack) -> None:
    reply = request(stack.gateway.base, "GET", "/static/ws-transport.js")
    assert reply.status == 200
    assert reply.headers["content-type"].startswith(("text/javascript", "application/javascript"))
    assert b"export class WebSocketChatTransport" in reply.body

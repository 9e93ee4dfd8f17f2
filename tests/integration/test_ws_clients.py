"""Stock AI SDK Chats over the WebSocket transport: ai 7's WebSocketChatTransport and, for ai 6,
the module the gateway ships (gateway/static/ws-transport.js), against the real ADK server: resumes
after a dropped socket, and the module served. Every demo row over WebSocket runs with each client in
tests/integration/test_confirm_mode.py (and on a live agent, test_live_mode.py)."""

from __future__ import annotations

import json
import re

import pytest

from tests.demo_rows import said, tool_states
from tests.jsdriver import assert_clean, run_chats
from tests.procs import GatewayProcess, PluginStack, request

pytestmark = [pytest.mark.integration, pytest.mark.js]

@pytest.mark.parametrize("version", [6, 7])
def test_resume_after_a_dropped_socket_and_abort(lifecycle_stack: PluginStack, version: int) -> None:
    ws_url = lifecycle_stack.gateway.base.replace("http", "ws") + "/api/chat/ws"
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


def _shape(result: dict, version: int) -> list[dict]:
    """The assistant message, with what differs between two runs of the same turn masked: ids, and
    for ai 6 the approval's answer, which no ai 6 chunk can carry in a replay (docs/protocol.md)."""
    message = next(m for m in result["messages"] if m["role"] == "assistant")
    parts = json.loads(re.sub(r"(msg|adk|gw|txn)-[\w-]+", r"\1-*", json.dumps(message["parts"])))
    if version == 6:
        for part in parts:
            if "approval" in part:
                part["approval"] = {"id": part["approval"]["id"]}
    return parts


@pytest.mark.parametrize("version", [6, 7])
def test_a_socket_dropped_in_the_reply_after_an_approval_resumes_into_the_whole_message(lifecycle_stack: PluginStack, version: int) -> None:
    """Issue 24, defect 11: the resume replayed the continuation alone, whose first chunk is the output
    of the call made in the first response; the stock Chat failed ("No tool invocation found")."""
    ws_url = lifecycle_stack.gateway.base.replace("http", "ws") + f"/api/chat/ws?aiSdkVersion={version}"
    runs = [
        {"version": version, "api": ws_url, "transport": "ws", "steps": [{"send": "pay 50 to Hanako", "approvals": "approve"}]},
        {"version": version, "api": ws_url, "transport": "ws",
         "steps": [{"send": "pay 50 to Hanako", "approvals": "approve", "dropContinuationAfterChunks": 2}]},
    ]
    unbroken, resumed = run_chats(runs, timeout=40)
    for result in (unbroken, resumed):
        assert_clean(result)
        assert [m["role"] for m in result["messages"]] == ["user", "assistant"]
    kinds = [(r["type"], r["dropped"], r["terminal"]) for r in resumed["requests"]]
    assert kinds == [("send", False, "end"), ("send", True, None), ("resume", False, "end")], kinds
    assert tool_states(resumed) == ["output-available"] and "Hanako" in said(resumed)
    assert _shape(resumed, version) == _shape(unbroken, version)


def test_ai6_transport_module_is_served(gateway: GatewayProcess) -> None:
    reply = request(gateway.base, "GET", "/static/ws-transport.js")
    assert reply.status == 200
    assert reply.headers["content-type"].startswith(("text/javascript", "application/javascript"))
    assert b"export class WebSocketChatTransport" in reply.body

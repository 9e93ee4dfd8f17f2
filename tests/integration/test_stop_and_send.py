"""Stop, then the next message, as a person does it with a stock AI SDK Chat (issue 24, defect 10).

`chat.stop()` mid-reply (SSE: the fetch is aborted and the run goes on, `chat.on_disconnect:
continue`; WebSocket: an `abort` frame), then the next message in the same chat at once: the
gateway takes it and streams it whole, where it answered 409 `chat_busy` until the abandoned run
ended and the Chat showed an error.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.demo.script import echo_text
from tests.chatflow import new_chat, post, user
from tests.jsdriver import assert_clean, run_chats
from tests.integration.conftest import STORES, SharedAgents, plugin_agent
from tests.ops.stack import Replicas, replicas
from tests.procs import GatewayProcess, PluginStack, plugin_stack

pytestmark = pytest.mark.integration


# Each upstream mode on each of ADK's session stores; one fixture, so that one gateway at a time
# stands in front of each shared agent (its plugin calls that gateway's internal listener). `/run_sse`
# on ADK's in-memory store, where only the gateway's side is at stake, is a scenario
# (tests/scenarios/test_stop_and_send.py, on the recordings of every supported ADK).
ROWS = [(mode, store) for mode in ("sse", "live") for store in STORES if (mode, store) != ("sse", "memory")]


@pytest.fixture(scope="module", params=ROWS, ids="-".join)
def slow_stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, shared_agents: SharedAgents
) -> Iterator[PluginStack]:
    # Chunks 0.1 s apart: the reply is still streaming when the driver stops it. Over `/run_sse` ADK
    # writes the stopped run's end after the cut, and its database store refuses a write from a run
    # whose session went stale; over `/run_live` the stopped turn goes on in ADK's live session.
    mode, store = request.param
    agent = plugin_agent(shared_agents, chunk_delay="0.1", store=store)
    with plugin_stack(tmp_path_factory.mktemp("stop"), agent=agent, upstream_mode=mode) as stack:
        yield stack


@pytest.mark.js
def test_stop_then_a_new_message_streams_whole_over_sse_and_websocket(slow_stack: PluginStack) -> None:
    """The next reply is the new message's own (not the rest of the stopped one, in live mode),
    whole, and ends with `finish`, over SSE and over WebSocket."""
    check_stop_then_send(slow_stack)


def check_stop_then_send(stack: PluginStack) -> None:
    base = stack.gateway.base
    ws_url = base.replace("http", "ws") + "/api/chat/ws"
    steps = [
        {"send": "hello there, this is a much longer message to echo back slowly", "abortAfterChunks": 4},
        {"send": "hello again"},
    ]
    runs = [
        {"version": 6, "api": base + "/api/chat", "steps": steps},
        {"version": 7, "api": base + "/api/chat", "steps": steps},
        {"version": 7, "api": ws_url, "transport": "ws", "steps": steps},
    ]
    for result in run_chats(runs, timeout=40):
        where = (result["version"], result["transport"])
        assert_clean(result)
        assert result["status"] == "ready", where
        assert [m["role"] for m in result["messages"]] == ["user", "assistant", "user", "assistant"], where
        last = "".join(p.get("text", "") for p in result["messages"][-1]["parts"])
        assert "hello again" in last, (where, last)
        assert "slowly" not in last, (where, last)  # not the rest of the stopped reply
        first = "".join(p.get("text", "") for p in result["messages"][1]["parts"])
        # Stopped mid-reply: a part of the whole reply only (how much depends on how fast the
        # driver's abort lands on a loaded machine, so no fixed word is asserted absent).
        whole = echo_text(steps[0]["send"])
        assert whole.startswith(first) and len(first) < len(whole), (where, first)
        second = [chunk["type"] for index, chunk in result["chunks"] if index == len(result["requests"]) - 1]
        assert second[-1] == "finish", (where, second)
        if result["transport"] == "sse":
            assert [r["status"] for r in result["requests"]] == [200, 200], (where, result["requests"])


@pytest.fixture(scope="module")
def slow_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    with replicas(tmp_path_factory.mktemp("stop-replicas"), adk_env={"DEMO_CHUNK_DELAY": "0.1"}) as r:
        yield r


def stopped(gw: GatewayProcess, chat: str, messages: list[dict[str, Any]]) -> None:
    """A POST whose browser stops reading after the first bytes (the AI SDK's stop())."""
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
    body = {"id": chat, "messages": messages, "trigger": "submit-message"}
    conn.request("POST", "/api/chat", body=json.dumps(body), headers={"Content-Type": "application/json"})
    reply = conn.getresponse()
    assert reply.status == 200
    reply.read1(64)
    conn.close()


@pytest.mark.parametrize("next_on", ["b", "a"])
def test_stop_then_a_new_message_for_a_chat_run_on_another_replica(slow_pair: Replicas, next_on: str) -> None:
    """The chat runs on A; the stopped response was relayed to the browser through B. The next
    message, on B (which held the relay) or on A (the owner, told by B), is taken."""
    chat, first = new_chat(), user("hello there")
    assert post(slow_pair.a, chat, [first]).status == 200
    long = user("hello there, this is a much longer message to echo back slowly")
    stopped(slow_pair.b, chat, [first, long])
    again = user("hello again")
    reply = post(getattr(slow_pair, next_on), chat, [first, long, again])
    assert reply.status == 200, reply.body
    assert reply.payloads[-1] == "[DONE]" and reply.chunks[-1]["type"] == "finish"
    assert "hello again" in "".join(c.get("delta", "") for c in reply.chunks)

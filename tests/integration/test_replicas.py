"""Two gateway replicas sharing chats through a real redis-server, in front of one real ADK server.

The topology of deploy/compose.yaml in miniature (tests/ops/stack.py): replicas A and B with
`sessions.backend: redis`, the stock ADK API server with the gateway plugin, and the plugin's gate
requests going to B's internal listener (behind a load balancer they may land on any replica; B is
the interesting one for chats that run on A). Requests are sent to A or B by hand, as a round-robin
balancer might. This file covers the healthy paths between replicas; what happens when a replica,
Redis or ADK fails is the operations fault suite's (tests/ops/test_failure_modes.py).
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.chatflow import assistant_from, new_chat, post, types, user
from tests.jsdriver import check_streams
from tests.ops.stack import Replicas, payment_responses, replicas
from tests.procs import GatewayProcess, metric_value, request

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    # `/run_sse`'s confirmations; the plugin's held requests forwarded between replicas are a live
    # upstream's (tests/ops/test_handover.py, tests/ops/test_failure_modes.py).
    with replicas(tmp_path_factory.mktemp("replicas")) as r:
        yield r


def text(reply: Any) -> str:
    return "".join(c["delta"] for c in reply.chunks if c["type"] == "text-delta")


def schema_clean(*replies: Any) -> None:
    """Each reply passes ai 6's own chunk schema and message assembly, each continuing the last."""
    message = None
    for reply in replies:
        case: dict[str, Any] = {"version": 6, "chunks": reply.chunks}
        if message is not None and reply.chunks[0].get("messageId") == message["id"]:
            case["message"] = message
        [result] = check_streams([case])
        assert not result["schemaErrors"] and not result["streamError"], result
        message = result["message"]


def start_payment(gw: GatewayProcess) -> tuple[str, dict[str, Any], Any]:
    chat, first_message = new_chat(), user("pay 50 to Hanako")
    first = post(gw, chat, [first_message])
    assert first.status == 200, first.body
    assert types(first)[-3:] == ["tool-approval-request", "finish-step", "finish"], types(first)
    return chat, first_message, first


def test_chat_started_on_a_is_approved_and_read_through_b(pair: Replicas) -> None:
    forwarded_before = metric_value(pair.b.base, "adk_gateway_forwarded_total", {"direction": "out"})
    chat, first_message, first = start_payment(pair.a)
    answer = assistant_from(first, [True])
    second = post(pair.b, chat, [first_message, answer], messageId=answer["id"])
    assert second.status == 200, second.body
    assert second.chunks[0] == {"type": "start", "messageId": answer["id"]}
    assert second.chunks[1]["type"] == "tool-output-available" and second.chunks[1]["output"]["success"] is True
    assert "Hanako" in text(second) and second.chunks[-1]["finishReason"] == "stop"
    schema_clean(first, second)
    # B forwarded the answer (and what the plugin asked) to A, which ran the tool exactly once.
    assert metric_value(pair.b.base, "adk_gateway_forwarded_total", {"direction": "out"}) >= forwarded_before + 2
    assert metric_value(pair.a.base, "adk_gateway_forwarded_total", {"direction": "in"}) >= 2
    # ADK's placeholder while the confirmation waited, then the one result.
    placeholder, paid = payment_responses(pair.adk, chat)
    assert "requires confirmation" in placeholder["error"] and paid["success"] is True, (placeholder, paid)
    assert len(pair.ledger.of(chat)) == 1  # the agent's own count of real executions
    # A replayed answer through either replica changes nothing.
    for gw in (pair.a, pair.b):
        replay = post(gw, chat, [first_message, answer], messageId=answer["id"])
        assert replay.status == 410 and replay.json()["error"]["code"] == "approval_gone", replay.body
    assert len(payment_responses(pair.adk, chat)) == 2 and len(pair.ledger.of(chat)) == 1


def test_resume_on_b_after_the_stream_on_a_dropped(pair: Replicas) -> None:
    chat, first_message = new_chat(), user("what is the weather in Tokyo")
    conn = http.client.HTTPConnection("127.0.0.1", pair.a.port, timeout=10)
    body = '{"id": "%s", "messages": [%s], "trigger": "submit-message"}' % (chat, json.dumps(first_message))
    conn.request("POST", "/api/chat", body=body, headers={"Content-Type": "application/json"})
    reply = conn.getresponse()
    assert reply.status == 200
    reply.read1(16)  # the first bytes, then the browser goes away
    conn.close()
    resumed = request(pair.b.base, "GET", f"/api/chat/{chat}/stream")
    assert resumed.status == 200, resumed.body
    assert resumed.chunks[0]["type"] == "start" and resumed.chunks[-1]["type"] == "finish"
    assert "tool-output-available" in types(resumed) and "Tokyo" in text(resumed)
    schema_clean(resumed)
    # WebSocket-style resume from B: the same response, from the sequence asked for.
    again = request(pair.b.base, "GET", f"/api/chat/{chat}/stream")
    assert again.chunks == resumed.chunks


def test_a_new_message_on_b_for_a_chat_on_a_is_forwarded(pair: Replicas) -> None:
    chat, first_message = new_chat(), user("hello there")
    first = post(pair.a, chat, [first_message])
    assert first.status == 200 and first.chunks[-1]["type"] == "finish"
    follow_up = user("what is the weather in Tokyo")
    second = post(pair.b, chat, [first_message, {"id": first.chunks[0]["messageId"], "role": "assistant", "parts": [{"type": "text", "text": text(first)}]}, follow_up])
    assert second.status == 200, second.body
    assert "Tokyo" in text(second)
    schema_clean(first, second)


def test_websocket_requests_for_a_chat_on_a_through_b(pair: Replicas) -> None:
    """A stock-shaped WebSocket client: the turn on A, the approval and a resume on B."""
    import asyncio

    import aiohttp

    async def exchange(base: str, frame: dict[str, Any]) -> list[dict[str, Any]]:
        async with aiohttp.ClientSession() as session, session.ws_connect(base.replace("http", "ws") + "/api/chat/ws") as ws:
            await ws.send_json(frame)
            frames = []
            async for msg in ws:
                frames.append(json.loads(msg.data))
                if frames[-1]["type"] in ("end", "error", "no-active"):
                    return frames
        raise AssertionError(f"socket closed early: {frames}")

    chat, first_message = new_chat(), user("pay 50 to Hanako")
    send = {"type": "send", "requestId": "r1", "id": chat, "messages": [first_message], "trigger": "submit-message"}
    first = asyncio.run(exchange(pair.a.base, send))
    chunks = [f["chunk"] for f in first if f["type"] == "chunk"]
    assert [f["sequence"] for f in first if f["type"] == "chunk"] == list(range(len(chunks)))
    assert chunks[-3]["type"] == "tool-approval-request" and first[-1]["type"] == "end"

    class _Reply:  # what assistant_from reads
        def __init__(self, chunks: list[dict[str, Any]]) -> None:
            self.chunks = chunks

    answer = assistant_from(_Reply(chunks), [True])
    second = asyncio.run(exchange(pair.b.base, {
        "type": "send", "requestId": "r2", "id": chat, "messages": [first_message, answer], "trigger": "submit-message",
        "messageId": answer["id"],
    }))
    relayed = [f["chunk"] for f in second if f["type"] == "chunk"]
    assert [f["sequence"] for f in second if f["type"] == "chunk"] == list(range(len(relayed)))
    assert relayed[1]["type"] == "tool-output-available" and relayed[1]["output"]["success"] is True
    assert second[-1]["type"] == "end"
    # Resume through B: the whole message, relayed from A (the first response, its finish now only its
    # metadata, then the continuation), numbered over it; from a sequence, the rest of that numbering.
    whole = [*chunks[:-1], {"type": "message-metadata", "messageMetadata": chunks[-1].get("messageMetadata")}, *relayed]
    replayed = asyncio.run(exchange(pair.b.base, {"type": "resume", "requestId": "r3", "id": chat}))
    assert replayed[0]["type"] == "start"
    assert [(f["sequence"], f["chunk"]) for f in replayed if f["type"] == "chunk"] == list(enumerate(whole))
    resumed = asyncio.run(exchange(pair.b.base, {"type": "resume", "requestId": "r4", "id": chat, "lastSequence": 2}))
    assert resumed[0]["type"] == "start"
    rest = [f for f in resumed if f["type"] == "chunk"]
    assert [f["sequence"] for f in rest] == list(range(3, len(whole)))
    assert [f["chunk"] for f in rest] == whole[3:]

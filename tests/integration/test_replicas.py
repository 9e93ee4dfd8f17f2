"""Two gateway replicas sharing chats through a real redis-server, in front of one real ADK server.

The topology of deploy/compose.yaml in miniature: replicas A and B with `sessions.backend: redis`,
the stock ADK API server with the gateway plugin, and the plugin's gate requests going to B's
internal listener (behind a load balancer they may land on any replica; B is the interesting one
for chats that run on A). Requests are sent to A or B by hand, as a round-robin balancer might.
"""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.chatflow import assistant_from, new_chat, post, types, user
from tests.jsdriver import check_streams
from tests.procs import (
    DEMO_TOOLS, PLUGIN, GatewayProcess, RedisServer, adk_server, free_port, gateway_process, metric_value, redis_server, request,
)

pytestmark = pytest.mark.integration

HEARTBEAT = "200ms"
OWNER_TIMEOUT = "800ms"


@dataclass
class Replicas:
    a: GatewayProcess
    b: GatewayProcess
    redis: RedisServer
    adk: str


@contextmanager
def replicas(tmp: Path) -> Iterator[Replicas]:
    secret = "test-secret-" + os.urandom(6).hex()
    internal = {"a": free_port(), "b": free_port()}
    with ExitStack() as stack:
        redis = stack.enter_context(redis_server(tmp))
        adk = stack.enter_context(adk_server(
            tmp, extra_plugins=(PLUGIN,),
            env={"ADK_GATEWAY_URL": f"http://127.0.0.1:{internal['b']}", "ADK_GATEWAY_SECRET": secret},
        ))

        def config(name: str) -> str:
            return (
                DEMO_TOOLS.format(payment_timeout="5m", on_timeout="deny")
                + f"internal:\n  port: {internal[name]}\n  secret: {secret}\n  policy_refresh: 1s\n"
                + f"sessions:\n  backend: redis\n  redis_url: {redis.url}\n  key_prefix: gw-test\n"
                + f"  heartbeat_interval: {HEARTBEAT}\n  owner_timeout: {OWNER_TIMEOUT}\n  forward_timeout: 5s\n"
                # Keep-alives rarer than the test client's 30 s read timeout: a stalled stream
                # fails the test instead of hanging it.
                + "chat:\n  keepalive_interval: 60s\n"
            )

        a = stack.enter_context(gateway_process(tmp, adk, config("a")))
        b = stack.enter_context(gateway_process(tmp, adk, config("b")))
        for gw in (a, b):
            wait_ready(gw)
        yield Replicas(a, b, redis, adk)


def wait_ready(gw: GatewayProcess, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while request(gw.base, "GET", "/readyz").status != 200:
        assert time.monotonic() < deadline, f"{gw.base} not ready: {request(gw.base, 'GET', '/readyz').body!r}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
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


def adk_events(adk: str, chat: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{adk}/apps/demo_agent/users/anonymous/sessions/{chat}", timeout=10) as reply:
        return json.loads(reply.read())["events"]


def payment_responses(adk: str, chat: str) -> list[dict[str, Any]]:
    out = []
    for event in adk_events(adk, chat):
        for part in (event.get("content") or {}).get("parts") or []:
            response = part.get("functionResponse") or part.get("function_response")
            if response and response.get("name") == "process_payment":
                out.append(response["response"])
    return out


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
    # B forwarded the plugin's gate and the answer to A, which ran the tool exactly once.
    assert metric_value(pair.b.base, "adk_gateway_forwarded_total", {"direction": "out"}) >= forwarded_before + 2
    assert metric_value(pair.a.base, "adk_gateway_forwarded_total", {"direction": "in"}) >= 2
    assert [r.get("success") for r in payment_responses(pair.adk, chat)] == [True]
    # A replayed answer through either replica changes nothing.
    for gw in (pair.a, pair.b):
        replay = post(gw, chat, [first_message, answer], messageId=answer["id"])
        assert replay.status == 410 and replay.json()["error"]["code"] == "approval_gone", replay.body
    assert len(payment_responses(pair.adk, chat)) == 1


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


# ---- failures: a replica dies, Redis goes away ------------------------------------------------


def test_kill_a_while_a_call_waits(tmp_path: Path) -> None:
    with replicas(tmp_path) as r:
        lost_before = metric_value(r.b.base, "adk_gateway_owner_lost_total", {"what": "gated_call"})
        chat, first_message, first = start_payment(r.a)
        r.a.proc.kill()
        r.a.proc.wait()
        # The plugin's request (held by B, waiting on A) is released fail-closed: the tool does not run.
        deadline = time.monotonic() + 15
        while metric_value(r.b.base, "adk_gateway_owner_lost_total", {"what": "gated_call"}) < lost_before + 1:
            assert time.monotonic() < deadline, "B never released the call A held"
            time.sleep(0.1)
        deadline = time.monotonic() + 15
        while not payment_responses(r.adk, chat):
            assert time.monotonic() < deadline, "ADK never got an answer for the call"
            time.sleep(0.1)
        [response] = payment_responses(r.adk, chat)
        assert "error" in response and "success" not in response, response
        # The browser's answer, now landing on B, gets a clear error rather than a hang.
        answer = assistant_from(first, [True])
        reply = post(r.b, chat, [first_message, answer], messageId=answer["id"])
        assert reply.status == 410, reply.body
        assert reply.json()["error"]["code"] == "approval_gone" and "stopped" in reply.json()["error"]["message"]
        # ... and the chat goes on on B.
        again = post(r.b, chat, [first_message, answer, user("hello there")])
        assert again.status == 200 and again.chunks[-1]["type"] == "finish" and text(again)
        assert len(payment_responses(r.adk, chat)) == 1  # nothing ran


def test_kill_a_mid_stream_and_resume_on_b(tmp_path: Path) -> None:
    with replicas(tmp_path) as r:
        chat, first_message, first = start_payment(r.a)
        r.a.proc.kill()
        r.a.proc.wait()
        time.sleep(1.2)  # > owner_timeout
        resumed = request(r.b.base, "GET", f"/api/chat/{chat}/stream")
        assert resumed.status == 410 and resumed.json()["error"]["code"] == "run_lost", resumed.body
        assert metric_value(r.b.base, "adk_gateway_owner_lost_total", {"what": "run"}) >= 1
        assert request(r.b.base, "GET", f"/api/chat/{chat}/stream").status == 204  # said once


def test_redis_restart_mid_run(tmp_path: Path) -> None:
    with replicas(tmp_path) as r:
        chat, first_message, first = start_payment(r.a)
        r.redis.stop()
        deadline = time.monotonic() + 10
        for gw in (r.a, r.b):
            while request(gw.base, "GET", "/readyz").json()["status"] != "sessions_unavailable":
                assert time.monotonic() < deadline, "readyz never reported Redis down"
                time.sleep(0.05)
        assert metric_value(r.b.base, "adk_gateway_sessions_backend_up") == 0
        answer = assistant_from(first, [True])
        refused = post(r.b, chat, [first_message, answer], messageId=answer["id"])
        assert refused.status == 503 and refused.json()["error"]["code"] == "sessions_unavailable", refused.body
        assert refused.headers.get("retry-after")
        r.redis.start()  # back, and empty
        for gw in (r.a, r.b):
            wait_ready(gw)
        deadline = time.monotonic() + 10
        while True:
            second = post(r.b, chat, [first_message, answer], messageId=answer["id"])
            if second.status != 503:
                break
            assert time.monotonic() < deadline, second.body  # settling after the reset: retry
            time.sleep(0.2)
        assert second.status == 200, second.body
        assert second.chunks[1]["type"] == "tool-output-available" and second.chunks[1]["output"]["success"] is True
        assert [x.get("success") for x in payment_responses(r.adk, chat)] == [True]


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
    # Resume through B from a sequence: the rest of the response, numbered as the first time.
    resumed = asyncio.run(exchange(pair.b.base, {"type": "resume", "requestId": "r3", "id": chat, "lastSequence": 2}))
    assert resumed[0]["type"] == "start"
    rest = [f for f in resumed if f["type"] == "chunk"]
    assert [f["sequence"] for f in rest] == list(range(3, len(relayed)))
    assert [f["chunk"] for f in rest] == relayed[3:]

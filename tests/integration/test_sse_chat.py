"""The gateway over HTTP in front of the real ADK API server running the demo agent.

What the gateway makes of ADK's turns (a server tool, native confirmations, ADK's errors, the
tokens counted) is played from recordings in tests/scenarios/test_native_turns.py; here, what needs
the process: the HTTP edge, the real server's sessions, logs and metrics as served."""

from __future__ import annotations

import http.client
import json
import threading
from pathlib import Path

import pytest

from tests.chatflow import assistant_from, new_chat, post, types, user
from tests.jsdriver import check_streams
from tests.procs import GatewayProcess, PluginStack, Reply, free_port, gateway_process, metric_value, request

pytestmark = pytest.mark.integration


def test_plain_text(gateway: GatewayProcess) -> None:
    reply = post(gateway, new_chat(), [user("hello there")])
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    assert reply.headers["x-vercel-ai-ui-message-stream"] == "v1"
    assert reply.payloads[-1] == "[DONE]"
    assert types(reply)[:3] == ["start", "start-step", "text-start"]
    assert types(reply)[-1] == "finish"
    text = "".join(c["delta"] for c in reply.chunks if c["type"] == "text-delta")
    assert '"hello there"' in text
    assert types(reply).count("text-delta") >= 3


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"{oops", "not valid JSON"),
        (json.dumps({"messages": []}).encode(), "id"),
        (json.dumps({"id": "c1", "messages": [{"id": "u", "role": "user", "parts": [{"type": "text", "text": 1}]}]}).encode(), "messages[0].parts[0].text"),
        (json.dumps({"id": "c1", "messages": [{"id": "a", "role": "assistant", "parts": []}]}).encode(), "answer an approval"),
    ],
)
def test_malformed_requests_get_400_json_and_the_chat_stays_usable(gateway: GatewayProcess, body: bytes, needle: str) -> None:
    reply = request(gateway.base, "POST", "/api/chat", body)
    assert reply.status == 400
    error = reply.json()["error"]
    assert error["code"] == "invalid_request" and needle in error["message"]
    assert post(gateway, "c1", [user("hello there")]).status == 200


def test_oversized_body_is_413_json(gateway: GatewayProcess) -> None:
    reply = request(gateway.base, "POST", "/api/chat", b'{"id": "c", "pad": "' + b"x" * (5 * 1024 * 1024) + b'"}')
    assert reply.status == 413
    assert reply.json()["error"]["code"]


def test_concurrent_requests_for_one_chat_are_not_interleaved(lifecycle_stack: PluginStack) -> None:
    gateway = lifecycle_stack.gateway  # on each of ADK's session stores
    chat = new_chat()
    post(gateway, chat, [user("hello there")])  # the ADK session exists, so both reach admission at once
    replies: list[Reply] = []
    barrier = threading.Barrier(4)

    def send() -> None:
        barrier.wait()
        replies.append(post(gateway, chat, [user("hello there")]))

    threads = [threading.Thread(target=send) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    statuses = sorted(r.status for r in replies)
    assert statuses[0] == 200
    assert set(statuses) <= {200, 409}
    for reply in replies:
        if reply.status == 409:
            assert reply.json()["error"]["code"] == "chat_busy" and reply.headers["retry-after"]
        else:
            assert reply.payloads[-1] == "[DONE]"


def test_resume_without_an_active_stream_is_204(gateway: GatewayProcess) -> None:
    assert request(gateway.base, "GET", f"/api/chat/{new_chat()}/stream").status == 204
    assert request(gateway.base, "GET", "/api/chat/bad%2Fid/stream").status == 404


def test_a_resume_after_a_native_approval_cut_in_its_continuation_replays_the_whole_message(lifecycle_stack: PluginStack) -> None:
    """Issue 24, defect 11: the resume replayed the continuation alone, which the AI SDK, rebuilding the
    message from the stream's `start`, could not reduce ("No tool invocation found"). Here the answer
    starts a new ADK run (native confirmation, asked by the plugin), which continues the same message;
    on each of ADK's session stores."""
    gateway = lifecycle_stack.gateway
    chat, first_message = new_chat(), user("pay 50 to Hanako")
    first = post(gateway, chat, [first_message])
    assert types(first)[-3:] == ["tool-approval-request", "finish-step", "finish"], types(first)
    answer = assistant_from(first, [True])
    body = json.dumps({"id": chat, "messages": [first_message, answer], "trigger": "submit-message", "messageId": answer["id"]})
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
    conn.request("POST", "/api/chat", body=body, headers={"Content-Type": "application/json"})
    cut = conn.getresponse()
    assert cut.status == 200
    cut.read1(16)  # the first bytes of the continuation, then the connection drops
    conn.close()
    resumed = request(gateway.base, "GET", f"/api/chat/{chat}/stream")
    assert resumed.status == 200, resumed.body
    boundary = {"type": "message-metadata", "messageMetadata": first.chunks[-1].get("messageMetadata")}
    n = len(first.chunks)
    assert resumed.chunks[:n] == [*first.chunks[:-1], boundary]
    assert resumed.chunks[n] == {"type": "start", "messageId": answer["id"]}
    assert resumed.chunks[n + 1]["type"] == "tool-output-available"
    assert types(resumed).count("finish") == 1 and resumed.chunks[-1]["finishReason"] == "stop"
    assert resumed.payloads[-1] == "[DONE]"
    # The SDK's parser and reducer, from nothing as a resumed Chat starts: the whole message.
    [result] = check_streams([{"version": 6, "chunks": resumed.chunks}])
    assert result["schemaErrors"] == [] and result["streamError"] is None, result
    [tool] = [p for p in result["message"]["parts"] if p["type"] == "tool-process_payment"]
    assert tool["state"] == "output-available" and tool["output"]["success"] is True
    assert "Hanako" in "".join(p.get("text", "") for p in result["message"]["parts"])


def test_health_ready_metrics_and_json_404(gateway: GatewayProcess) -> None:
    assert request(gateway.base, "GET", "/healthz").json() == {"status": "ok"}
    assert request(gateway.base, "GET", "/readyz").json() == {"status": "ready", "agents": {"demo_agent": "up"}}
    missing = request(gateway.base, "GET", "/nope")
    assert missing.status == 404 and missing.json()["error"]["code"] == "not_found"
    wrong = request(gateway.base, "GET", "/api/chat")
    assert wrong.status == 405 and "POST" in wrong.headers["allow"]
    text = request(gateway.base, "GET", "/metrics").body.decode()
    for name in (
        "adk_gateway_http_requests_total", "adk_gateway_active_streams", "adk_gateway_chunks_total",
        "adk_gateway_upstream_errors_total", "adk_gateway_upstream_first_event_seconds",
        "adk_gateway_approvals_pending", "adk_gateway_approval_wait_seconds", "adk_gateway_upstream_up",
        "adk_gateway_gc_pause_seconds",
    ):
        assert f"# TYPE {name}" in text, name
    # The served process times its collector's pauses. A turn leaves only a few hundred objects
    # behind (young collections count survivors, every 10,000: edge/server.py), so it takes some chats
    # for one to happen.
    for _ in range(400):
        young = metric_value(gateway.base, "adk_gateway_gc_pause_seconds_count", {"generation": "0"})
        if young:
            break
        post(gateway, new_chat(), [user("hello there")])
    assert young >= 1


def test_logs_are_json_with_ids_bound_and_no_tracebacks(gateway: GatewayProcess) -> None:
    chat = new_chat()
    post(gateway, chat, [user("hello there")], )
    lines = [line for line in gateway.log_lines() if line.get("chat_id") == chat]
    assert any(line.get("event") == "run_finished" for line in lines)
    finished = next(line for line in lines if line.get("event") == "run_finished")
    assert finished["session_id"] == chat and finished["request_id"] and finished["message_id"]
    assert "Traceback" not in gateway.log_text()


def test_upstream_down(tmp: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with gateway_process(tmp, dead) as gw:
        reply = post(gw, new_chat(), [user("hello there")])
        assert reply.status == 502
        assert reply.json()["error"]["code"] == "upstream_unavailable"
        ready = request(gw.base, "GET", "/readyz")
        assert ready.status == 503 and ready.json()["status"] == "upstream_unreachable"
        assert metric_value(gw.base, "adk_gateway_upstream_errors_total", {"kind": "connect"}) >= 1

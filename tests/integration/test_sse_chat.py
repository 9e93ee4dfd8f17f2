"""The gateway over HTTP in front of the real ADK API server running the demo agent."""

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


def test_server_tool(gateway: GatewayProcess) -> None:
    reply = post(gateway, new_chat(), [user("weather in Tokyo")])
    chunks = reply.chunks
    call = next(c for c in chunks if c["type"] == "tool-input-available")
    assert call["toolName"] == "get_weather" and call["input"] == {"city": "Tokyo"}
    output = next(c for c in chunks if c["type"] == "tool-output-available")
    assert output["toolCallId"] == call["toolCallId"]
    assert "Tokyo" in "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
    assert chunks[-1]["finishReason"] == "stop"


@pytest.mark.parametrize("approved", [True, False])
def test_native_approval_round_trip(gateway: GatewayProcess, approved: bool) -> None:
    chat, first_message = new_chat(), user("pay 50 to Hanako")
    outcome = "approved" if approved else "denied"
    before = metric_value(gateway.base, "adk_gateway_approval_wait_seconds_count", {"tool": "process_payment", "outcome": outcome})
    first = post(gateway, chat, [first_message])
    assert types(first) == [
        "start", "start-step", "tool-input-start", "tool-input-available", "tool-approval-request", "finish-step", "finish",
    ]
    assert first.chunks[-1]["finishReason"] == "tool-calls"
    assert "requires confirmation" not in first.body.decode()

    answer = assistant_from(first, [approved])
    second = post(gateway, chat, [first_message, answer], messageId=answer["id"])
    chunks = second.chunks
    assert chunks[0] == {"type": "start", "messageId": answer["id"]}
    call_id = answer["parts"][1]["toolCallId"]
    if approved:
        assert chunks[1]["type"] == "tool-output-available" and chunks[1]["toolCallId"] == call_id
        assert chunks[1]["output"]["success"] is True
        assert "Hanako" in "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
    else:
        assert chunks[1] == {"type": "tool-output-denied", "toolCallId": call_id}
        assert "not made" in "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
    assert chunks[-1]["finishReason"] == "stop"
    after = metric_value(gateway.base, "adk_gateway_approval_wait_seconds_count", {"tool": "process_payment", "outcome": outcome})
    assert after == before + 1


def test_two_approvals_in_one_turn(gateway: GatewayProcess) -> None:
    chat, first_message = new_chat(), user("pay 10 to Alice and 20 to Bob")
    first = post(gateway, chat, [first_message])
    assert types(first).count("tool-approval-request") == 2
    answer = assistant_from(first, [True, False])
    second = post(gateway, chat, [first_message, answer], messageId=answer["id"])
    outputs = [(c["type"], c["toolCallId"]) for c in second.chunks if c["type"].startswith("tool-output")]
    calls = [p["toolCallId"] for p in answer["parts"][1:]]
    assert outputs == [("tool-output-available", calls[0]), ("tool-output-denied", calls[1])]
    text = "".join(c["delta"] for c in second.chunks if c["type"] == "text-delta")
    assert "Alice" in text and "Bob" in text


def test_typing_instead_of_answering_rejects_the_pending_call(gateway: GatewayProcess) -> None:
    chat, first_message = new_chat(), user("pay 50 to Hanako")
    before = metric_value(gateway.base, "adk_gateway_approval_wait_seconds_count", {"tool": "process_payment", "outcome": "cancelled"})
    first = post(gateway, chat, [first_message])
    pending = assistant_from(first)
    second = post(gateway, chat, [first_message, pending, user("hello again")])
    assert second.status == 200
    assert second.chunks[0]["messageId"] != pending["id"]
    assert '"hello again"' in "".join(c["delta"] for c in second.chunks if c["type"] == "text-delta")
    after = metric_value(gateway.base, "adk_gateway_approval_wait_seconds_count", {"tool": "process_payment", "outcome": "cancelled"})
    assert after == before + 1
    # The rejected call is settled in ADK: answering it now changes nothing (the payment never runs).
    late = post(gateway, chat, [first_message, assistant_from(first, [True])], messageId=pending["id"])
    assert "tool-output-available" not in types(late)


def test_adk_error_event_then_the_chat_still_works(gateway: GatewayProcess) -> None:
    chat = new_chat()
    reply = post(gateway, chat, [user("trigger error")])
    assert reply.status == 200
    assert types(reply) == ["start", "error", "finish"]
    assert reply.chunks[1]["errorText"].startswith("DEMO_ERROR")
    assert reply.chunks[-1]["finishReason"] == "error"
    again = post(gateway, chat, [user("trigger error"), user("hello there")])
    assert again.chunks[-1]["finishReason"] == "stop"


def test_crashing_run_gives_one_error_chunk(gateway: GatewayProcess) -> None:
    reply = post(gateway, new_chat(), [user("crash")])
    assert types(reply) == ["start", "error", "finish"]
    assert "Traceback" not in reply.body.decode()


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


def _tokens(base: str, kind: str, model: str = "demo-scripted") -> float:
    return metric_value(base, "adk_gateway_tokens_total", {"model": model, "kind": kind})


def test_tokens_and_time_to_first_token_are_counted_per_turn(adk_base: str, tmp_path: Path) -> None:
    # The scripted model reports 16 input tokens per LLM call and names itself "demo-scripted".
    with gateway_process(tmp_path, adk_base, "metrics:\n  models: [demo-scripted]\n") as gw:
        assert _tokens(gw.base, "input") == 0 and metric_value(gw.base, "adk_gateway_first_token_seconds_count") == 0
        chat = new_chat()
        first = post(gw, chat, [user("hello there")])
        metadata = first.chunks[-1]["messageMetadata"]
        assert metadata["model"] == "demo-scripted"
        assert _tokens(gw.base, "input") == 16 == metadata["usage"]["inputTokens"]
        assert _tokens(gw.base, "output") == metadata["usage"]["outputTokens"] > 0
        assert _tokens(gw.base, "total") == metadata["usage"]["totalTokens"]
        assert metric_value(gw.base, "adk_gateway_first_token_seconds_count") == 1
        # Two LLM calls (the tool call, then the text): each counted once.
        second = post(gw, new_chat(), [user("weather in Tokyo")])
        assert _tokens(gw.base, "input") == 16 + 32 == 16 + second.chunks[-1]["messageMetadata"]["usage"]["inputTokens"]
        assert metric_value(gw.base, "adk_gateway_first_token_seconds_count") == 2
        # Typing instead of answering: the payment's call (1), the model's answer to the rejection,
        # which ADK runs out of the browser's sight (1), and the new message's (1).
        pay = user("pay 50 to Hanako")
        first = post(gw, chat, [pay])
        assert _tokens(gw.base, "input") == 48 + 16
        assert metric_value(gw.base, "adk_gateway_first_token_seconds_count") == 2  # no words: not timed
        post(gw, chat, [pay, assistant_from(first), user("hello again")])
        assert _tokens(gw.base, "input") == 64 + 32
        assert metric_value(gw.base, "adk_gateway_first_token_seconds_count") == 3
        assert _tokens(gw.base, "input", "other") == 0

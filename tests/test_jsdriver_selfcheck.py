"""Self-check of the JS chat driver against a scripted SSE stub, for ai 6 and ai 7.

The stub plays the approval round trip from DESIGN.md section 2 so that a failure here points at the
driver (or an SDK upgrade), not at the gateway.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import parse_qs, urlparse

import pytest

from tests.jsdriver import assert_clean, run_chat, run_chats
from tests.procs import QuietHandler, serve_http

pytestmark = pytest.mark.js

TOOL_INPUT = {"amount": 50, "recipient": "Hanako", "currency": "USD"}


def first_turn(variant: str) -> list[dict]:
    if variant == "browser-tool":
        return [
            {"type": "start", "messageId": "m1"},
            {"type": "start-step"},
            {"type": "tool-input-available", "toolCallId": "c1", "toolName": "get_location", "input": {}},
            {"type": "finish-step"},
            {"type": "finish", "finishReason": "tool-calls"},
        ]
    return [
        {"type": "start", "messageId": "m1"},
        {"type": "start-step"},
        {"type": "tool-input-start", "toolCallId": "c1", "toolName": "process_payment"},
        {"type": "tool-input-available", "toolCallId": "c1", "toolName": "process_payment", "input": TOOL_INPUT},
        {"type": "tool-approval-request", "approvalId": "a1", "toolCallId": "c1"},
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "tool-calls"},
    ]


def continuation(variant: str, tool_part: dict) -> list[dict]:
    if tool_part["state"] == "output-available":  # a browser tool answered by onToolCall
        outcome = []
    elif tool_part.get("approval", {}).get("approved"):
        outcome = [{"type": "tool-output-available", "toolCallId": "c1", "output": {"success": True}}]
    else:
        outcome = [{"type": "tool-output-denied", "toolCallId": "c1"}]
    text = [{"type": "text-start", "id": "t1"}, {"type": "text-delta", "id": "t1", "delta": "Paid"}]
    if variant == "bad-delta":
        text = [{"type": "text-delta", "id": "t1", "delta": "Paid"}]
    elif variant == "bad-type":
        text.insert(1, {"type": "tool-progress", "toolCallId": "c1"})
    return [
        {"type": "start"} if variant == "no-id" else {"type": "start", "messageId": "m1"},
        {"type": "start-step"},
        *outcome,
        {"type": "finish-step"},
        {"type": "start-step"},
        *text,
        {"type": "text-end", "id": "t1"},
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "stop"},
    ]


class StubHandler(QuietHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        variant = parse_qs(urlparse(self.path).query).get("variant", [""])[0]
        last = body["messages"][-1]
        if last["role"] == "user":
            chunks = first_turn(variant)
        else:
            tool_part = next(p for p in last["parts"] if p.get("toolCallId") == "c1")
            chunks = continuation(variant, tool_part)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("x-vercel-ai-ui-message-stream", "v1")
        self.end_headers()
        self.wfile.write(b": keep-alive\n\n")
        for chunk in chunks:
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture(scope="module")
def stub() -> Iterator[str]:
    with serve_http(StubHandler) as base:
        yield f"{base}/api/chat"


# Loading the SDK dominates a run, so every scenario runs at once in a single node process.
SCENARIOS = {
    "approve": ("", [{"send": "pay 50 to Hanako", "approvals": ["approve"]}]),
    "deny": ("", [{"send": "pay 50 to Hanako", "approvals": "deny"}]),
    "no-id": ("no-id", [{"send": "pay", "approvals": "approve"}]),
    "browser-tool": ("browser-tool", [{"send": "where am I", "toolOutputs": {"get_location": {"city": "Tokyo"}}}]),
    "bad-type": ("bad-type", [{"send": "pay", "approvals": "approve"}]),
    "bad-delta": ("bad-delta", [{"send": "pay", "approvals": "approve"}]),
}


@pytest.fixture(scope="module")
def results(stub: str) -> dict[tuple[str, int], dict]:
    keys = [(name, version) for name in SCENARIOS for version in (6, 7)]
    runs = [
        {"version": v, "api": f"{stub}?variant={SCENARIOS[name][0]}", "steps": SCENARIOS[name][1], "chat_id": "chat-1"}
        for name, v in keys
    ]
    return dict(zip(keys, run_chats(runs, timeout=10)))


def tool_part(result: dict) -> dict:
    return next(p for p in result["messages"][-1]["parts"] if p.get("toolCallId") == "c1")


@pytest.mark.parametrize("version", [6, 7])
@pytest.mark.parametrize("decision", ["approve", "deny"])
def test_approval_round_trip(results: dict, version: int, decision: str) -> None:
    result = results[decision, version]
    assert_clean(result)
    first, second = (r["body"] for r in result["requests"])
    assert first["trigger"] == "submit-message" and first["id"] == "chat-1"
    assert second["trigger"] == "submit-message" and second["messageId"] == "m1" and second["id"] == "chat-1"
    sent = second["messages"][-1]["parts"][1]
    assert sent["state"] == "approval-responded"
    assert sent["approval"] == {"id": "a1", "approved": decision == "approve"}
    assert [m["id"] for m in result["messages"] if m["role"] == "assistant"] == ["m1"]
    expected = "output-available" if decision == "approve" else "output-denied"
    assert tool_part(result)["state"] == expected
    assert result["messages"][-1]["parts"][-1] == {"type": "text", "text": "Paid", "state": "done"}


@pytest.mark.parametrize("version", [6, 7])
def test_start_without_message_id_keeps_the_continued_message(results: dict, version: int) -> None:
    result = results["no-id", version]
    assert_clean(result)
    assert [m["id"] for m in result["messages"] if m["role"] == "assistant"] == ["m1"]


@pytest.mark.parametrize("version", [6, 7])
def test_browser_tool_output_is_sent_back(results: dict, version: int) -> None:
    result = results["browser-tool", version]
    assert_clean(result)
    sent = result["requests"][1]["body"]["messages"][-1]["parts"][1]
    assert sent["state"] == "output-available" and sent["output"] == {"city": "Tokyo"}


@pytest.mark.parametrize("version", [6, 7])
def test_unknown_chunk_type_is_a_schema_error(results: dict, version: int) -> None:
    result = results["bad-type", version]
    assert not result["ok"] and result["status"] == "error"
    assert [e["error"] for e in result["schemaErrors"]] == ['unknown chunk type "tool-progress"']


@pytest.mark.parametrize("version", [6, 7])
def test_text_delta_without_start_is_a_chat_error(results: dict, version: int) -> None:
    result = results["bad-delta", version]
    assert not result["ok"] and result["status"] == "error" and not result["schemaErrors"]
    assert "t1" in result["error"]


def test_driver_crash_is_an_assertion_with_stderr(stub: str) -> None:
    with pytest.raises(AssertionError, match="unsupported AI SDK version 5"):
        run_chat(5, stub, [{"send": "hi"}])

"""Self-check of the AG-UI driver (tests/js/agui-driver.mjs) against a scripted AG-UI stub.

The stub plays an approval interrupt and a browser tool as the gateway's route does, and streams that
break the protocol in each way the driver claims to see (an event the schema refuses, events out of
order, material the client strips, a run that never ends, an HTTP error), so that a failure of
tests/integration/test_agui_clients.py points at the gateway, and a pass there means something.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from tests.jsdriver import assert_agui_clean, run_agui
from tests.procs import QuietHandler, serve_http

pytestmark = pytest.mark.js

INTERRUPT = {
    "id": "a1:c1", "reason": "tool_approval", "toolCallId": "c1", "message": "Money leaves the account.",
    "responseSchema": {"type": "object", "properties": {"approved": {"type": "boolean"}}, "required": ["approved"]},
}


def started(body: dict) -> dict:
    return {"type": "RUN_STARTED", "threadId": body["threadId"], "runId": body["runId"]}


def finished(body: dict, **outcome: Any) -> dict:
    return {"type": "RUN_FINISHED", "threadId": body["threadId"], "runId": body["runId"], "outcome": outcome}


def text(body: dict, words: str) -> list[dict]:
    message_id = body["runId"] + "-t"
    return [{"type": "TEXT_MESSAGE_START", "messageId": message_id, "role": "assistant"},
            {"type": "TEXT_MESSAGE_CONTENT", "messageId": message_id, "delta": words},
            {"type": "TEXT_MESSAGE_END", "messageId": message_id}]


def call(call_id: str, name: str) -> list[dict]:
    return [{"type": "TOOL_CALL_START", "toolCallId": call_id, "toolCallName": name},
            {"type": "TOOL_CALL_ARGS", "toolCallId": call_id, "delta": "{}"},
            {"type": "TOOL_CALL_END", "toolCallId": call_id}]


def approval(body: dict) -> list[dict]:
    answers = {entry["interruptId"]: entry for entry in body.get("resume") or []}
    last = body["messages"][-1]
    if "a1:c1" not in answers or last["role"] == "user":
        return [started(body), *call("c1", "process_payment"), finished(body, type="interrupt", interrupts=[INTERRUPT])]
    payload = answers["a1:c1"].get("payload") or {}
    content = {"success": True} if payload.get("approved") else {"denied": True}
    result = {"type": "TOOL_CALL_RESULT", "messageId": body["runId"] + "-r", "toolCallId": "c1", "role": "tool",
              "content": json.dumps(content)}
    return [started(body), result, *text(body, "Paid" if payload.get("approved") else "Not paid"), finished(body, type="success")]


def browser(body: dict) -> list[dict]:
    if body["messages"][-1]["role"] == "tool":
        return [started(body), *text(body, "You are in Tokyo"), finished(body, type="success")]
    return [started(body), *call("c2", "get_location"), finished(body, type="success", pendingToolCallIds=["c2"])]


def broken(variant: str, body: dict) -> list[dict]:
    if variant == "bad-schema":  # a text message's role is one of the four AG-UI knows
        return [started(body), {"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "robot"},
                {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "beep"},
                {"type": "TEXT_MESSAGE_END", "messageId": "m"}, finished(body, type="success")]
    if variant == "out-of-order":
        return [started(body), {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "x"}, finished(body, type="success")]
    if variant == "extra":
        return [{**started(body), "surprise": True}, finished(body, type="success")]
    raise AssertionError(variant)


class Stub(QuietHandler):
    # Every request body by variant, in arrival order: what the driver sent.
    received: dict[str, list[dict]] = {}

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        variant = parse_qs(urlparse(self.path).query)["variant"][0]
        self.received.setdefault(variant, []).append(body)
        if variant == "http-400":
            payload = b'{"error": {"code": "invalid_request", "message": "messages: required"}}'
            self.send_response(400)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        if variant == "hang":  # started, then silent past the driver's deadline
            self.wfile.write(f"data: {json.dumps(started(body))}\n\n".encode())
            self.wfile.flush()
            time.sleep(4)
            return
        events = {"approval": approval, "browser": browser}.get(variant, lambda b: broken(variant, b))(body)
        for event in events:
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())


@pytest.fixture(scope="module")
def stub() -> Iterator[str]:
    with serve_http(Stub) as base:
        yield base


CLEAN = {
    "approve": ("approval", [{"send": "pay", "approvals": "approve"}]),
    "deny": ("approval", [{"send": "pay", "approvals": ["deny"]}]),
    "cancel": ("approval", [{"send": "pay"}, {"send": "hello", "cancelInterrupts": True}]),
    "twice": ("approval", [{"send": "pay", "approvals": "approve"}, {"resendResume": True}]),
    "browser": ("browser", [{"send": "where am I", "toolOutputs": {"get_location": {"city": "Tokyo"}}}]),
}
# Their own batch: the client's warnings are the whole batch's.
BROKEN = ("bad-schema", "out-of-order", "extra", "http-400", "hang")


@pytest.fixture(scope="module")
def clean(stub: str) -> dict[str, dict]:
    names = list(CLEAN)
    runs = [{"url": stub, "agent": f"/ag-ui?variant={CLEAN[n][0]}", "threadId": f"t-{n}", "steps": CLEAN[n][1]} for n in names]
    return dict(zip(names, run_agui(runs, timeout=10, concurrency=len(runs))))


def sent(variant: str, thread: str) -> list[dict]:
    return [body for body in Stub.received[variant] if body["threadId"] == thread]


@pytest.mark.parametrize("decision", ["approve", "deny"])
def test_an_interrupt_is_answered_with_resume(clean: dict, decision: str) -> None:
    result = clean[decision]
    assert_agui_clean(result)
    assert [o["outcome"] for o in result["outcomes"]] == ["interrupt", "success"]
    assert result["outcomes"][0]["interrupts"] == [INTERRUPT]
    first, second = sent("approval", f"t-{decision}")
    assert "resume" not in first and [m["role"] for m in first["messages"]] == ["user"]
    payload = {"approved": True} if decision == "approve" else {"approved": False, "reason": "Denied by the test driver."}
    assert second["resume"] == [{"interruptId": "a1:c1", "status": "resolved", "payload": payload}]
    assert result["messages"][-1]["content"] == ("Paid" if decision == "approve" else "Not paid")


def test_moving_on_cancels_the_open_interrupts_with_the_next_message(clean: dict) -> None:
    result = clean["cancel"]
    assert_agui_clean(result)
    _, second = sent("approval", "t-cancel")
    assert second["resume"] == [{"interruptId": "a1:c1", "status": "cancelled"}]
    assert second["messages"][-1]["role"] == "user" and second["messages"][-1]["content"] == "hello"


def test_an_answer_can_be_sent_again(clean: dict) -> None:
    _, answer, again = sent("approval", "t-twice")
    assert again["resume"] == answer["resume"] and "resume" not in sent("approval", "t-twice")[0]
    # No new message: the thread as the answered run left it (its result and reply included).
    assert [m["role"] for m in again["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert len(clean["twice"]["runs"]) == 3


def test_a_browser_tool_gets_its_output_in_a_tool_message(clean: dict) -> None:
    result = clean["browser"]
    assert_agui_clean(result)
    assert result["outcomes"][0]["pendingToolCallIds"] == ["c2"]
    assert result["handed"] == [{"toolCallId": "c2", "toolName": "get_location"}]
    tool = sent("browser", "t-browser")[1]["messages"][-1]
    assert tool["role"] == "tool" and tool["toolCallId"] == "c2" and json.loads(tool["content"]) == {"city": "Tokyo"}


def test_each_breach_is_seen_and_fails_the_clean_check(stub: str) -> None:
    runs = [{"url": stub, "agent": f"/ag-ui?variant={v}", "steps": [{"send": "hi"}]} for v in BROKEN]
    found = dict(zip(BROKEN, run_agui(runs, timeout=2, concurrency=len(runs))))
    assert [e["event"]["type"] for e in found["bad-schema"]["schemaErrors"]] == ["TEXT_MESSAGE_START"]
    assert "TEXT_MESSAGE_CONTENT" in found["out-of-order"]["pipelineErrors"][0]
    assert any("surprise" in w for w in found["extra"]["warnings"]), found["extra"]["warnings"]
    assert found["http-400"]["httpStatuses"] == [400] and "HTTP 400" in found["http-400"]["pipelineErrors"][0]
    assert found["hang"]["timedOut"] is True
    for variant, result in found.items():
        # The batch's warnings are the extra field's: each other run must fail on its own breach.
        own = {**result, "warnings": result["warnings"] if variant == "extra" else []}
        with pytest.raises(AssertionError):
            assert_agui_clean(own)

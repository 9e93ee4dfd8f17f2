"""`parse_run_input` (gateway/core/agui_input.py): a RunAgentInput becomes the AI SDK request the chat
reads, and what that request asks of ADK (`plan_turn`) is what the AG-UI client meant."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.core.agui_input import parse_run_input
from gateway.core.chat_request import InvalidRequest, plan_turn


def _input(*messages: dict[str, Any], **extra: Any) -> bytes:
    return orjson.dumps({"threadId": "t1", "runId": "r1", "messages": list(messages), **extra})


USER = {"id": "u1", "role": "user", "content": "pay 50 to Hanako"}
CALL = {"id": "m1", "role": "assistant", "toolCalls": [
    {"id": "c1", "type": "function", "function": {"name": "process_payment", "arguments": '{"amount":50}'}}]}


def test_a_new_message_is_the_users_text() -> None:
    run = parse_run_input(_input(USER, tools=[{"name": "get_location", "description": "", "parameters": {}}]))
    assert (run.thread_id, run.run_id, run.tools) == ("t1", "r1", ("get_location",))
    assert run.request.chat_id == "t1" and run.request.version == 7
    plan = plan_turn(run.request)
    assert plan.new_message == {"role": "user", "parts": [{"text": "pay 50 to Hanako"}]} and plan.answers == ()


def test_a_resumed_interrupt_answers_the_call_it_names() -> None:
    resume = [{"interruptId": "adk-a1:c1", "status": "resolved", "payload": {"approved": False, "reason": "too much"}}]
    plan = plan_turn(parse_run_input(_input(USER, CALL, resume=resume)).request)
    [answer] = plan.answers
    assert (answer.approval_id, answer.tool_call_id, answer.tool_name, answer.approved, answer.reason) == (
        "adk-a1", "c1", "process_payment", False, "too much")
    assert plan.new_message is None and plan.continue_message_id == "m1" and plan.known_tool_calls == {"c1"}


def test_a_cancelled_interrupt_with_a_new_message_is_a_denial_before_it() -> None:
    resume = [{"interruptId": "adk-a1:c1", "status": "cancelled"}]
    plan = plan_turn(parse_run_input(_input(USER, CALL, {"id": "u2", "role": "user", "content": "hello"}, resume=resume)).request)
    [answer] = plan.answers
    assert answer.approved is False and plan.new_message == {"role": "user", "parts": [{"text": "hello"}]}
    run = parse_run_input(_input(USER, CALL, {"id": "u2", "role": "user", "content": "hello"}, resume=resume))
    assert run.denied_before == ["c1"], "the next run ends the call the person moved on from"
    assert parse_run_input(_input(USER, CALL, resume=resume)).denied_before == [], "the continuation shows its own end"


def test_tool_messages_are_the_browsers_outputs_of_one_assistant_turn() -> None:
    text = {"id": "m0", "role": "assistant", "content": "Let me check."}
    call = {"id": "m1", "role": "assistant", "toolCalls": [
        {"id": "c1", "type": "function", "function": {"name": "get_location", "arguments": "{}"}}]}
    result = {"id": "x", "role": "tool", "toolCallId": "c1", "content": '{"latitude": 1.5}'}
    plan = plan_turn(parse_run_input(_input(USER, text, call, result)).request)
    [output] = plan.outputs
    assert (output.tool_call_id, output.tool_name, output.output, output.error_text, output.approved) == (
        "c1", "get_location", {"latitude": 1.5}, None, False)
    # The text and the call are one assistant message, the one the answer continues.
    assert plan.continue_message_id == "m0"


def test_a_tool_message_with_an_error_is_the_browsers_error() -> None:
    failed = {"id": "x", "role": "tool", "toolCallId": "c1", "content": "", "error": "denied by the browser"}
    [output] = plan_turn(parse_run_input(_input(USER, CALL, failed)).request).outputs
    assert output.error_text == "denied by the browser"


def test_media_parts_become_file_parts() -> None:
    user = {"id": "u1", "role": "user", "content": [
        {"type": "text", "text": "what is this"},
        {"type": "image", "source": {"type": "data", "value": "aGk=", "mimeType": "image/png"}},
        {"type": "image", "source": {"type": "url", "value": "https://x/y.png", "mimeType": "image/png"}}]}
    plan = plan_turn(parse_run_input(_input(user)).request)
    assert plan.new_message == {"role": "user", "parts": [
        {"text": "what is this"}, {"inlineData": {"mimeType": "image/png", "data": "aGk="}},
        {"fileData": {"mimeType": "image/png", "fileUri": "https://x/y.png"}}]}


@pytest.mark.parametrize(("body", "where"), [
    (b"{", "not valid JSON"),
    (orjson.dumps({"threadId": "t 1", "runId": "r", "messages": [USER]}), "threadId"),
    (orjson.dumps({"threadId": "t1", "runId": "r", "messages": []}), "messages"),
    (_input(USER, CALL, resume=[{"interruptId": "adk-a1", "status": "resolved", "payload": {"approved": True}}]), "resume[0].interruptId"),
    (_input(USER, CALL, resume=[{"interruptId": "a:c9", "status": "resolved", "payload": {"approved": True}}]), "no call 'c9'"),
    (_input(USER, CALL, resume=[{"interruptId": "a:c1", "status": "resolved", "payload": {"ok": 1}}]), "resume[0].payload"),
    (_input(USER, CALL, resume=[{"interruptId": "a:c1", "status": "maybe"}]), "resume.0.status"),
    (_input(USER, {"id": "x", "role": "tool", "toolCallId": "c7", "content": "{}"}), "holds the call 'c7'"),
    (_input({"id": "u", "role": "robot"}), "role"),
    (_input({"id": "u", "role": "user", "content": [{"type": "image", "source": {"type": "data", "value": "!!", "mimeType": "image/png"}}]}), "base64"),
])
def test_what_cannot_be_read_is_refused_with_the_field_named(body: bytes, where: str) -> None:
    with pytest.raises(InvalidRequest, match=None) as caught:
        plan_turn(parse_run_input(body).request)
    assert where in str(caught.value), str(caught.value)

"""`AguiStream` (gateway/core/agui_stream.py) on hand-made chunks: the order AG-UI's client enforces,
and how each kind of run ends (interrupt, frontend tools, approvers, errors, cancellation).

tests/test_agui_events.py runs recorded ADK runs through the converter, this and AG-UI's own client.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from gateway.core.agui_interrupts import RESPONSE_SCHEMA, interrupt_id, split_interrupt_id
from gateway.core.agui_stream import APPROVAL_ACTIVITY, AguiStream, Phase

NOW = 1_800_000_000.0


def _run(*chunks: dict[str, Any], timeout: float | None = 300.0, end: bool = True) -> tuple[AguiStream, list[dict[str, Any]]]:
    stream = AguiStream("t1", "r1", now=NOW, timeout_of=lambda _tool: timeout)
    out = stream.start()
    for chunk in chunks:
        out += stream.feed(chunk)
    if end:
        out += stream.end()
    return stream, out


def _types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def _text(chunk_id: str, *deltas: str) -> list[dict[str, Any]]:
    return [{"type": "text-start", "id": chunk_id}, *({"type": "text-delta", "id": chunk_id, "delta": d} for d in deltas),
            {"type": "text-end", "id": chunk_id}]


def _tool(call_id: str, name: str, args: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "tool-input-start", "toolCallId": call_id, "toolName": name},
            {"type": "tool-input-available", "toolCallId": call_id, "toolName": name, "input": args}]


def test_an_empty_response_starts_and_finishes_the_run() -> None:
    stream, out = _run({"type": "start", "messageId": "m1"}, {"type": "finish", "finishReason": "stop"})
    assert out == [
        {"type": "RUN_STARTED", "threadId": "t1", "runId": "r1", "protocolVersion": "1.0"},
        {"type": "RUN_FINISHED", "threadId": "t1", "runId": "r1", "outcome": {"type": "success"}},
    ]
    assert stream.outcome == "success" and stream.phase is Phase.FINISHED
    assert stream.feed({"type": "text-start", "id": "x"}) == [] and stream.end() == []


def test_text_ids_are_the_runs_own_and_empty_deltas_are_dropped() -> None:
    _, out = _run(*_text("t1", "Hel", "", "lo"))
    assert _types(out) == ["RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_CONTENT",
                           "TEXT_MESSAGE_END", "RUN_FINISHED"]
    # The AI SDK's text ids restart in every response; AG-UI's message ids are the thread's.
    assert {e["messageId"] for e in out[1:5]} == {"r1-1"}


def test_reasoning_then_text_closes_the_reasoning_first() -> None:
    chunks = [{"type": "reasoning-start", "id": "r"}, {"type": "reasoning-delta", "id": "r", "delta": "hmm"},
              {"type": "text-start", "id": "t"}, {"type": "text-delta", "id": "t", "delta": "Hi"},
              {"type": "reasoning-end", "id": "r"}, {"type": "text-end", "id": "t"}]
    _, out = _run(*chunks)
    assert _types(out) == [
        "RUN_STARTED", "REASONING_START", "REASONING_MESSAGE_START", "REASONING_MESSAGE_CONTENT", "REASONING_MESSAGE_END",
        "REASONING_END", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END", "RUN_FINISHED",
    ]


def test_a_server_tool_with_its_result_and_the_words_after_it() -> None:
    chunks = [*_text("a", "Let me look."), *_tool("c1", "get_weather", {"city": "Tokyo"}),
              {"type": "tool-output-available", "toolCallId": "c1", "output": {"temp": 19}}, *_text("b", "19.")]
    stream, out = _run(*chunks)
    assert _types(out) == [
        "RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
        "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT",
        "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END", "RUN_FINISHED",
    ]
    assert out[4]["parentMessageId"] == "r1-1" and out[5]["delta"] == '{"city":"Tokyo"}'
    assert out[7]["content"] == '{"temp":19}' and out[7]["toolCallId"] == "c1"
    assert out[8]["messageId"] == "r1-2"
    assert out[-1]["outcome"] == {"type": "success"}, "a call with its result is not pending"


def test_an_approval_the_person_answers_ends_the_run_with_an_interrupt_bound_to_the_call() -> None:
    chunks = [*_tool("c1", "process_payment", {"amount": 50}),
              {"type": "tool-approval-request", "approvalId": "adk-a1", "toolCallId": "c1",
               "approvalDescriptor": {"hint": "Money leaves the account when you approve."}},
              {"type": "finish", "finishReason": "tool-calls"}]
    stream, out = _run(*chunks, timeout=60.0)
    assert stream.outcome == "interrupt"
    [interrupt] = out[-1]["outcome"]["interrupts"]
    assert interrupt == {
        "id": "adk-a1:c1", "reason": "tool_approval", "toolCallId": "c1",
        "message": "Money leaves the account when you approve.", "responseSchema": RESPONSE_SCHEMA,
        "metadata": {"approvalId": "adk-a1", "tool": "process_payment"}, "expiresAt": interrupt["expiresAt"],
    }
    expires = datetime.fromisoformat(interrupt["expiresAt"].replace("Z", "+00:00")).timestamp()
    assert expires == pytest.approx(NOW + 60.0)
    assert split_interrupt_id(interrupt["id"]) == ("adk-a1", "c1")


def test_a_tool_without_a_timeout_gets_no_expiry_and_no_hint_a_plain_question() -> None:
    chunks = [*_tool("c1", "pay", {}), {"type": "tool-approval-request", "approvalId": "a1", "toolCallId": "c1"}]
    _, out = _run(*chunks, timeout=None)
    [interrupt] = out[-1]["outcome"]["interrupts"]
    assert "expiresAt" not in interrupt and interrupt["message"] == "Approve the call to pay?"


def test_a_browser_tool_is_not_handed_over_before_its_approval_and_is_after_it() -> None:
    # Run 1: the input travels as a delta (shown, not runnable); the run asks.
    first = [{"type": "tool-input-start", "toolCallId": "c1", "toolName": "get_location"},
             {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": "{}"},
             {"type": "tool-approval-request", "approvalId": "a1", "toolCallId": "c1"}]
    _, out = _run(*first)
    assert _types(out) == ["RUN_STARTED", "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "RUN_FINISHED"]
    assert out[-1]["outcome"]["type"] == "interrupt"
    # Run 2 (approved): the call is handed over; the client holds its arguments, so none are repeated.
    second = [{"type": "tool-input-available", "toolCallId": "c1", "toolName": "get_location", "input": {}},
              {"type": "finish", "finishReason": "tool-calls"}]
    stream, out = _run(*second)
    assert _types(out) == ["RUN_STARTED", "TOOL_CALL_START", "TOOL_CALL_END", "RUN_FINISHED"]
    assert out[-1]["outcome"] == {"type": "success", "pendingToolCallIds": ["c1"]}


def test_a_browser_tool_without_approval_is_pending_at_the_end() -> None:
    _, out = _run(*_tool("c1", "change_bgm", {"track": 2}))
    assert out[-1]["outcome"] == {"type": "success", "pendingToolCallIds": ["c1"]}


def test_the_interrupt_wins_over_a_browser_tool_and_two_approvals_are_two_interrupts() -> None:
    chunks = [*_tool("c1", "pay", {}), {"type": "tool-approval-request", "approvalId": "a1", "toolCallId": "c1"},
              *_tool("c2", "pay", {}), {"type": "tool-approval-request", "approvalId": "a2", "toolCallId": "c2"}]
    _, out = _run(*chunks)
    assert [i["id"] for i in out[-1]["outcome"]["interrupts"]] == ["a1:c1", "a2:c2"]


def test_the_persons_answer_echoed_back_is_not_an_event_and_a_denial_is_a_result() -> None:
    chunks = [{"type": "tool-approval-response", "approvalId": "a1", "approved": False},
              {"type": "tool-output-denied", "toolCallId": "c1"}, *_text("t", "Not sent.")]
    _, out = _run({"type": "tool-approval-request", "approvalId": "a1", "toolCallId": "c1"}, *chunks)
    # The request opened an interrupt; its response closed it: the run ends as a success.
    assert out[-1]["outcome"] == {"type": "success"}
    [result] = [e for e in out if e["type"] == "TOOL_CALL_RESULT"]
    assert result["content"] == '{"denied":true}'


def test_a_rules_automatic_decision_is_a_custom_event_not_an_interrupt() -> None:
    chunks = [*_tool("c1", "pay", {"amount": 2}),
              {"type": "tool-approval-request", "approvalId": "gw-1", "toolCallId": "c1", "isAutomatic": True,
               "approvalDescriptor": {"rule": "small"}},
              {"type": "tool-approval-response", "approvalId": "gw-1", "approved": True},
              {"type": "tool-output-available", "toolCallId": "c1", "output": {"success": True}}]
    _, out = _run(*chunks)
    [custom] = [e for e in out if e["type"] == "CUSTOM"]
    assert custom == {"type": "CUSTOM", "name": APPROVAL_ACTIVITY,
                      "value": {"approvalId": "gw-1", "toolCallId": "c1", "rule": "small", "approved": True}}
    assert out[-1]["outcome"] == {"type": "success"}


def test_a_call_for_approvers_is_an_activity_updated_in_place_never_an_interrupt() -> None:
    waiting = {"approvalId": "adk-9", "toolCallId": "c1", "state": "waiting", "approvers": "supervisors", "quorum": 1}
    chunks = [*_tool("c1", "issue_refund", {"amount": 250}),
              {"type": "data-approval", "id": "adk-9", "data": waiting},
              {"type": "data-approval", "id": "adk-9", "data": {**waiting, "state": "decided", "approved": True}},
              {"type": "tool-approval-request", "approvalId": "adk-9", "toolCallId": "c1",
               "approvalDescriptor": {"rule": "large_refund", "approvers": "supervisors"}},
              {"type": "tool-approval-response", "approvalId": "adk-9", "approved": True},
              {"type": "tool-output-available", "toolCallId": "c1", "output": {"refunded": 250}}]
    _, out = _run(*chunks)
    activities = [e for e in out if e["type"] == "ACTIVITY_SNAPSHOT"]
    assert [a["content"]["state"] for a in activities] == ["waiting", "decided"]
    assert {a["messageId"] for a in activities} == {"approval-adk-9"} and all(a["replace"] for a in activities)
    assert out[-1]["outcome"] == {"type": "success"}


def test_an_error_chunk_ends_the_run_and_nothing_follows() -> None:
    stream, out = _run({"type": "text-start", "id": "t"}, {"type": "text-delta", "id": "t", "delta": "Hi"},
                       {"type": "error", "errorText": "The model is overloaded."}, {"type": "finish"})
    assert _types(out) == ["RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END", "RUN_ERROR"]
    assert out[-1] == {"type": "RUN_ERROR", "message": "The model is overloaded.", "code": "agent_error"}
    assert stream.outcome == "error"


def test_an_abort_is_a_cancelled_run_with_its_open_call_ended() -> None:
    stream, out = _run({"type": "tool-input-start", "toolCallId": "c1", "toolName": "x"}, {"type": "abort"})
    assert _types(out) == ["RUN_STARTED", "TOOL_CALL_START", "TOOL_CALL_END", "RUN_FINISHED"]
    assert out[-1]["outcome"] == {"type": "cancelled"} and stream.outcome == "cancelled"


def test_a_refusal_before_the_run_is_a_started_run_that_errs() -> None:
    stream = AguiStream("t1", "r1")
    assert _types(stream.error("not pending", "approval_gone")) == ["RUN_STARTED", "RUN_ERROR"]
    assert stream.error("again") == []


def test_usage_is_summed_per_model_with_reasoning_inside_the_output() -> None:
    finish = {"type": "finish", "messageMetadata": {"model": "m", "usage": {"inputTokens": 10, "outputTokens": 5, "reasoningTokens": 3}}}
    _, out = _run(finish, finish)
    assert out[-1]["usage"] == [{"model": "m", "inputTokens": 20, "outputTokens": 16, "reasoningTokens": 6, "totalTokens": 36}]


@pytest.mark.parametrize("value", ["", "a1", ":c1", "a1:"])
def test_only_an_interrupt_id_this_gateway_made_splits(value: str) -> None:
    assert split_interrupt_id(value) is None
    assert split_interrupt_id(interrupt_id("gw-1", "adk-2")) == ("gw-1", "adk-2")


def test_a_call_denied_by_moving_on_gets_its_end_at_the_next_runs_start() -> None:
    stream = AguiStream("t1", "r2")
    out = stream.start() + stream.denied_before(["c1"])
    assert _types(out) == ["RUN_STARTED", "TOOL_CALL_RESULT"]
    assert out[1]["toolCallId"] == "c1" and out[1]["content"] == '{"denied":true}'

"""The ordering rules of `AguiRun` (gateway/core/agui_events.py), on hand-made ADK events.

tests/test_agui_events.py runs the recordings through AG-UI's own client; these pin the machine's
choices in milliseconds: what closes what, what is never repeated, what ends a run.
"""

from __future__ import annotations

from typing import Any

from gateway.core.agui_events import CONFIRMATION_UNSUPPORTED, AguiRun, Phase


def _text(text: str, *, partial: bool = False, thought: bool = False) -> dict[str, Any]:
    part: dict[str, Any] = {"text": text}
    if thought:
        part["thought"] = True
    return {"author": "a", "content": {"role": "model", "parts": [part]}, "partial": partial}


def _call(call_id: str, name: str = "get_weather", args: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"author": "a", "content": {"role": "model", "parts": [{"functionCall": {"id": call_id, "name": name, "args": args or {}}}]}}


def _result(call_id: str, response: Any, name: str = "get_weather") -> dict[str, Any]:
    part = {"functionResponse": {"id": call_id, "name": name, "response": response}}
    return {"author": "a", "content": {"role": "user", "parts": [part]}}


def _run(*adk: dict[str, Any]) -> list[dict[str, Any]]:
    run = AguiRun("t1", "r1")
    out = run.start()
    for event in adk:
        out += run.feed(event)
    return out + run.finish()


def _types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def test_empty_run_starts_and_finishes() -> None:
    assert _run() == [
        {"type": "RUN_STARTED", "threadId": "t1", "runId": "r1", "protocolVersion": "1.0"},
        {"type": "RUN_FINISHED", "threadId": "t1", "runId": "r1", "outcome": {"type": "success"}},
    ]


def test_streamed_text_is_not_repeated_by_the_final_event() -> None:
    out = _run(_text("Hel", partial=True), _text("lo", partial=True), _text("Hello"))
    assert _types(out) == [
        "RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    assert "".join(e["delta"] for e in out if e["type"] == "TEXT_MESSAGE_CONTENT") == "Hello"


def test_text_after_a_tool_call_is_a_new_message() -> None:
    out = _run(_text("Let me look."), _call("c1", args={"city": "Tokyo"}), _result("c1", {"temp": 19}), _text("19°C."))
    assert _types(out) == [
        "RUN_STARTED",
        "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
        "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT",
        "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    first, second = (e["messageId"] for e in out if e["type"] == "TEXT_MESSAGE_START")
    assert first != second
    start = out[4]
    # The call belongs to the text the model said with it; its arguments travel whole, as JSON.
    assert start == {"type": "TOOL_CALL_START", "toolCallId": "c1", "toolCallName": "get_weather", "parentMessageId": first}
    assert out[5]["delta"] == '{"city":"Tokyo"}'
    result = out[7]
    assert result["toolCallId"] == "c1" and result["content"] == '{"temp":19}' and result["role"] == "tool"
    assert result["messageId"] not in (first, second)


def test_two_tool_calls_each_end_before_the_next_starts() -> None:
    both = {"author": "a", "content": {"role": "model", "parts": [
        {"functionCall": {"id": "c1", "name": "pay", "args": {"to": "Alice"}}},
        {"functionCall": {"id": "c2", "name": "pay", "args": {"to": "Bob"}}},
    ]}}
    out = _run(both, _result("c1", {"ok": True}, "pay"), _result("c2", {"ok": True}, "pay"))
    assert [(e["type"], e.get("toolCallId")) for e in out[1:-1]] == [
        ("TOOL_CALL_START", "c1"), ("TOOL_CALL_ARGS", "c1"), ("TOOL_CALL_END", "c1"),
        ("TOOL_CALL_START", "c2"), ("TOOL_CALL_ARGS", "c2"), ("TOOL_CALL_END", "c2"),
        ("TOOL_CALL_RESULT", "c1"), ("TOOL_CALL_RESULT", "c2"),
    ]
    # Without text before them, the calls name no parent message (the client makes one).
    assert all("parentMessageId" not in e for e in out if e["type"] == "TOOL_CALL_START")


def test_a_repeated_call_and_a_result_for_an_unseen_call() -> None:
    # The final event repeats a call its partial showed; a resumed run answers a call it never showed.
    out = _run(_call("c1"), _call("c1"), _result("c9", "done"))
    assert [(e["type"], e.get("toolCallId")) for e in out if e["type"] == "TOOL_CALL_START"] == [
        ("TOOL_CALL_START", "c1"), ("TOOL_CALL_START", "c9"),
    ]
    assert _types(out)[-3:] == ["TOOL_CALL_END", "TOOL_CALL_RESULT", "RUN_FINISHED"]


def test_error_mid_text_ends_the_message_then_the_run() -> None:
    run = AguiRun("t1", "r1")
    out = run.start() + run.feed(_text("Half a sent", partial=True))
    out += run.feed({"author": "a", "errorCode": "DEMO_ERROR", "errorMessage": "asked to fail"})
    # ADK reports a crashed run twice (an errorCode event, then the run's error): the first wins.
    out += run.feed({"error": "DEMO_ERROR: again"}) + run.feed(_text("late")) + run.finish()
    assert _types(out) == ["RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END", "RUN_ERROR"]
    assert out[-1] == {"type": "RUN_ERROR", "message": "DEMO_ERROR: asked to fail", "code": "DEMO_ERROR"}
    assert run.phase is Phase.FAILED


def test_a_failed_run_reports_the_ai_sdk_routes_sentence() -> None:
    run = AguiRun("t1", "r1")
    out = run.start() + run.feed({"error": None, "error_details": {}})
    assert out[-1] == {"type": "RUN_ERROR", "message": "the agent run failed"}


def test_reasoning_is_closed_before_text() -> None:
    out = _run(_text("hmm", partial=True, thought=True), _text("Yes.", partial=True), _text("Yes."))
    assert _types(out) == [
        "RUN_STARTED",
        "REASONING_START", "REASONING_MESSAGE_START", "REASONING_MESSAGE_CONTENT", "REASONING_MESSAGE_END", "REASONING_END",
        "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    assert out[2]["role"] == "reasoning"


def test_a_confirmation_request_fails_closed() -> None:
    confirm = _call("a1", "adk_request_confirmation", {"originalFunctionCall": {"id": "c1", "name": "pay", "args": {}}})
    run = AguiRun("t1", "r1")
    out = run.start() + run.feed(_call("c1", "pay")) + run.feed(confirm) + run.finish()
    assert _types(out)[-1] == "RUN_ERROR" and out[-1]["message"] == CONFIRMATION_UNSUPPORTED
    assert "adk_request_confirmation" not in str(out)


def test_usage_is_counted_once_per_call_with_reasoning_in_output() -> None:
    usage = {"promptTokenCount": 10, "candidatesTokenCount": 5, "thoughtsTokenCount": 3}
    final = _text("ok") | {"usageMetadata": usage, "modelVersion": "m"}
    out = _run(_text("ok", partial=True) | {"usageMetadata": usage}, final)
    assert out[-1]["usage"] == [
        {"model": "m", "inputTokens": 10, "outputTokens": 8, "reasoningTokens": 3, "totalTokens": 18},
    ]


def test_nothing_before_start_or_after_the_end() -> None:
    run = AguiRun("t1", "r1")
    assert run.feed(_text("early")) == [] and run.finish() == []
    run.start()
    assert run.start() == []
    run.finish()
    assert run.feed(_text("late")) == [] and run.error("late") == [] and run.finish() == []
    assert run.phase is Phase.FINISHED

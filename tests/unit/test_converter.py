"""The converter on event sequences recorded from the real ADK API server (tests/fixtures/adk)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.approvals import REFUSAL_KEY
from gateway.converter import Converter, map_finish_reason
from tests.unit.fixtures import check_stream_rules, convert, events, types


def test_plain_text_streams_partials_once() -> None:
    chunks = convert("hello_there")
    assert types(chunks)[:3] == ["start", "start-step", "text-start"]
    assert types(chunks)[-3:] == ["text-end", "finish-step", "finish"]
    deltas = [c["delta"] for c in chunks if c["type"] == "text-delta"]
    assert len(deltas) == 8  # one per partial; the aggregated final adds nothing
    final_text = next(
        p["text"] for e in events("hello_there") if not e.get("partial") for p in e["content"]["parts"]
    )
    assert "".join(deltas) == final_text
    assert chunks[-1] == {
        "type": "finish",
        "finishReason": "stop",
        "messageMetadata": {"usage": {"inputTokens": 16, "outputTokens": 30, "totalTokens": 46}},
    }
    check_stream_rules(chunks)


def test_server_tool_gets_its_own_step_then_text() -> None:
    chunks = convert("weather_tokyo")
    assert types(chunks) == [
        "start", "start-step", "tool-input-start", "tool-input-available", "tool-output-available",
        "finish-step", "start-step", "text-start", *["text-delta"] * types(chunks).count("text-delta"),
        "text-end", "finish-step", "finish",
    ]
    call = chunks[3]
    assert call["toolName"] == "get_weather" and call["input"] == {"city": "Tokyo"}
    assert chunks[4]["toolCallId"] == call["toolCallId"]
    check_stream_rules(chunks)


def test_confirmation_becomes_an_approval_request_and_the_placeholder_is_hidden() -> None:
    converter = Converter("m1")
    chunks = convert("pay_hanako", converter=converter)
    assert types(chunks) == [
        "start", "start-step", "tool-input-start", "tool-input-available", "tool-approval-request",
        "finish-step", "finish",
    ]
    original = next(
        p["functionCall"] for e in events("pay_hanako") for p in e["content"]["parts"]
        if p.get("functionCall", {}).get("name") == "process_payment"
    )
    confirmation = next(
        p["functionCall"] for e in events("pay_hanako") for p in e["content"]["parts"]
        if p.get("functionCall", {}).get("name") == "adk_request_confirmation"
    )
    assert chunks[4] == {"type": "tool-approval-request", "approvalId": confirmation["id"], "toolCallId": original["id"]}
    assert chunks[-1]["finishReason"] == "tool-calls"
    assert "requires confirmation" not in str(chunks)
    assert [a.tool_name for a in converter.approvals] == ["process_payment"]
    assert converter.approvals[0].args == {"amount": 50, "recipient": "Hanako", "currency": "USD"}
    check_stream_rules(chunks)


def test_two_approvals_in_one_turn() -> None:
    converter = Converter("m1")
    chunks = convert("pay_two", converter=converter)
    requests = [c for c in chunks if c["type"] == "tool-approval-request"]
    inputs = [c for c in chunks if c["type"] == "tool-input-available"]
    assert len(requests) == 2 and len(inputs) == 2
    assert {r["toolCallId"] for r in requests} == {i["toolCallId"] for i in inputs}
    assert [i["input"]["recipient"] for i in inputs] == ["Alice", "Bob"]
    assert chunks[-1]["finishReason"] == "tool-calls"
    check_stream_rules(chunks)


def _original_call_id(fixture: str) -> str:
    return next(
        p["functionCall"]["id"] for e in events(fixture) for p in e["content"]["parts"]
        if p.get("functionCall", {}).get("name") == "process_payment"
    )


def test_approved_continuation_keeps_the_message_and_puts_the_output_first() -> None:
    call_id = _original_call_id("pay_hanako")
    chunks = convert("pay_hanako_approve", converter=Converter("m1", known_tool_calls=[call_id]))
    assert chunks[0] == {"type": "start", "messageId": "m1"}
    # Like the AI SDK's own streamText: the tool output comes before any new step.
    assert chunks[1]["type"] == "tool-output-available" and chunks[1]["toolCallId"] == call_id
    assert chunks[1]["output"]["success"] is True
    assert types(chunks)[2:4] == ["start-step", "text-start"]
    text = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
    assert "Hanako" in text
    assert chunks[-1]["finishReason"] == "stop"
    check_stream_rules(chunks, known=[call_id])


def test_denied_continuation_reports_output_denied() -> None:
    call_id = _original_call_id("pay_hanako_deny_setup")
    chunks = convert(
        "pay_hanako_deny", converter=Converter("m1", known_tool_calls=[call_id], denied_tool_calls=[call_id])
    )
    assert chunks[1] == {"type": "tool-output-denied", "toolCallId": call_id}
    assert "rejected" not in str(chunks[:2])
    check_stream_rules(chunks, known=[call_id])


def test_approve_one_deny_the_other() -> None:
    calls = [
        p["functionCall"]["id"] for e in events("pay_two") if not e.get("partial") for p in e["content"]["parts"]
        if p.get("functionCall", {}).get("name") == "process_payment"
    ]
    chunks = convert(
        "pay_two_approve_one_deny_other",
        converter=Converter("m1", known_tool_calls=calls, denied_tool_calls=[calls[1]]),
    )
    outputs = [c for c in chunks if c["type"].startswith("tool-output")]
    assert [(c["type"], c["toolCallId"]) for c in outputs] == [
        ("tool-output-available", calls[0]), ("tool-output-denied", calls[1]),
    ]
    check_stream_rules(chunks, known=calls)


def test_error_event_becomes_one_error_chunk_and_finish_error() -> None:
    chunks = convert("trigger_error")
    assert types(chunks) == ["start", "error", "finish"]
    assert chunks[1]["errorText"].startswith("DEMO_ERROR: ")
    assert chunks[-1]["finishReason"] == "error"


def test_crash_reported_twice_by_adk_gives_one_error_chunk() -> None:
    chunks = convert("crash")
    assert types(chunks) == ["start", "error", "finish"]
    assert "crashed on purpose" in chunks[1]["errorText"]


def test_unknown_confirmation_id_run_error() -> None:
    chunks = convert("confirm_unknown_id", converter=Converter("m1"))
    assert types(chunks) == ["start", "error", "finish"]


def test_error_mid_text_closes_the_open_block_first() -> None:
    converter = Converter("m1")
    out = converter.start()
    out += converter.feed({"author": "a", "partial": True, "content": {"role": "model", "parts": [{"text": "Hel"}]}})
    out += converter.feed({"error": "boom"})
    out += converter.finish()
    assert types(out) == ["start", "start-step", "text-start", "text-delta", "text-end", "error", "finish-step", "finish"]
    check_stream_rules(out)


def test_reasoning_then_text_from_partials() -> None:
    converter = Converter("m1")
    out = converter.start()
    for part in ({"text": "thinking", "thought": True}, {"text": " more", "thought": True}, {"text": "Answer"}):
        out += converter.feed({"author": "a", "partial": True, "content": {"role": "model", "parts": [part]}})
    out += converter.feed(
        {"author": "a", "content": {"role": "model", "parts": [{"text": "thinking more", "thought": True}, {"text": "Answer"}]}}
    )
    out += converter.finish()
    assert types(out) == [
        "start", "start-step", "reasoning-start", "reasoning-delta", "reasoning-delta", "reasoning-end",
        "text-start", "text-delta", "text-end", "finish-step", "finish",
    ]
    check_stream_rules(out)


def test_non_streamed_final_text_is_sent_whole() -> None:
    converter = Converter("m1")
    out = converter.start() + converter.feed(
        {"author": "a", "content": {"role": "model", "parts": [{"text": "Hi"}]}, "finishReason": "MAX_TOKENS"}
    ) + converter.finish()
    assert types(out) == ["start", "start-step", "text-start", "text-delta", "text-end", "finish-step", "finish"]
    assert out[-1]["finishReason"] == "length"


def test_inline_data_becomes_a_file_chunk() -> None:
    converter = Converter("m1")
    out = converter.feed(
        {"author": "a", "content": {"role": "model", "parts": [{"inlineData": {"mimeType": "image/png", "data": "AAAA"}}]}}
    )
    assert out[-1] == {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,AAAA"}


def test_output_for_a_call_the_client_never_saw_introduces_the_call() -> None:
    converter = Converter("m1")
    out = converter.feed(
        {"author": "a", "content": {"role": "user", "parts": [{"functionResponse": {"id": "x", "name": "t", "response": {"ok": 1}}}]}}
    )
    assert types(out) == ["start-step", "tool-input-start", "tool-input-available", "tool-output-available"]


def test_tool_error_convention_becomes_output_error() -> None:
    converter = Converter("m1", known_tool_calls=["x"])
    out = converter.feed(
        {"author": "a", "content": {"role": "user", "parts": [{"functionResponse": {"id": "x", "name": "t", "response": {"error": "no"}}}]}}
    )
    assert out == [{"type": "tool-output-error", "toolCallId": "x", "errorText": "no"}]


@pytest.mark.parametrize(
    ("adk", "sdk"),
    [("STOP", "stop"), ("MAX_TOKENS", "length"), ("SAFETY", "content-filter"), ("RECITATION", "content-filter"),
     ("MALFORMED_FUNCTION_CALL", "error"), ("OTHER", "other"), ("LANGUAGE", "other"), (None, "stop")],
)
def test_finish_reason_mapping(adk: Any, sdk: str) -> None:
    assert map_finish_reason(adk) == sdk


def test_v7_only_finish_reason_is_downgraded_for_v6() -> None:
    from gateway.protocol import finish_reason_for

    assert finish_reason_for("interrupted", 6) == "other"
    assert finish_reason_for("interrupted", 7) == "interrupted"


# ---- gateway-gated calls ---------------------------------------------------------------------

def _policy(name: str):
    from gateway.config import ToolPolicy

    return {
        "pay": ToolPolicy(approval=True),
        "where": ToolPolicy(approval=True, runs_in="browser"),
        "bgm": ToolPolicy(runs_in="browser"),
    }.get(name, ToolPolicy())


def _call_event(*calls: tuple[str, str, dict]) -> dict:
    return {
        "author": "a",
        "content": {"role": "model", "parts": [{"functionCall": {"id": i, "name": n, "args": a}} for i, n, a in calls]},
    }


def _gate(tool: str, call_id: str, args: dict | None = None):
    from gateway.approvals import GatedCall

    return GatedCall.open(
        user_id="u", chat_id="c", session_id="c", tool_call_id=call_id, tool=tool, args=args or {},
        policy=_policy(tool), now=0.0,
    )


def test_a_gated_call_waits_until_the_plugin_announces_it() -> None:
    converter = Converter("m1", policy=_policy)
    out = converter.start() + converter.feed(_call_event(("c1", "pay", {"amount": 5})))
    assert not converter.waiting_for_person  # seen, not yet announced
    gate = _gate("pay", "c1", {"amount": 5})
    out += converter.gate_opened(gate)
    assert converter.waiting_for_person
    assert out[-1] == {"type": "tool-approval-request", "approvalId": gate.id, "toolCallId": "c1"}
    out += converter.finish()
    assert out[-1]["finishReason"] == "tool-calls"
    check_stream_rules(out)


def test_parallel_gated_calls_wait_for_every_announcement() -> None:
    converter = Converter("m1", policy=_policy)
    converter.start()
    converter.feed(_call_event(("c1", "pay", {}), ("c2", "pay", {})))
    converter.gate_opened(_gate("pay", "c1"))
    assert not converter.waiting_for_person
    converter.gate_opened(_gate("pay", "c2"))
    assert converter.waiting_for_person


def test_announcement_before_the_event_shows_the_call_once() -> None:
    converter = Converter("m1", policy=_policy)
    out = converter.start() + converter.gate_opened(_gate("pay", "c1", {"x": 1}))
    out += converter.feed(_call_event(("c1", "pay", {"x": 1})))
    assert types(out).count("tool-input-available") == 1
    assert converter.waiting_for_person


def test_browser_tool_needing_approval_is_held_until_approved() -> None:
    converter = Converter("m1", policy=_policy)
    out = converter.start() + converter.feed(_call_event(("c1", "where", {"precise": True})))
    gate = _gate("where", "c1", {"precise": True})
    out += converter.gate_opened(gate)
    out += converter.finish()
    assert "tool-input-available" not in types(out)
    assert out[3] == {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": '{"precise":true}'}
    check_stream_rules(out)
    # Approved: the continuation hands the call to the browser without opening a new step.
    gate.decide(True, now=1)
    cont = converter.start() + converter.gate_changed(gate)
    assert types(cont) == ["start", "tool-input-available"]
    assert converter.waiting_for_person  # now for the browser's output
    gate.deliver_output({"lat": 1})
    assert converter.gate_changed(gate) == [] and not converter.waiting_for_person
    # ADK's echo of the browser's own output is not news to the client.
    echo = {"author": "a", "content": {"role": "user", "parts": [{"functionResponse": {"id": "c1", "name": "where", "response": {"lat": 1}}}]}}
    assert converter.feed(echo) == []


def test_denied_and_timed_out_gates_render_as_the_policy_says() -> None:
    converter = Converter("m1", policy=_policy)
    converter.start()
    converter.feed(_call_event(("c1", "pay", {})))
    gate = _gate("pay", "c1")
    converter.gate_opened(gate)
    gate.decide(False, now=1)
    converter.gate_changed(gate)
    response = {"author": "a", "content": {"role": "user", "parts": [{"functionResponse": {"id": "c1", "name": "pay", "response": gate.verdict.response}}]}}
    assert converter.feed(response) == [{"type": "tool-output-denied", "toolCallId": "c1"}]


def test_a_gated_tool_answering_without_the_plugin_is_reported() -> None:
    converter = Converter("m1", policy=_policy)
    converter.start()
    converter.feed(_call_event(("c1", "pay", {})))
    response = {"author": "a", "content": {"role": "user", "parts": [{"functionResponse": {"id": "c1", "name": "pay", "response": {"ok": 1}}}]}}
    converter.feed(response)
    assert converter.bypassed == ["pay"] and not converter.waiting_for_person


def _response_event(call_id: str, name: str, response: Any) -> dict:
    return {"author": "a", "content": {"role": "user", "parts": [{"functionResponse": {"id": call_id, "name": name, "response": response}}]}}


def _text_events(*pieces: str) -> list[dict]:
    partials = [{"author": "a", "partial": True, "content": {"role": "model", "parts": [{"text": p}]}} for p in pieces]
    final = {"author": "a", "content": {"role": "model", "parts": [{"text": "".join(pieces)}]}, "finishReason": "STOP"}
    return [*partials, final]


def test_a_timed_out_gate_with_on_timeout_error_shows_the_reason_not_the_marker() -> None:
    from gateway.approvals import GatedCall
    from gateway.config import ToolPolicy

    converter = Converter("m1", policy=_policy)
    converter.start()
    converter.feed(_call_event(("c1", "pay", {})))
    gate = GatedCall.open(
        user_id="u", chat_id="c", session_id="c", tool_call_id="c1", tool="pay", args={},
        policy=ToolPolicy(approval=True, on_timeout="error"), now=0.0,
    )
    converter.gate_opened(gate)
    gate.expire(now=10_000)
    converter.gate_changed(gate)
    out = converter.feed(_response_event("c1", "pay", gate.verdict.response))
    assert out == [{"type": "tool-output-error", "toolCallId": "c1", "errorText": gate.verdict.response["error"]}]


@pytest.mark.parametrize(
    ("tool", "approve_first"),
    [("pay", False), ("where", False), ("where", True), ("bgm", False)],
    ids=["approval", "browser-tool-held-for-approval", "browser-tool-approved", "browser-tool"],
)
def test_the_plugin_giving_up_ends_the_wait_with_an_error_and_one_whole_continuation(tool: str, approve_first: bool) -> None:
    """The plugin's long poll ended without a verdict (ADK_GATEWAY_MAX_WAIT, a dead replica, a proxy):
    it answered ADK with its refusal. The call is over; the model's words that follow belong to one
    response that the person's late answer (or a resume) receives whole."""
    converter = Converter("m1", policy=_policy)
    first = converter.start() + converter.feed(_call_event(("c1", tool, {"x": 1})))
    gate = _gate(tool, "c1", {"x": 1})
    first += converter.gate_opened(gate)
    if approve_first:
        gate.decide(True, now=1)
        first += converter.gate_changed(gate)
    assert converter.waiting_for_person
    first += converter.finish()
    check_stream_rules(first)

    refusal = {"error": "Nobody decided within the plugin's longest wait; the call was not run.", REFUSAL_KEY: "max_wait"}
    cont = converter.start() + converter.feed(_response_event("c1", tool, refusal))
    assert cont[1:] == [{"type": "tool-output-error", "toolCallId": "c1", "errorText": refusal["error"]}]
    assert converter.abandoned == [("c1", "max_wait")]
    assert not converter.waiting_for_person and not converter.gates_open
    for event in _text_events("The payment ", "was not made: ", "nobody decided."):
        cont += converter.feed(event)
        assert not converter.waiting_for_person  # the text must not be cut into responses of its own
    cont += converter.finish()
    assert types(cont) == [
        "start", "tool-output-error", "start-step", "text-start", "text-delta", "text-delta", "text-delta",
        "text-end", "finish-step", "finish",
    ]
    assert "".join(c["delta"] for c in cont if c["type"] == "text-delta") == "The payment was not made: nobody decided."
    assert cont[-1]["finishReason"] == "stop"
    assert converter.bypassed == []
    check_stream_rules(cont, known=["c1"])
    # The ledger then releases the call (outcome abandoned): that changes nothing more for the browser.
    gate.abandon("max_wait")
    assert converter.gate_changed(gate) == []


def test_an_old_plugins_unmarked_answer_at_an_open_gate_still_ends_the_wait() -> None:
    # The plugin asked (the gate is open), so it is installed: an answer the gateway never released
    # is the plugin giving up, whatever its version.
    converter = Converter("m1", policy=_policy)
    converter.start()
    converter.feed(_call_event(("c1", "pay", {})))
    converter.gate_opened(_gate("pay", "c1"))
    out = converter.feed(_response_event("c1", "pay", {"error": "The approval gateway went away; the call was not run."}))
    assert out == [{"type": "tool-output-error", "toolCallId": "c1", "errorText": "The approval gateway went away; the call was not run."}]
    assert converter.abandoned == [("c1", None)] and not converter.waiting_for_person and converter.bypassed == []


@pytest.mark.parametrize("code", ["policy_unavailable", "gateway_unreachable", "too_many_pending", "refused"])
def test_a_refusal_of_a_gated_call_the_plugin_could_not_announce_is_no_bypass(code: str) -> None:
    # The plugin failed closed before the gateway could announce the call (gateway unreachable, no
    # policy) or the gateway refused it at once: the tool did not run, so nothing was bypassed.
    converter = Converter("m1", policy=_policy)
    converter.start()
    converter.feed(_call_event(("c1", "pay", {})))
    refusal = {"error": "The call was not run.", REFUSAL_KEY: code}
    out = converter.feed(_response_event("c1", "pay", refusal))
    assert out == [{"type": "tool-output-error", "toolCallId": "c1", "errorText": "The call was not run."}]
    assert converter.bypassed == [] and converter.abandoned == [] and not converter.waiting_for_person


def test_a_gated_tools_own_error_without_the_plugin_asking_is_still_a_bypass() -> None:
    # The tool ran (and failed): that is what the alarm is for.
    converter = Converter("m1", policy=_policy)
    converter.start()
    converter.feed(_call_event(("c1", "pay", {})))
    converter.feed(_response_event("c1", "pay", {"error": "card declined"}))
    assert converter.bypassed == ["pay"]


# ---- live mode -------------------------------------------------------------------------------

def test_live_text_turn_streams_once() -> None:
    from tests.unit.fixtures import LIVE

    chunks = convert("hello_there", folder=LIVE)
    text = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
    assert text.startswith('You said: "hello there"') and types(chunks).count("text-start") == 1
    check_stream_rules(chunks)


def test_live_interruption_keeps_what_was_said_and_ends_interrupted() -> None:
    from tests.unit.fixtures import LIVE

    chunks = convert("interrupt", converter=Converter("m1", version=7), folder=LIVE)
    assert chunks[-1]["finishReason"] == "interrupted"
    assert types(chunks)[-3:] == ["text-end", "finish-step", "finish"]
    check_stream_rules(chunks)


def test_live_audio_becomes_pcm_data_and_transcripts() -> None:
    from tests.unit.fixtures import LIVE

    chunks = convert("audio", folder=LIVE)
    pcm = [c for c in chunks if c["type"] == "data-pcm"]
    assert pcm and all(c["transient"] and c["data"]["mimeType"].startswith("audio/pcm") for c in pcm)
    heard = [c for c in chunks if c["type"] == "data-transcription"]
    assert {c["id"] for c in heard} == {"heard-0"}
    assert heard[-1]["data"] == {"role": "user", "text": "(heard 3200 bytes of audio)", "finished": True}
    said = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
    assert said == "I heard 3200 bytes of audio, but I only understand typed text."
    check_stream_rules(chunks)

"""The converter on event sequences recorded from the real ADK API server (tests/fixtures/adk).

The tests marked `over_versions` run on the same scenarios recorded from every supported ADK
(tests/support/recordings.py VERSIONS); docs/protocol.md lists what differs between them.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.core.approvals import REFUSAL_KEY
from gateway.core.converter import Converter, map_finish_reason
from tests.support.recordings import (
    continuing,
    LIVE_FOLDERS,
    SSE_FOLDERS,
    check_stream_rules,
    convert,
    events,
    fixture_names,
    types,
)

over_versions = pytest.mark.parametrize("folder", SSE_FOLDERS)


@over_versions
def test_plain_text_streams_partials_once(folder: str) -> None:
    chunks = convert("hello_there", folder=folder)
    assert types(chunks)[:3] == ["start", "start-step", "text-start"]
    assert types(chunks)[-3:] == ["text-end", "finish-step", "finish"]
    deltas = [c["delta"] for c in chunks if c["type"] == "text-delta"]
    recorded = events("hello_there", folder)
    # One per partial; the aggregated final adds nothing.
    assert len(deltas) == sum(1 for e in recorded if e.get("partial")) >= 8
    final = next(e for e in recorded if not e.get("partial"))
    assert "".join(deltas) == final["content"]["parts"][0]["text"]
    usage = final["usageMetadata"]
    assert chunks[-1] == {
        "type": "finish",
        "finishReason": "stop",
        "messageMetadata": {"usage": {
            "inputTokens": usage["promptTokenCount"],
            "outputTokens": usage["candidatesTokenCount"],
            "totalTokens": usage["totalTokenCount"],
        }, "model": final["modelVersion"]},
    }
    check_stream_rules(chunks)


@over_versions
def test_each_llm_call_reports_its_usage_and_model_once(folder: str) -> None:
    # Two model calls (the tool call, then the text): partials carry no usage that counts; each
    # call's final event does, once.
    converter = Converter("m1")
    chunks = convert("weather_tokyo", folder=folder, converter=converter)
    finals = [e for e in events("weather_tokyo", folder) if e.get("usageMetadata") and not e.get("partial")]
    assert len(finals) == 2
    assert converter.usage_seen == [(e["modelVersion"], e["usageMetadata"]) for e in finals]
    assert {model for model, _ in converter.usage_seen} == {"demo-scripted"}
    metadata = chunks[-1]["messageMetadata"]
    assert metadata["model"] == "demo-scripted"
    assert metadata["usage"]["totalTokens"] == sum(e["usageMetadata"]["totalTokenCount"] for e in finals)


def test_partial_usage_is_not_counted_and_a_call_without_model_reports_an_empty_one() -> None:
    converter = Converter("m1")
    running = {"promptTokenCount": 5, "candidatesTokenCount": 1, "totalTokenCount": 6}
    converter.feed({"author": "a", "partial": True, "content": {"parts": [{"text": "hi"}]}, "usageMetadata": running,
                    "modelVersion": "gemini-x"})
    assert converter.usage_seen == []
    # Live mode: ADK reports each turn's usage as an event of its own, without content.
    live = {"promptTokenCount": 7, "candidatesTokenCount": 2, "totalTokenCount": 9, "thoughtsTokenCount": 1}
    converter.feed({"author": "a", "usageMetadata": live})
    assert converter.usage_seen == [("", live)]
    # ADK 1.x's live usage: Gemini Live's field names, and no model.
    converter.feed({"author": "a", "usageMetadata": {"promptTokenCount": 3, "responseTokenCount": 4, "totalTokenCount": 7}})
    finish = converter.finish()[-1]
    assert finish["messageMetadata"] == {"usage": {
        "inputTokens": 10, "outputTokens": 6, "totalTokens": 16, "reasoningTokens": 1,
    }}


@over_versions
def test_server_tool_gets_its_own_step_then_text(folder: str) -> None:
    chunks = convert("weather_tokyo", folder=folder)
    assert types(chunks) == [
        "start", "start-step", "tool-input-start", "tool-input-available", "tool-output-available",
        "finish-step", "start-step", "text-start", *["text-delta"] * types(chunks).count("text-delta"),
        "text-end", "finish-step", "finish",
    ]
    call = chunks[3]
    assert call["toolName"] == "get_weather" and call["input"] == {"city": "Tokyo"}
    assert chunks[4]["toolCallId"] == call["toolCallId"]
    check_stream_rules(chunks)


@over_versions
def test_confirmation_becomes_an_approval_request_and_the_placeholder_is_hidden(folder: str) -> None:
    converter = Converter("m1")
    chunks = convert("pay_hanako", folder=folder, converter=converter)
    assert types(chunks) == [
        "start", "start-step", "tool-input-start", "tool-input-available", "tool-approval-request",
        "finish-step", "finish",
    ]
    original = next(
        p["functionCall"] for e in events("pay_hanako", folder) for p in e["content"]["parts"]
        if p.get("functionCall", {}).get("name") == "process_payment"
    )
    confirmation = next(
        p["functionCall"] for e in events("pay_hanako", folder) for p in e["content"]["parts"]
        if p.get("functionCall", {}).get("name") == "adk_request_confirmation"
    )
    assert chunks[4] == {"type": "tool-approval-request", "approvalId": confirmation["id"], "toolCallId": original["id"]}
    assert chunks[-1]["finishReason"] == "tool-calls"
    assert "requires confirmation" not in str(chunks)
    assert [c.tool for c in converter.ledger.settle_asked(now=0)] == ["process_payment"]
    assert chunks[3]["input"] == {"amount": 50, "recipient": "Hanako", "currency": "USD"}
    check_stream_rules(chunks)


@over_versions
def test_two_approvals_in_one_turn(folder: str) -> None:
    converter = Converter("m1")
    chunks = convert("pay_two", folder=folder, converter=converter)
    requests = [c for c in chunks if c["type"] == "tool-approval-request"]
    inputs = [c for c in chunks if c["type"] == "tool-input-available"]
    assert len(requests) == 2 and len(inputs) == 2
    assert {r["toolCallId"] for r in requests} == {i["toolCallId"] for i in inputs}
    assert [i["input"]["recipient"] for i in inputs] == ["Alice", "Bob"]
    assert chunks[-1]["finishReason"] == "tool-calls"
    check_stream_rules(chunks)


def _original_call_id(fixture: str, folder: str = "adk") -> str:
    return next(
        p["functionCall"]["id"] for e in events(fixture, folder) for p in e["content"]["parts"]
        if p.get("functionCall", {}).get("name") == "process_payment"
    )


@over_versions
def test_approved_continuation_keeps_the_message_and_puts_the_output_first(folder: str) -> None:
    call_id = _original_call_id("pay_hanako", folder)
    chunks = convert("pay_hanako_approve", folder=folder, converter=Converter("m1", known_tool_calls=[call_id]))
    assert chunks[0] == {"type": "start", "messageId": "m1"}
    # Like the AI SDK's own streamText: the tool output comes before any new step.
    assert chunks[1]["type"] == "tool-output-available" and chunks[1]["toolCallId"] == call_id
    assert chunks[1]["output"]["success"] is True
    assert types(chunks)[2:4] == ["start-step", "text-start"]
    text = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
    assert "Hanako" in text
    assert chunks[-1]["finishReason"] == "stop"
    check_stream_rules(chunks, known=[call_id])


@over_versions
def test_denied_continuation_reports_output_denied(folder: str) -> None:
    call_id = _original_call_id("pay_hanako_deny_setup", folder)
    chunks = convert(
        "pay_hanako_deny", folder=folder, converter=continuing("m1", known=[call_id], denied=[call_id])
    )
    assert chunks[1] == {"type": "tool-output-denied", "toolCallId": call_id}
    assert "rejected" not in str(chunks[:2])
    check_stream_rules(chunks, known=[call_id])


@over_versions
def test_approve_one_deny_the_other(folder: str) -> None:
    calls = [
        p["functionCall"]["id"] for e in events("pay_two", folder) if not e.get("partial") for p in e["content"]["parts"]
        if p.get("functionCall", {}).get("name") == "process_payment"
    ]
    chunks = convert(
        "pay_two_approve_one_deny_other", folder=folder,
        converter=continuing("m1", known=calls, denied=[calls[1]]),
    )
    outputs = [c for c in chunks if c["type"].startswith("tool-output")]
    assert [(c["type"], c["toolCallId"]) for c in outputs] == [
        ("tool-output-available", calls[0]), ("tool-output-denied", calls[1]),
    ]
    check_stream_rules(chunks, known=calls)


@over_versions
def test_error_event_becomes_one_error_chunk_and_finish_error(folder: str) -> None:
    chunks = convert("trigger_error", folder=folder)
    assert types(chunks) == ["start", "error", "finish"]
    assert chunks[1]["errorText"].startswith("DEMO_ERROR: ")
    assert chunks[-1]["finishReason"] == "error"


@over_versions
def test_crash_reported_twice_by_adk_gives_one_error_chunk(folder: str) -> None:
    chunks = convert("crash", folder=folder)
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
    from gateway.core.protocol import finish_reason_for

    assert finish_reason_for("interrupted", 6) == "other"
    assert finish_reason_for("interrupted", 7) == "interrupted"


# ---- gated calls the plugin never opened (the turn's own tests: test_turn.py) ----------------

def _policy(name: str):
    from gateway.config.schema import ToolPolicy

    return {"pay": ToolPolicy(approval=True)}.get(name, ToolPolicy())


def _call_event(*calls: tuple[str, str, dict]) -> dict:
    return {
        "author": "a",
        "content": {"role": "model", "parts": [{"functionCall": {"id": i, "name": n, "args": a}} for i, n, a in calls]},
    }


def _response_event(call_id: str, name: str, response: Any) -> dict:
    return {"author": "a", "content": {"role": "user", "parts": [{"functionResponse": {"id": call_id, "name": name, "response": response}}]}}


def test_a_gated_tool_answering_without_the_plugin_is_reported() -> None:
    converter = Converter("m1", policy=_policy)
    converter.start()
    converter.feed(_call_event(("c1", "pay", {})))
    assert converter.ledger.expected("c1") and not converter.ledger.waiting_for_person
    converter.feed(_response_event("c1", "pay", {"ok": 1}))
    assert converter.bypassed == ["pay"] and not converter.ledger.expected("c1")


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
    assert converter.bypassed == [] and converter.abandoned == [] and not converter.ledger.waiting_for_person


def test_a_gated_tools_own_error_without_the_plugin_asking_is_still_a_bypass() -> None:
    # The tool ran (and failed): that is what the alarm is for.
    converter = Converter("m1", policy=_policy)
    converter.start()
    converter.feed(_call_event(("c1", "pay", {})))
    converter.feed(_response_event("c1", "pay", {"error": "card declined"}))
    assert converter.bypassed == ["pay"]


# ---- live mode -------------------------------------------------------------------------------

@pytest.mark.parametrize("live", LIVE_FOLDERS)
def test_live_text_turn_streams_once(live: str) -> None:
    chunks = convert("hello_there", folder=live)
    text = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
    assert text.startswith('You said: "hello there"') and types(chunks).count("text-start") == 1
    check_stream_rules(chunks)


@pytest.mark.parametrize("live", LIVE_FOLDERS)
def test_live_interruption_keeps_what_was_said_and_ends_interrupted(live: str) -> None:
    chunks = convert("interrupt", converter=Converter("m1", version=7), folder=live)
    assert chunks[-1]["finishReason"] == "interrupted"
    assert types(chunks)[-3:] == ["text-end", "finish-step", "finish"]
    check_stream_rules(chunks)


@pytest.mark.parametrize("live", LIVE_FOLDERS)
def test_live_audio_becomes_pcm_data_and_transcripts(live: str) -> None:
    chunks = convert("audio", folder=live)
    pcm = [c for c in chunks if c["type"] == "data-pcm"]
    assert pcm and all(c["transient"] and c["data"]["mimeType"].startswith("audio/pcm") for c in pcm)
    heard = [c for c in chunks if c["type"] == "data-transcription"]
    assert {c["id"] for c in heard} == {"heard-0"}
    assert heard[-1]["data"] == {"role": "user", "text": "(heard 3200 bytes of audio)", "finished": True}
    said = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
    assert said == "I heard 3200 bytes of audio, but I only understand typed text."
    check_stream_rules(chunks)


# ---- every supported ADK ------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("folder", "name"), [(f, n) for f in SSE_FOLDERS for n in fixture_names(f)]
)
def test_every_recording_of_every_adk_keeps_the_stream_rules(folder: str, name: str) -> None:
    chunks = convert(name, folder=folder)
    check_stream_rules(chunks)
    assert types(chunks).count("error") <= 1


@over_versions
def test_a_confirmation_answer_with_an_unknown_key_is_one_error(folder: str) -> None:
    # 2.13: an error event, then the run-error object; 1.39.1: the run-error object only; 1.22.1:
    # the run-error object with the message unescaped, cut at its first newline (gateway.upstream).
    chunks = convert("pay_hanako_extra_key", folder=folder)
    assert types(chunks) == ["start", "error", "finish"]
    assert "1 validation error for ToolConfirmation" in chunks[1]["errorText"]


@pytest.mark.parametrize(("folder", "fails"), [("adk", True), ("adk-1.39.1", False), ("adk-1.22.1", False)])
def test_a_confirmation_answer_for_no_call(folder: str, fails: bool) -> None:
    # ADK 2.x refuses a function response whose id matches no call; 1.x ignores the response and
    # runs the model on the session as it is (the demo model answers its last user text).
    chunks = convert("confirm_unknown_id", folder=folder)
    if fails:
        assert types(chunks) == ["start", "error", "finish"]
    else:
        assert "error" not in types(chunks) and chunks[-1]["finishReason"] == "stop"


@pytest.mark.parametrize(("folder", "reruns"), [("adk", False), ("adk-1.39.1", True), ("adk-1.22.1", True)])
def test_an_approval_sent_twice(folder: str, reruns: bool) -> None:
    # ADK 2.x answers a second approval of an already-answered confirmation with an empty stream;
    # 1.x runs the confirmed tool again (the gateway must not forward a replayed approval).
    recorded = events("pay_hanako_approve_replay", folder)
    tool_results = [
        p for e in recorded for p in (e.get("content") or {}).get("parts", ())
        if p.get("functionResponse", {}).get("name") == "process_payment"
    ]
    assert bool(tool_results) == reruns
    check_stream_rules(convert("pay_hanako_approve_replay", folder=folder))

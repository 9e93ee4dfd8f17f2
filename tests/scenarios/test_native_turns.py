"""ADK's own turns through the gateway: text, a server tool, ADK's native confirmation (approved,
denied, two in one turn, the person typing instead of answering), ADK's error event and a crashed
run. The gateway has no tool policy: the demo agent's process_payment declares
`require_confirmation` (the recordings' `DEMO_NATIVE_CONFIRMATION=1`). On the recordings of every
supported ADK; besides what the browser reads, each scenario checks what reached ADK against what
the recorder sent the real server, so the recorded answer is the one ADK would give.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.chatflow import assistant_from, new_chat, types, user
from tests.scenarios.recordings import Recordings
from tests.scenarios.runner import Scenario, said

pytestmark = pytest.mark.js

WAITS = "adk_gateway_approval_wait_seconds_count"


async def test_server_tool(sc: Scenario) -> None:
    reply = await sc.post(new_chat(), [user("weather in Tokyo")], play="weather_tokyo")
    chunks = reply.chunks
    call = next(c for c in chunks if c["type"] == "tool-input-available")
    assert call["toolName"] == "get_weather" and call["input"] == {"city": "Tokyo"}
    output = next(c for c in chunks if c["type"] == "tool-output-available")
    assert output["toolCallId"] == call["toolCallId"]
    assert "Tokyo" in said(chunks)
    assert chunks[-1]["finishReason"] == "stop"


@pytest.mark.parametrize("approved", [True, False])
async def test_native_approval_round_trip(sc: Scenario, recordings: Recordings, approved: bool) -> None:
    setup, answered = ("pay_hanako", "pay_hanako_approve") if approved else ("pay_hanako_deny_setup", "pay_hanako_deny")
    chat, first_message = new_chat(), user("pay 50 to Hanako")
    outcome = "approved" if approved else "denied"
    before = sc.metric(WAITS, {"tool": "process_payment", "outcome": outcome})
    first = await sc.post(chat, [first_message], play=setup)
    assert types(first) == [
        "start", "start-step", "tool-input-start", "tool-input-available", "tool-approval-request", "finish-step", "finish",
    ]
    assert first.chunks[-1]["finishReason"] == "tool-calls"
    assert "requires confirmation" not in first.body.decode()

    answer = assistant_from(first, [approved])
    second = await sc.post(chat, [first_message, answer], messageId=answer["id"], play=answered)
    chunks = second.chunks
    assert chunks[0] == {"type": "start", "messageId": answer["id"]}
    call_id = answer["parts"][1]["toolCallId"]
    if approved:
        assert chunks[1]["type"] == "tool-output-available" and chunks[1]["toolCallId"] == call_id
        assert chunks[1]["output"]["success"] is True
        assert "Hanako" in said(chunks)
    else:
        assert chunks[1] == {"type": "tool-output-denied", "toolCallId": call_id}
        assert "not made" in said(chunks)
    assert chunks[-1]["finishReason"] == "stop"
    after = sc.metric(WAITS, {"tool": "process_payment", "outcome": outcome})
    assert after == before + 1
    # The answer reached ADK once, as the recorder's did: ADK ran (or refused) the payment once.
    assert sc.adk.messages == [recordings.request(setup)["newMessage"], recordings.request(answered)["newMessage"]]


async def test_two_approvals_in_one_turn(sc: Scenario, recordings: Recordings) -> None:
    chat, first_message = new_chat(), user("pay 10 to Alice and 20 to Bob")
    first = await sc.post(chat, [first_message], play="pay_two")
    assert types(first).count("tool-approval-request") == 2
    answer = assistant_from(first, [True, False])
    second = await sc.post(chat, [first_message, answer], messageId=answer["id"], play="pay_two_approve_one_deny_other")
    outputs = [(c["type"], c["toolCallId"]) for c in second.chunks if c["type"].startswith("tool-output")]
    calls = [p["toolCallId"] for p in answer["parts"][1:]]
    assert outputs == [("tool-output-available", calls[0]), ("tool-output-denied", calls[1])]
    text = said(second.chunks)
    assert "Alice" in text and "Bob" in text
    # Both answers in one message, in the calls' order, as ADK took them.
    assert sc.adk.messages[1] == recordings.request("pay_two_approve_one_deny_other")["newMessage"]


async def test_typing_instead_of_answering_rejects_the_pending_call(sc: Scenario, recordings: Recordings) -> None:
    chat, first_message = new_chat(), user("pay 50 to Hanako")
    before = sc.metric(WAITS, {"tool": "process_payment", "outcome": "cancelled"})
    first = await sc.post(chat, [first_message], play="typed_setup")
    pending = assistant_from(first)
    # typed_reject: what ADK answers the rejection, out of the browser's sight
    second = await sc.post(chat, [first_message, pending, user("hello again")], play=("typed_reject", "typed_hello_again"))
    assert second.status == 200
    assert second.chunks[0]["messageId"] != pending["id"]
    assert '"hello again"' in said(second.chunks)
    after = sc.metric(WAITS, {"tool": "process_payment", "outcome": "cancelled"})
    assert after == before + 1
    # ADK got the rejection of the pending call, then the new message, each as the recorder sent it.
    assert sc.adk.messages[1:] == [
        recordings.request("typed_reject")["newMessage"], recordings.request("typed_hello_again")["newMessage"],
    ]
    # The rejected call is settled in ADK: answering it now changes nothing (the payment never runs).
    late = await sc.post(chat, [first_message, assistant_from(first, [True])], messageId=pending["id"], play="typed_late_approve")
    assert "tool-output-available" not in types(late)
    assert len(sc.adk.messages) == 3, "the late approval reached ADK"


async def test_adk_error_event_then_the_chat_still_works(sc: Scenario) -> None:
    chat = new_chat()
    reply = await sc.post(chat, [user("trigger error")], play="trigger_error")
    assert reply.status == 200
    assert types(reply) == ["start", "error", "finish"]
    assert reply.chunks[1]["errorText"].startswith("DEMO_ERROR")
    assert reply.chunks[-1]["finishReason"] == "error"
    again = await sc.post(chat, [user("trigger error"), user("hello there")], play="hello_there")
    assert again.chunks[-1]["finishReason"] == "stop"


async def test_crashing_run_gives_one_error_chunk(sc: Scenario) -> None:
    reply = await sc.post(new_chat(), [user("crash")], play="crash")
    assert types(reply) == ["start", "error", "finish"]
    assert "Traceback" not in reply.body.decode()


def tokens(sc: Scenario, kind: str, model: str = "demo-scripted") -> float:
    return sc.metric("adk_gateway_tokens_total", {"model": model, "kind": kind})


async def test_tokens_and_time_to_first_token_are_counted_per_turn(scenarios: Callable[..., Scenario], recordings: Recordings) -> None:
    # The scripted model reports 16 input tokens per LLM call and names itself "demo-scripted".
    sc = scenarios(recordings, "metrics:\n  models: [demo-scripted]\n")
    first_tokens = "adk_gateway_first_token_seconds_count"
    assert tokens(sc, "input") == 0 and sc.metric(first_tokens) == 0
    chat = new_chat()
    first = await sc.post(chat, [user("hello there")], play="hello_there")
    metadata = first.chunks[-1]["messageMetadata"]
    assert metadata["model"] == "demo-scripted"
    assert tokens(sc, "input") == 16 == metadata["usage"]["inputTokens"]
    assert tokens(sc, "output") == metadata["usage"]["outputTokens"] > 0
    assert tokens(sc, "total") == metadata["usage"]["totalTokens"]
    assert sc.metric(first_tokens) == 1
    # Two LLM calls (the tool call, then the text): each counted once.
    second = await sc.post(new_chat(), [user("weather in Tokyo")], play="weather_tokyo")
    assert tokens(sc, "input") == 16 + 32 == 16 + second.chunks[-1]["messageMetadata"]["usage"]["inputTokens"]
    assert sc.metric(first_tokens) == 2
    # Typing instead of answering: the payment's call (1), the model's answer to the rejection,
    # which ADK runs out of the browser's sight (1), and the new message's (1).
    pay = user("pay 50 to Hanako")
    first = await sc.post(chat, [pay], play="typed_setup")
    assert tokens(sc, "input") == 48 + 16
    assert sc.metric(first_tokens) == 2  # no words: not timed
    await sc.post(chat, [pay, assistant_from(first), user("hello again")], play=("typed_reject", "typed_hello_again"))
    assert tokens(sc, "input") == 64 + 32
    assert sc.metric(first_tokens) == 3
    assert tokens(sc, "input", "other") == 0
